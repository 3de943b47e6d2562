"""What `compression.reuse.skip_shown_turns` would leave to prefill on CoQA follow-ups: a
model of the layout, in process, no engine, to pick the setting to measure.

    cd docs/results/reuse/skip-shown-model
    ../../../../.venv/bin/python model_skip_shown.py > model.txt

40 CoQA conversations of 5 questions (stories drawn with seed 1: not the draw bench.reuse
measures, seed 0), gold answers as the history, retrieval as the service does it (hybrid,
top 5, the question after the last two user turns), sentence selection at 0.5, the short
style, the 1.5B's tokenizer and template, `max_model_len` 4,096. Per follow-up, each
layout's prompt is tokenized whole; its cached part is modelled as the longest common
prefix with the previous turn's prompt and answer, whole 128-token blocks only (vLLM's
CPU block), which is what one engine holding the conversation would hit. Prints per layout
the mean prompt and modelled uncached tokens over the 160 follow-ups and by turn. A model
of the prompts, not a measurement of the engine.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from transformers import AutoTokenizer

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))

from bench.coqa import CACHE_DIR, COQA_FILENAME, INDEX_DIR, load  # noqa: E402
from bench.reuse import conversation_phases, gold_history_requests  # noqa: E402
from pipeline.messages import CompressionPlan  # noqa: E402
from prepare.continuation import SentTurns  # noqa: E402
from prepare.options import PreparationOptions  # noqa: E402
from prepare.preparation import PromptPreparer  # noqa: E402
from prepare.prompt import DEFAULT_SYSTEM_PROMPT, SHORT_ANSWER_SYSTEM_PROMPT  # noqa: E402
from retrieval.config import HybridRetrievalConfig  # noqa: E402
from retrieval.models import DEFAULT_EMBEDDING_MODEL, resolve_model_reference  # noqa: E402
from retrieval.retriever import Retriever  # noqa: E402

READER = ROOT / ".models" / "qwen2.5-coder-1.5b-instruct"
PROMPTS = {"explained": DEFAULT_SYSTEM_PROMPT, "short": SHORT_ANSWER_SYSTEM_PROMPT}
BLOCK = 128
LAYOUTS = {
    "today": (False, None),
    "reuse": (True, None),
    "last2": (True, 2),
    "last1": (True, 1),
    "repeat": (True, 0),
}


def main() -> None:
    (phase, _) = conversation_phases(load(ROOT / CACHE_DIR / COQA_FILENAME), 40, 5, seed=1)
    found = Retriever.load(
        ROOT / INDEX_DIR,
        resolve_model_reference(DEFAULT_EMBEDDING_MODEL),
        hybrid=HybridRetrievalConfig().to_params(),
    )
    tokenizer = AutoTokenizer.from_pretrained(READER)
    work = gold_history_requests(phase, lambda text: found.retrieve(text, 5))

    def ids(messages, generation: bool) -> list[int]:
        text = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation
        )
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    for name, (reuse, skip) in LAYOUTS.items():
        preparer = PromptPreparer.load(
            str(READER),
            PROMPTS,
            4096,
            index_path=ROOT / INDEX_DIR,
            sent_turns=SentTurns(4096),
            options=PreparationOptions(skip_shown_turns=skip),
        )
        plan = CompressionPlan("sentences", 0.5, policy="always", reuse=reuse)
        before: list[int] = []
        rows: dict[int, list[tuple[int, int]]] = {}
        for conversation, retrieval, answer, turn in work:
            prompt = preparer.prepare(conversation, retrieval, plan, 16)
            tokens = ids(prompt.messages, True)
            if turn > 0:
                shared = 0
                for a, b in zip(tokens, before, strict=False):
                    if a != b:
                        break
                    shared += 1
                cached = min(shared, len(tokens) - 1) // BLOCK * BLOCK
                rows.setdefault(turn, []).append((len(tokens), len(tokens) - cached))
            before = ids([*prompt.messages, {"role": "assistant", "content": answer}], False)
        every = [row for turn_rows in rows.values() for row in turn_rows]
        by_turn = ", ".join(
            f"turn {turn + 1} {statistics.mean(u for _, u in r):.0f}"
            for turn, r in sorted(rows.items())
        )
        prompt_tokens = statistics.mean(p for p, _ in every)
        uncached = statistics.mean(u for _, u in every)
        print(
            f"{name}: follow-ups n={len(every)}, mean prompt {prompt_tokens:.0f}, "
            f"mean uncached {uncached:.0f} ({by_turn})"
        )


if __name__ == "__main__":
    main()
