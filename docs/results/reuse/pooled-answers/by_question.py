"""A continued layout's answers against today's, by question of the conversation: per run
and over all, the follow-ups whose answer held a gold under one layout and not the other
(each run's single service a setting; every follow-up counted, stories shared between runs
included). The layout is the setting named first (the shipped one, reuse-last1, by
default); the runs are those named after it, else pooled.py's, of which those that ran it.

    cd docs/results/reuse/pooled-answers
    ../../../../.venv/bin/python by_question.py > by_question.txt
    ../../../../.venv/bin/python by_question.py reuse-pointer v20-evidence-in-view
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]
sys.path[:0] = [str(ROOT), str(HERE)]

from pooled import RUNS  # noqa: E402

from bench.squad_metrics import answer_survives  # noqa: E402

SHIPPED = "reuse-last1"


def holds(record: dict, item: dict) -> bool:
    return answer_survives(record["answer"] or "", item["golds"])


def main() -> None:
    setting = sys.argv[1] if len(sys.argv) > 1 else SHIPPED
    runs = sys.argv[2:] or RUNS
    totals: dict[int, list[int]] = {}
    for run in runs:
        doc = json.loads((ROOT / "docs/results/reuse" / run / "results.json").read_text())
        for phase in doc["phases"]:
            items = phase["items"]
            records: dict[str, list[dict]] = {}
            for run_of in doc["runs"]:  # a setting's first service, if it had more
                records.setdefault(run_of["setting"], run_of["records"][phase["name"]])
            if setting not in records:
                continue
            today, reuse = records["today"], records[setting]
            for turn in sorted({item["turn"] for item in items if item["warm"]}):
                chosen = [i for i, item in enumerate(items) if item["turn"] == turn]
                lost = sum(holds(today[i], items[i]) and not holds(reuse[i], items[i])
                           for i in chosen)  # fmt: skip
                won = sum(holds(reuse[i], items[i]) and not holds(today[i], items[i])
                          for i in chosen)  # fmt: skip
                total = totals.setdefault(turn + 1, [0, 0, 0])
                total[0] += lost
                total[1] += won
                total[2] += len(chosen)
                print(f"{run}: question {turn + 1}, n={len(chosen)}: gold lost {lost}, won {won}")
    for question, (lost, won, n) in sorted(totals.items()):
        print(f"all runs: question {question}, n={n}: gold lost {lost}, won {won}, "
              f"net {won - lost:+d}")  # fmt: skip


if __name__ == "__main__":
    main()
