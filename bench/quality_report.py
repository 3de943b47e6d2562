"""Paired comparisons of quality runs: what a sweep point changed against `none`, what the
prefix cache changed across fresh services, what a stronger reader changed.

    python -m bench.quality_report prefix bench-results/prefix     # make bench-prefix's runs
    python -m bench.quality_report readers STRONG.json WEAK.json [--points "none k=5" ...]
    python -m bench.quality_report run RESULT.json [--out REPORT.json]

A quality run (bench.quality) writes its own comparisons into its report: every point
against `none` at the same k, paired by question (the questions both answered): the mean
difference of each score and the median per-question TTFT ratio, each with its 95%
interval (bench.stats); one that holds 0 (a ratio: 1) is "no detectable difference".
The two commands compare whole runs: the prefix cache off and on over four fresh services
in ABBA order (off-1, on-1, on-2, off-2, so a linear drift falls on both sides alike), and
two readers on the same questions.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.stats import (
    Interval,
    difference_verdict,
    fmt_interval,
    fmt_ratio,
    interval_dict,
    one_sample,
    paired_difference,
    paired_ratio,
    sample_mean,
)
from bench.tables import markdown_table

Result = Mapping[str, Any]
Score = Callable[[Result], float | None]

PREFIX_RUNS = ("off-1", "on-1", "on-2", "off-2")  # make bench-prefix's order
PREFIX_FILE = "squad-prefix-40q.json"


def _score(key: str) -> Score:
    """A per-question result's `key` as a number (a yes/no as 1 or 0); None when unscored."""
    return lambda r: None if r.get(key) is None else float(r[key])


SCORES: dict[str, Score] = {
    "EM": _score("exact_match"),
    "F1": _score("f1"),
    "contains gold": _score("contains_gold"),
    "answer kept": _score("answer_survived"),
    "recall@k": _score("recall"),
}


def answered_by_point(results: Sequence[Result]) -> dict[str, dict[str, Result]]:
    """{point: {question_id: result}} of the requests that succeeded."""
    answered: dict[str, dict[str, Result]] = defaultdict(dict)
    for r in results:
        if r.get("error") is None:
            answered[r["point"]][r["question_id"]] = r
    return answered


def compare_points(a: Mapping[str, Result], b: Mapping[str, Result]) -> dict[str, Any]:
    """Point a against point b on the questions both answered: per score the mean difference
    a − b, and the median per-question TTFT ratio a / b (Intervals, None below 2 pairs)."""
    shared = [q for q in a if q in b]
    row: dict[str, Any] = {"n": len(shared)}
    for name, score in SCORES.items():
        row[name] = paired_difference([(score(a[q]), score(b[q])) for q in shared])
    row["TTFT"] = paired_ratio((a[q].get("ttft_ms"), b[q].get("ttft_ms")) for q in shared)
    return row


def against_none(results: Sequence[Result], points: Sequence[Mapping[str, Any]]) -> list[dict]:
    """Every point that is not `none` against `none` at its k, where the sweep has both."""
    answered = answered_by_point(results)
    names = {p["name"] for p in points}
    rows = []
    for point in points:
        baseline = f"none k={point['top_k']}"
        if point["method"] == "none" or baseline not in names:
            continue
        row = compare_points(answered[point["name"]], answered[baseline])
        rows.append({"a": point["name"], "b": baseline, **row})
    return rows


def comparisons_markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    """The paired comparisons as Markdown (empty when there are none)."""
    if not rows:
        return ""

    def difference(interval: Interval | None) -> str:
        return (
            "-" if interval is None else f"{fmt_interval(interval)}: {difference_verdict(interval)}"
        )

    table = markdown_table(
        ["a − b", "n", *SCORES, "TTFT a / b"],
        [
            [f"{r['a']} − {r['b']}", r["n"], *(difference(r[s]) for s in SCORES),
             fmt_ratio(r["TTFT"])]
            for r in rows
        ],
    )  # fmt: skip
    return (
        "\nPaired by question against `none` at the same k (the questions both answered): "
        "mean difference a − b [95% CI] (n), TTFT the median per-question ratio a / b.\n\n"
        + table
        + "\n"
    )


def jsonable(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The rows with each Interval as a dict."""
    return [
        {k: interval_dict(v) if isinstance(v, Interval) or v is None else v for k, v in r.items()}
        for r in rows
    ]


# --- whole runs against each other -------------------------------------------------------------


def _load(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def question_ttfts(doc: Mapping[str, Any]) -> dict[str, float]:
    """TTFT per question id of a one-point run's answered questions."""
    return {
        r["question_id"]: r["ttft_ms"]
        for r in doc["results"]
        if r.get("error") is None and r.get("ttft_ms") is not None
    }


def prefix_report(runs: Mapping[str, Mapping[str, float]]) -> tuple[str, dict[str, Any]]:
    """Each run's median TTFT, each repetition's paired ratio on / off, and the ratio of the
    per-question means of the two runs a side (which cancels a linear drift)."""
    shared = [q for q in runs["off-1"] if all(q in t for t in runs.values())]

    def mean_of(*names: str) -> dict[str, float]:
        return {q: sum(runs[n][q] for n in names) / len(names) for q in shared}

    on, off = mean_of("on-1", "on-2"), mean_of("off-1", "off-2")
    ratios = {
        "on-1 / off-1": paired_ratio((runs["on-1"][q], runs["off-1"][q]) for q in shared),
        "on-2 / off-2": paired_ratio((runs["on-2"][q], runs["off-2"][q]) for q in shared),
        "on / off (mean of two runs a side)": paired_ratio((on[q], off[q]) for q in shared),
    }
    medians = {name: one_sample(t.values()) for name, t in runs.items()}
    text = "\n\n".join(
        [
            "TTFT per run, median ms [95% CI] (n):",
            markdown_table(
                ["run", "TTFT p50 ms"], [[n, fmt_interval(m, 0)] for n, m in medians.items()]
            ),
            "Paired by question, median per-question TTFT ratio:",
            markdown_table(
                ["ratio", "n", "TTFT on / off"],
                [[name, len(shared), fmt_ratio(r)] for name, r in ratios.items()],
            ),
        ]
    )
    data = {
        "n": len(shared),
        "runs": {name: interval_dict(m) for name, m in medians.items()},
        "ratios": {name: interval_dict(r) for name, r in ratios.items()},
    }
    return text + "\n", data


def reader_report(
    stronger: Mapping[str, Any], weaker: Mapping[str, Any], points: Sequence[str]
) -> tuple[str, dict[str, Any]]:
    """Each point read by two readers, on the questions both answered: each reader's mean
    F1 and the mean difference stronger − weaker."""
    sides = [answered_by_point(doc["results"]) for doc in (stronger, weaker)]
    f1 = SCORES["F1"]
    rows, data = [], {}
    for point in points:
        first, second = sides[0].get(point, {}), sides[1].get(point, {})
        shared = [q for q in first if q in second]
        means = [one_sample([f1(side[q]) for q in shared], sample_mean) for side in (first, second)]
        difference = paired_difference((f1(first[q]), f1(second[q])) for q in shared)
        verdict = difference_verdict(difference)
        rows.append([point, len(shared), *(fmt_interval(m) for m in means),
                     f"{fmt_interval(difference)}: {verdict}"])  # fmt: skip
        data[point] = {
            "n": len(shared),
            "stronger": interval_dict(means[0]),
            "weaker": interval_dict(means[1]),
            "difference": interval_dict(difference),
            "verdict": verdict,
        }
    header = ["point", "n", "stronger F1", "weaker F1", "stronger − weaker"]
    return markdown_table(header, rows) + "\n", data


def run_report(doc: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """Each point of one quality run on its own: n, each score's mean and the medians of
    TTFT and TPOT, each with its 95% interval (for a run with no `none` to pair against)."""
    header, rows, data = ["point", "n", *SCORES, "TTFT p50 ms", "TPOT p50 ms"], [], {}
    for point, answered in answered_by_point(doc["results"]).items():
        results = list(answered.values())
        scores = {name: one_sample([score(r) for r in results], sample_mean)
                  for name, score in SCORES.items()}  # fmt: skip
        ttft = one_sample(r.get("ttft_ms") for r in results)
        tpot = one_sample(r.get("tpot_ms") for r in results)
        rows.append([point, len(results), *(fmt_interval(i) for i in scores.values()),
                     fmt_interval(ttft, 0), fmt_interval(tpot, 0)])  # fmt: skip
        data[point] = {"n": len(results), "ttft_ms_p50": interval_dict(ttft),
                       "tpot_ms_p50": interval_dict(tpot),
                       **{name: interval_dict(i) for name, i in scores.items()}}  # fmt: skip
    return markdown_table(header, rows) + "\n", data


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    prefix = commands.add_parser("prefix", help="the four runs of make bench-prefix")
    prefix.add_argument("folder", type=Path, help="holds off-1/ on-1/ on-2/ off-2/")
    readers = commands.add_parser("readers", help="two quality runs on the same questions")
    readers.add_argument("stronger", type=Path)
    readers.add_argument("weaker", type=Path)
    readers.add_argument("--points", nargs="+", default=["none k=5"])
    readers.add_argument("--out", type=Path, help="also write the report's JSON here")
    run = commands.add_parser("run", help="one quality run's points, each with its intervals")
    run.add_argument("result", type=Path, help="a bench.quality run's JSON")
    run.add_argument("--out", type=Path, help="also write the report's JSON here")
    args = parser.parse_args(argv)
    if args.command == "prefix":
        runs = {
            name: question_ttfts(_load(args.folder / name / PREFIX_FILE)) for name in PREFIX_RUNS
        }
        text, data = prefix_report(runs)
        out = args.folder / "prefix.json"
    elif args.command == "run":
        text, data = run_report(_load(args.result))
        out = args.out
    else:
        text, data = reader_report(_load(args.stronger), _load(args.weaker), args.points)
        out = args.out
    sys.stdout.write(text)
    if out is not None:
        out.write_text(json.dumps(data, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
