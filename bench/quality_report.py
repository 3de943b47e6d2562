"""Paired comparisons of quality runs: what a sweep point changed against `none`, what the
prefix cache changed across fresh services, what a stronger reader changed.

    python -m bench.quality_report prefix bench-results/prefix     # make bench-prefix's runs
    python -m bench.quality_report readers STRONG.json WEAK.json [--points "none k=5" ...]
    python -m bench.quality_report run RESULT.json [--out REPORT.json]
    python -m bench.quality_report abba FOLDER bf16 int8   # FOLDER/{bf16-1,int8-1,int8-2,bf16-2}

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
    independent_ratio,
    interval_dict,
    one_sample,
    paired_difference,
    paired_ratio,
    quantile,
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


def load_run(folder: Path) -> Any:
    """The one quality run's JSON that `folder` holds (a bench.suite --out folder)."""
    return _load(one_json(folder))


def one_json(folder: Path) -> Path:
    """The one quality run's JSON in a service's folder (bench.suite writes one a plan)."""
    found = sorted(folder.glob("squad-*.json"))  # its config is squad.serve.yaml
    if len(found) != 1:
        raise SystemExit(f"{folder}: expected one squad-*.json, found {[p.name for p in found]}")
    return found[0]


def question_metric(doc: Mapping[str, Any], key: str) -> dict[str, float]:
    """`key` (ttft_ms, tpot_ms) per question id of a one-point run's answered questions."""
    return {
        r["question_id"]: r[key]
        for r in doc["results"]
        if r.get("error") is None and r.get(key) is not None
    }


def question_ttfts(doc: Mapping[str, Any]) -> dict[str, float]:
    """TTFT per question id of a one-point run's answered questions."""
    return question_metric(doc, "ttft_ms")


def abba_runs(a: str, b: str) -> tuple[str, str, str, str]:
    """The four services' names in the order they run: a-1, b-1, b-2, a-2."""
    return (f"{a}-1", f"{b}-1", f"{b}-2", f"{a}-2")


def abba_ratios(
    runs: Mapping[str, Mapping[str, float]], a: str, b: str
) -> tuple[list[str], dict[str, Interval | None]]:
    """The questions all four runs have, and b / a per question: each repetition's paired
    ratio, and the ratio of the per-question means of the two runs a side (which cancels a
    linear drift)."""
    names = abba_runs(a, b)
    shared = [q for q in runs[names[0]] if all(q in runs[n] for n in names)]

    def mean_of(side: str) -> dict[str, float]:
        return {q: (runs[f"{side}-1"][q] + runs[f"{side}-2"][q]) / 2 for q in shared}

    mean_a, mean_b = mean_of(a), mean_of(b)
    ratios = {
        f"{b}-{i} / {a}-{i}": paired_ratio(
            (runs[f"{b}-{i}"][q], runs[f"{a}-{i}"][q]) for q in shared
        )
        for i in (1, 2)
    }
    ratios[f"{b} / {a} (mean of two runs a side)"] = paired_ratio(
        (mean_b[q], mean_a[q]) for q in shared
    )
    return shared, ratios


def prefix_report(runs: Mapping[str, Mapping[str, float]]) -> tuple[str, dict[str, Any]]:
    """Each run's median TTFT and the paired TTFT ratios on / off (abba_ratios)."""
    shared, ratios = abba_ratios(runs, "off", "on")
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


ABBA_SCORES = ("F1", "contains gold")
TAIL_PERCENTILE = 99


def abba_tails(
    runs: Mapping[str, Mapping[str, float]], a: str, b: str
) -> dict[str, Interval | None]:
    """Each side's p99 over its two runs pooled (the tail a user meets, which per-question
    ratios of medians do not show), and p99(b) / p99(a) with a 95% interval resampling each
    side on its own."""
    pooled = {side: [v for i in (1, 2) for v in runs[f"{side}-{i}"].values()] for side in (a, b)}
    p99 = quantile(TAIL_PERCENTILE)
    tails: dict[str, Interval | None] = {side: one_sample(values, p99)
                                         for side, values in pooled.items()}  # fmt: skip
    tails[f"{b} / {a}"] = independent_ratio(pooled[b], pooled[a], p99)
    return tails


def abba_report(
    docs: Mapping[str, Mapping[str, Any]], a: str, b: str
) -> tuple[str, dict[str, Any]]:
    """Two settings over four fresh services in ABBA order (each a one-point quality run of
    the same questions): each run's TTFT, TPOT and whole-answer time medians, the paired
    ratios b / a of each, and the answers: each side's mean score over its two runs, and
    b − a paired by question."""
    speed: dict[str, dict[str, Any]] = {}
    for metric, key in (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"), ("answer", "total_ms")):
        runs = {name: question_metric(doc, key) for name, doc in docs.items()}
        shared, ratios = abba_ratios(runs, a, b)
        speed[metric] = {
            "n": len(shared),
            "runs": {name: one_sample(t.values()) for name, t in runs.items()},
            "ratios": ratios,
            "p99": abba_tails(runs, a, b),
        }
    answered = {name: next(iter(answered_by_point(doc["results"]).values()), {})
                for name, doc in docs.items()}  # fmt: skip
    names = abba_runs(a, b)
    shared = [q for q in answered[names[0]] if all(q in answered[n] for n in names)]
    answers: dict[str, dict[str, Any]] = {}
    for score_name in ABBA_SCORES:
        score = SCORES[score_name]

        def side(name: str, q: str, score: Score = score) -> float | None:
            values = [score(answered[f"{name}-{i}"][q]) for i in (1, 2)]
            return None if None in values else sum(v for v in values if v is not None) / 2

        answers[score_name] = {
            a: one_sample([side(a, q) for q in shared], sample_mean),
            b: one_sample([side(b, q) for q in shared], sample_mean),
            "difference": paired_difference((side(b, q), side(a, q)) for q in shared),
        }
    same = sum(answered[f"{s}-1"][q].get("answer") == answered[f"{s}-2"][q].get("answer")
               for s in (a, b) for q in shared)  # fmt: skip
    speed_rows = [
        [name, *(fmt_interval(speed[m]["runs"][name], 0) for m in speed)] for name in names
    ]
    ratio_rows = [[name, speed["TTFT"]["n"], *(fmt_ratio(speed[m]["ratios"][name]) for m in speed)]
                  for name in speed["TTFT"]["ratios"]]  # fmt: skip
    tail_rows = [[name, *(fmt_ratio(tail) if "/" in name else fmt_interval(tail, 0)
                          for tail in (speed[m]["p99"][name] for m in speed))]
                 for name in speed["TTFT"]["p99"]]  # fmt: skip
    answer_rows = [
        [score_name, len(shared), fmt_interval(row[a]), fmt_interval(row[b]),
         f"{fmt_interval(row['difference'])}: {difference_verdict(row['difference'])}"]
        for score_name, row in answers.items()
    ]  # fmt: skip
    text = "\n\n".join(
        [
            "Per run, median ms [95% CI]:",
            markdown_table(["run", "TTFT p50 ms", "TPOT p50 ms", "answer p50 ms"], speed_rows),
            "Paired by question, median per-question ratio:",
            markdown_table(["ratio", "n", "TTFT", "TPOT", "answer"], ratio_rows),
            f"Tails, p{TAIL_PERCENTILE} of each side's two runs pooled, ms, and their ratio "
            "[95% CI, each side resampled on its own]:",
            markdown_table(["side", "TTFT", "TPOT", "answer"], tail_rows),
            f"Answers, each side the mean of its two runs; paired by question ({same} of "
            f"{2 * len(shared)} answers word for word the same in a side's two runs):",
            markdown_table(["score", "n", a, b, f"{b} − {a}"], answer_rows),
        ]
    )
    data = {
        "settings": {"a": a, "b": b},
        "runs_in_order": list(names),
        **{
            metric: {
                "n": s["n"],
                "runs": {name: interval_dict(i) for name, i in s["runs"].items()},
                "ratios": {name: interval_dict(i) for name, i in s["ratios"].items()},
                f"p{TAIL_PERCENTILE}": {name: interval_dict(i) for name, i in s["p99"].items()},
            }
            for metric, s in speed.items()
        },
        "answers": {
            "n": len(shared),
            "same_in_both_runs": same,
            **{
                name: {k: interval_dict(i) for k, i in row.items()} for name, row in answers.items()
            },
        },
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
    abba = commands.add_parser("abba", help="two settings over four services in ABBA order")
    abba.add_argument("folder", type=Path, help="holds A-1/ B-1/ B-2/ A-2/, one run's JSON each")
    abba.add_argument("a", help="the baseline's name (the folders' prefix)")
    abba.add_argument("b", help="the other setting's name")
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
    elif args.command == "abba":
        docs = {name: load_run(args.folder / name) for name in abba_runs(args.a, args.b)}
        text, data = abba_report(docs, args.a, args.b)
        out = args.folder / f"{args.b}-against-{args.a}.json"
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
