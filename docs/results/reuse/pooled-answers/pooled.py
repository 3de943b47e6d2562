"""Answers of the continued layout (reuse) against today's, pooled over every stored
conversation run read by the 1.5B in the short style: each follow-up paired with itself
(each setting the mean of its runs, as bench.reuse's report does), the pairs of all runs
together, the mean difference with its paired bootstrap 95% interval (bench.stats). A
story asked in an earlier run of the list is left out of the later one's share of the pool
(v11 and v13 drew 27 of the same stories; v15 none of any other's; v17 and v19, seeds 2
and 3, see their lines), so that no
conversation counts twice; each run's own line keeps all of its follow-ups.

    cd docs/results/reuse/pooled-answers && ../../../../.venv/bin/python pooled.py > pooled.txt
    ../../../../.venv/bin/python pooled.py reuse-last1 > pooled-last1.txt
    ../../../../.venv/bin/python pooled.py reuse-top1 > pooled-top1.txt

The argument names the setting set against today (reuse by default); runs without it are
passed over.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))

from bench import stats  # noqa: E402
from bench.squad_metrics import answer_survives, f1  # noqa: E402

RUNS = (
    "v9-conversation-15b-short",
    "v10-conversation-15b-4096",
    "v11-conversation-repeat",
    "v13-conversation-last1",
    "v15-conversation-last1-c1",
    "v17-count-ahead-c1",
    "v19-count-ahead-c4",
    "v20-evidence-in-view",
    "v21-top1-c1",
    "v24-top1-c4",
)
METRICS = {"F1": f1, "answer holds a gold": answer_survives}


def follow_up_scores(run: str, setting: str, metric) -> list[tuple[str, float]]:
    """Per follow-up of the run (every phase), its story and the mean over the setting's
    runs."""
    doc = json.loads((ROOT / "docs/results/reuse" / run / "results.json").read_text())
    scores: list[tuple[str, float]] = []
    for phase in doc["phases"]:
        items = phase["items"]
        per_run = [r["records"][phase["name"]] for r in doc["runs"] if r["setting"] == setting]
        if not per_run:
            continue
        for index, item in enumerate(items):
            if item["warm"]:
                score = statistics.mean(
                    float(metric(records[index]["answer"] or "", item["golds"]))
                    for records in per_run
                )
                scores.append((item["paragraph_id"], score))
    return scores


def main() -> None:
    setting = sys.argv[1] if len(sys.argv) > 1 else "reuse"
    for name, metric in METRICS.items():
        pairs: list[tuple[float, float]] = []
        pooled_stories: set[str] = set()
        for run in RUNS:
            reuse, today = (
                follow_up_scores(run, setting, metric),
                follow_up_scores(run, "today", metric),
            )
            if not reuse:
                continue
            stories = [story for story, _ in reuse]
            run_pairs = [(a, b) for (_, a), (_, b) in zip(reuse, today, strict=True)]
            difference = stats.paired_difference(run_pairs)
            new = [pair for story, pair in zip(stories, run_pairs, strict=True)
                   if story not in pooled_stories]  # fmt: skip
            print(
                f"{run}: {name}, {setting} - today, n={len(run_pairs)}: "
                f"{stats.fmt_difference(difference)}; pooled: {len(new)} follow-ups of "
                "stories no earlier run asked"
            )
            pairs += new
            pooled_stories |= set(stories)
        pooled = stats.paired_difference(pairs)
        print(f"pooled: {name}, {setting} - today, n={len(pairs)}: {stats.fmt_difference(pooled)}")


if __name__ == "__main__":
    main()
