"""Answers of the reuse layout against today's on the skewed SQuAD workload, read by the
1.5B in the short style: each request paired with itself (the same question, the same
order), F1 and whether the answer holds a gold (bench.squad_metrics) against the question's
SQuAD gold answers, the mean difference with its paired bootstrap 95% interval
(bench.stats), over all requests and over cold and warm ones. The workload's records carry
no golds (bench.reuse reports answers only for conversations), so they are looked up here
by question id in the SQuAD sample the workload was drawn from (`bench.quality prepare`).

    .venv/bin/python docs/results/reuse/v23-squad-answers-15b/answers.py \
        > docs/results/reuse/v23-squad-answers-15b/answers.txt
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]
sys.path.insert(0, str(ROOT))

from bench import stats  # noqa: E402
from bench.squad import DEFAULT_CACHE_DIR, SQUAD_DEV_FILENAME, load_squad  # noqa: E402
from bench.squad_metrics import answer_survives, f1  # noqa: E402

METRICS = {"F1": f1, "answer holds a gold": answer_survives}
SIDES = ("reuse", "today")


def main() -> None:
    doc = json.loads((HERE / "results.json").read_text())
    golds = {
        q.question_id: q.gold_answers
        for q in load_squad(ROOT / DEFAULT_CACHE_DIR / SQUAD_DEV_FILENAME).questions
    }
    for phase in doc["phases"]:
        items = phase["items"]
        records = {r["setting"]: r["records"][phase["name"]] for r in doc["runs"]}
        groups = {
            "all": range(len(items)),
            "cold": [i for i, item in enumerate(items) if not item["warm"]],
            "warm": [i for i, item in enumerate(items) if item["warm"]],
        }
        for name, metric in METRICS.items():
            for group, indexes in groups.items():
                pairs = [
                    tuple(
                        float(
                            metric(records[side][i]["answer"] or "", golds[items[i]["question_id"]])
                        )
                        for side in SIDES
                    )
                    for i in indexes
                ]
                means = [statistics.mean(pair[k] for pair in pairs) for k in range(2)]
                difference = stats.fmt_difference(stats.paired_difference(pairs))
                print(
                    f"{phase['name']} {group} (n={len(pairs)}): {name} reuse {means[0]:.3f}, "
                    f"today {means[1]:.3f}, reuse - today {difference}"
                )


if __name__ == "__main__":
    main()
