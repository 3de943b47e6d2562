"""What a prompt preparer is tuned by, in one value: the typed config fills it
(prepare.config, app.config), tests set only what they test. Its defaults are the
config's: the config's fields take them from PREPARATION_DEFAULTS, so each has one home."""

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
    # turns showed (None: any of them; 0: none).
    skip_shown_turns: int | None = 1
    # Its top this-many passages go again beside the question, shown or not.
    resend_top_passages: int = 1
    # Token counts of the last this-many passages, sentences and fences remembered (0:
    # counted every time).
    remembered_counts: int = 16384


PREPARATION_DEFAULTS = PreparationOptions()
