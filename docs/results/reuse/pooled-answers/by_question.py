"""The shipped continued layout's (reuse-last1) answers against today's, by question of the
conversation: per run and over all, the follow-ups whose answer held a gold under one
layout and not the other (each run's single service a setting; every follow-up counted,
stories shared between runs included).

    cd docs/results/reuse/pooled-answers
    ../../../../.venv/bin/python by_question.py > by_question.txt
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))

from bench.squad_metrics import answer_survives  # noqa: E402

RUNS = (
    "v13-conversation-last1",
    "v15-conversation-last1-c1",
    "v17-count-ahead-c1",
    "v19-count-ahead-c4",
)


def holds(record: dict, item: dict) -> bool:
    return answer_survives(record["answer"] or "", item["golds"])


def main() -> None:
    totals: dict[int, list[int]] = {}
    for run in RUNS:
        doc = json.loads((ROOT / "docs/results/reuse" / run / "results.json").read_text())
        for phase in doc["phases"]:
            items = phase["items"]
            today, reuse = (
                next(r["records"][phase["name"]] for r in doc["runs"] if r["setting"] == name)
                for name in ("today", "reuse-last1")
            )
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
