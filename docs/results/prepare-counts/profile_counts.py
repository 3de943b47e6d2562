"""The compressor's prepare() in process with token counts remembered across requests and
without (prepare.tokens.RememberedCounts), on the SQuAD reuse workload and on CoQA
conversations.

    cd docs/results/prepare-counts && ../../../.venv/bin/python profile_counts.py > profile.txt

Workloads, as bench.reuse draws them (seed 0): SQuAD's skewed phase at concurrency 1 (100
questions, Zipf(1.0) over 200 paragraphs) then the uniform control (40), the service's
default style; 30 CoQA conversations of 3 questions (seed 1), gold answers as history, the
continued layout (compression.reuse), the short style. Retrieval as the service does it
(hybrid, top 5, in process, beforehand), the 1.5B's tokenizer, sentence selection at 0.5
always, one thread, nothing else running. Each request goes through both preparers in
turn (which first alternates), so each remembers what a service's replica would have by
then; their prompts must be identical. Prints, per workload, n, the median prepare() time
of each and the median of the paired differences (remembered - counted) with its 95%
bootstrap interval.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from bench import stats  # noqa: E402
from bench.coqa import CACHE_DIR, COQA_FILENAME, load  # noqa: E402
from bench.coqa import INDEX_DIR as COQA_INDEX_DIR  # noqa: E402
from bench.quality import DEFAULT_INDEX_DIR  # noqa: E402
from bench.reuse import conversation_phases, gold_history_requests, phases  # noqa: E402
from bench.squad import DEFAULT_CACHE_DIR, SQUAD_DEV_FILENAME, load_squad  # noqa: E402
from pipeline.messages import CompressionPlan, Conversation  # noqa: E402
from prepare.continuation import SentTurns  # noqa: E402
from prepare.options import PreparationOptions  # noqa: E402
from prepare.preparation import PromptPreparer  # noqa: E402
from prepare.prompt import DEFAULT_SYSTEM_PROMPT, SHORT_ANSWER_SYSTEM_PROMPT  # noqa: E402
from retrieval.config import HybridRetrievalConfig  # noqa: E402
from retrieval.models import DEFAULT_EMBEDDING_MODEL, resolve_model_reference  # noqa: E402
from retrieval.retriever import Retriever  # noqa: E402

READER = ROOT / ".models" / "qwen2.5-coder-1.5b-instruct"
PROMPTS = {"explained": DEFAULT_SYSTEM_PROMPT, "short": SHORT_ANSWER_SYSTEM_PROMPT}


def retriever(index: Path) -> Retriever:
    return Retriever.load(
        index,
        resolve_model_reference(DEFAULT_EMBEDDING_MODEL),
        hybrid=HybridRetrievalConfig().to_params(),
    )


def squad_work() -> list[tuple[Conversation, object]]:
    plan = phases(load_squad(ROOT / DEFAULT_CACHE_DIR / SQUAD_DEV_FILENAME), 100, 200, 1.0, 40, 0)
    items = [item for phase in plan if phase.name != "skewed-c4" for item in phase.items]
    found = retriever(ROOT / DEFAULT_INDEX_DIR)
    return [(Conversation(item.question), found.retrieve(item.question, 5)) for item in items]


def coqa_work() -> list[tuple[Conversation, object]]:
    (phase, _) = conversation_phases(load(ROOT / CACHE_DIR / COQA_FILENAME), 30, 3, seed=1)
    found = retriever(ROOT / COQA_INDEX_DIR)
    requests = gold_history_requests(phase, lambda text: found.retrieve(text, 5))
    return [(conversation, retrieval) for conversation, retrieval, _, _ in requests]


def compare(name: str, work, index: Path, reuse: bool) -> None:
    def preparer(remembered_counts: int) -> PromptPreparer:
        return PromptPreparer.load(
            str(READER),
            PROMPTS,
            2048,
            index_path=index,
            sent_turns=SentTurns(4096),
            options=PreparationOptions(
                skip_shown_turns=None, remembered_counts=remembered_counts
            ),  # leave out what any turn showed, as when this was measured
        )

    sides = {"remembered": preparer(16384), "counted": preparer(0)}
    plan = CompressionPlan("sentences", 0.5, policy="always", reuse=reuse)
    times: dict[str, list[float]] = {side: [] for side in sides}
    for number, (conversation, retrieval) in enumerate(work):
        order = list(sides) if number % 2 == 0 else list(reversed(sides))
        prompts = {}
        for side in order:
            started = time.perf_counter()
            prompts[side] = sides[side].prepare(conversation, retrieval, plan, 64)
            times[side].append((time.perf_counter() - started) * 1000)
        a, b = prompts["remembered"], prompts["counted"]
        if (a.messages, a.layout, a.sources) != (b.messages, b.layout, b.sources):
            raise SystemExit(f"{name}: request {number} prepared differently")
    pairs = list(zip(times["remembered"], times["counted"], strict=True))
    difference = stats.paired_difference(pairs, stat=stats.sample_median)
    medians = {side: statistics.median(ms) for side, ms in times.items()}
    ratio = stats.paired_ratio(pairs)
    print(
        f"{name}: n={len(pairs)} prepare p50 remembered {medians['remembered']:.2f} ms, "
        f"counted {medians['counted']:.2f} ms; remembered - counted, median of paired "
        f"differences {stats.fmt_difference(difference)} ms; ratio {stats.fmt_ratio(ratio)}; "
        "every prompt identical"
    )


def main() -> None:
    compare("squad skewed-c1 + uniform-c1", squad_work(), ROOT / DEFAULT_INDEX_DIR, False)
    compare("coqa conversations, continued", coqa_work(), ROOT / COQA_INDEX_DIR, True)


if __name__ == "__main__":
    main()
