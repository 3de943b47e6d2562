"""The compressor's prepare() in process, with and without compression.reuse, on CoQA.

    .venv/bin/python docs/results/reuse/prepare-profile/profile_prepare.py > profile.txt

30 CoQA conversations of 3 questions (stories drawn with seed 1), gold answers as history,
retrieval as the service does it (hybrid, top 5, the recent user turns joined), the 1.5B's
tokenizer, sentence selection at 0.5 always, one thread, no engine beside it. Prints the
median prepare() time of the follow-ups per setting, twice, the median of the paired
differences (reuse - plain, per follow-up, each the mean of its two runs) with its 95%
bootstrap interval, then a cProfile of reuse's.
"""

from __future__ import annotations

import cProfile
import pstats
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))

from bench import stats  # noqa: E402
from bench.coqa import CACHE_DIR, COQA_FILENAME, INDEX_DIR, load  # noqa: E402
from bench.reuse import conversation_phases  # noqa: E402
from pipeline.messages import CompressionPlan, Conversation, Turn  # noqa: E402
from prepare.continuation import SentTurns  # noqa: E402
from prepare.options import PreparationOptions  # noqa: E402
from prepare.preparation import PromptPreparer  # noqa: E402
from prepare.prompt import DEFAULT_SYSTEM_PROMPT, SHORT_ANSWER_SYSTEM_PROMPT  # noqa: E402
from retrieval.config import HybridRetrievalConfig  # noqa: E402
from retrieval.models import DEFAULT_EMBEDDING_MODEL, resolve_model_reference  # noqa: E402
from retrieval.retriever import Retriever  # noqa: E402

READER = ROOT / ".models" / "qwen2.5-coder-1.5b-instruct"
PROMPTS = {"explained": DEFAULT_SYSTEM_PROMPT, "short": SHORT_ANSWER_SYSTEM_PROMPT}


def workload() -> list[tuple[object, tuple[Turn, ...], object]]:
    stories = load(ROOT / CACHE_DIR / COQA_FILENAME)
    (phase, _) = conversation_phases(stories, 30, 3, seed=1)
    retriever = Retriever.load(
        ROOT / INDEX_DIR,
        resolve_model_reference(DEFAULT_EMBEDDING_MODEL),
        hybrid=HybridRetrievalConfig().to_params(),
    )
    by_story: dict[str, list] = {}
    for item in phase.items:
        by_story.setdefault(item.paragraph_id, []).append(item)
    work = []
    for items in by_story.values():
        history: list[Turn] = []
        for item in items:
            recent = [turn.content for turn in history if turn.role == "user"][-2:]
            retrieval = retriever.retrieve(" ".join([*recent, item.question]), 5)
            work.append((item, tuple(history), retrieval))
            answer = item.golds[0] if item.golds else "unknown"
            history += [Turn("user", item.question), Turn("assistant", answer)]
    return work


def follow_up_ms(work, reuse: bool, profile: cProfile.Profile | None = None) -> list[float]:
    preparer = PromptPreparer.load(
        str(READER),
        PROMPTS,
        2048,
        index_path=ROOT / INDEX_DIR,
        sent_turns=SentTurns(4096),
        # Leave out what any turn showed, as when this was measured.
        options=PreparationOptions(skip_shown_turns=None),
    )
    plan = CompressionPlan("sentences", 0.5, policy="always", reuse=reuse)
    times = []
    for item, history, retrieval in work:
        conversation = Conversation(item.question, history, "short")
        if profile is not None and item.warm:
            profile.enable()
        started = time.perf_counter()
        preparer.prepare(conversation, retrieval, plan, 16)
        elapsed = (time.perf_counter() - started) * 1000
        if profile is not None and item.warm:
            profile.disable()
        if item.warm:
            times.append(elapsed)
    return times


def main() -> None:
    work = workload()
    runs: dict[bool, list[list[float]]] = {False: [], True: []}
    for rep in range(2):
        for reuse in (False, True):
            times = follow_up_ms(work, reuse)
            runs[reuse].append(times)
            median = statistics.median(times)
            print(f"rep {rep} reuse={reuse}: follow-ups n={len(times)} prepare p50 {median:.2f} ms")
    plain, reused = ([statistics.mean(ms) for ms in zip(*runs[k], strict=True)] for k in runs)
    pairs = list(zip(reused, plain, strict=True))
    difference = stats.paired_difference(pairs, stat=stats.sample_median)
    print(
        f"reuse - plain, ms, median of paired differences (n={len(pairs)}): "
        f"{stats.fmt_difference(difference)}"
    )
    profile = cProfile.Profile()
    follow_up_ms(work, True, profile)
    pstats.Stats(profile).sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    main()
