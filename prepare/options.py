"""What a prompt preparer is tuned by, in one value: the typed config fills what it exposes
(prepare.config, app.config: its fields take their defaults from PREPARATION_DEFAULTS, so
each has one home), tests set only what they test. The rest are the measured layout's
constants, kept here so that a test can isolate one behaviour."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PreparationOptions:
    # Tokens kept free in the context window besides the answer's.
    margin_tokens: int = 16
    # What sentence selection keeps before LLMLingua runs (sentences+llmlingua).
    sentence_prefilter_rate: float = 0.5
    # Earlier turns kept in the prompt, in serving-tokenizer tokens; the oldest cut first.
    history_max_tokens: int = 512
    # A continued follow-up's passages leave out the sentences the last this-many continued
    # turns showed (None: any of them; 0: none). 1, as measured: leaving out more put a
    # gold answer in fewer answers, nothing lost the speed (docs/benchmarks.md).
    skip_shown_turns: int | None = 1
    # Its top this-many passages go again beside the question, shown or not (1: answers
    # detectably better than the plain layout's, docs/benchmarks.md).
    resend_top_passages: int = 1
    # Token counts of the last this-many passages, sentences and fences remembered (0:
    # counted every time).
    remembered_counts: int = 16384


PREPARATION_DEFAULTS = PreparationOptions()
