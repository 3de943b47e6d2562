"""The compressor's prepare() on CoQA follow-ups, in process: the plain layout, the continued
layout (compression.reuse as shipped, skip_shown_turns 1) counting every message when a chat
holds it, and the same counting the sent question ahead (ChatTokens.count_ahead).

    cd docs/results/reuse/count-ahead
    ../../../../.venv/bin/python profile_count_ahead.py > profile.txt

30 CoQA conversations of 5 questions (stories drawn with seed 1, not the draw bench.reuse
measures), gold answers as the history, retrieval as the service does it (hybrid, top 5,
the question after the last two user turns), sentence selection at 0.5 always, the short
style, the 1.5B's tokenizer and template, `max_model_len` 4,096, one thread, no engine.
Between two requests the script waits for the counts begun ahead (PromptPreparer.settle),
as a follow-up comes after its previous answer was generated; the wait is not timed.
Each layout runs twice, in turn; per follow-up, each layout's time is the mean of its two
runs. Prints every layout's median prepare() time on follow-ups, and the medians of the
paired differences with their 95% bootstrap intervals (bench.stats).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))

from bench import stats  # noqa: E402
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
# layout: (compression.reuse, count the sent question ahead)
LAYOUTS = {"plain": (False, True), "continued": (True, False), "continued, ahead": (True, True)}


def follow_up_ms(work, reuse: bool, ahead: bool) -> list[float]:
    preparer = PromptPreparer.load(
        str(READER),
        PROMPTS,
        4096,
        index_path=ROOT / INDEX_DIR,
        sent_turns=SentTurns(4096),
        options=PreparationOptions(skip_shown_turns=1),
    )
    if not ahead:  # every message counted when a chat holds it, as before count_ahead
        preparer._chat_tokens.count_ahead = lambda message: None
    plan = CompressionPlan("sentences", 0.5, policy="always", reuse=reuse)
    times = []
    for conversation, retrieval, _, turn in work:
        preparer.settle()
        started = time.perf_counter()
        preparer.prepare(conversation, retrieval, plan, 16)
        elapsed = (time.perf_counter() - started) * 1000
        if turn > 0:
            times.append(elapsed)
    return times


def main() -> None:
    (phase, _) = conversation_phases(load(ROOT / CACHE_DIR / COQA_FILENAME), 30, 5, seed=1)
    found = Retriever.load(
        ROOT / INDEX_DIR,
        resolve_model_reference(DEFAULT_EMBEDDING_MODEL),
        hybrid=HybridRetrievalConfig().to_params(),
    )
    work = gold_history_requests(phase, lambda text: found.retrieve(text, 5))
    runs: dict[str, list[list[float]]] = {name: [] for name in LAYOUTS}
    for rep in range(2):
        for name, (reuse, ahead) in LAYOUTS.items():
            times = follow_up_ms(work, reuse, ahead)
            runs[name].append(times)
            print(f"rep {rep} {name}: follow-ups n={len(times)}, "
                  f"prepare() p50 {statistics.median(times):.2f} ms")  # fmt: skip
    means = {name: [statistics.mean(ms) for ms in zip(*r, strict=True)] for name, r in runs.items()}
    for a, b in (("continued", "plain"), ("continued, ahead", "plain"),
                 ("continued, ahead", "continued")):  # fmt: skip
        pairs = list(zip(means[a], means[b], strict=True))
        difference = stats.paired_difference(pairs, stat=stats.sample_median)
        print(f"{a} - {b}, ms, median of paired differences (n={len(pairs)}): "
              f"{stats.fmt_difference(difference)}")  # fmt: skip


if __name__ == "__main__":
    main()
