"""n and 95% bootstrap intervals for the docs' tables that were first written without them.

    python -m bench.intervals --results docs/results [--out bench-results/intervals]

Reads the raw records stored under docs/results/ (every request of a latency run, every
question of a quality sweep, every timing of the LLMLingua speed test) and prints, per
section of docs/benchmarks.md and docs/quality.md, n and a 95% interval for each figure its
table and prose rest on. Nothing is re-measured: the point estimates are those of the stored
runs. With --out it also writes intervals.md and intervals.json there.

How each interval is made (bench.bootstrap, 2,000 resamples, seed 0, percentile intervals):
- **paired ratio** a / b, where both sides saw the same prompts or questions: the median of
  the per-pair ratios, bootstrapped on their logarithms (`paired_ci`), as bench.engines and
  bench.speculative do. Its estimate is not the ratio of the two medians the docs' tables
  show (each side's median is printed beside it, with its own interval).
- **ratio** a / b of independent samples (different questions, or repeated timings):
  median(a) / median(b) with each side resampled on its own (`ratio_ci`).
- **difference** a − b of a per-question score (F1, a 0/1 rate such as answer kept): the
  mean of the per-question differences, same questions on both sides (`paired_ci`, mean),
  with how many questions went up and down.
- **one sample** (a row's median or mean): `paired_ci` against zeros, which resamples the
  values themselves (bench.labs' `sample_interval`).

A ratio whose interval holds 1, or a difference whose interval holds 0, is printed as "no
detectable difference". A side with fewer than 2 values gets no interval ("n = 1: no
interval"): one request says nothing about its own spread. Throughput (req/s, tokens/s) is
one wall time per run and has no interval. With n this small (2 to 8 requests in several
runs) a percentile interval is itself rough: those figures are indicative.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from bench import bootstrap
from bench.bootstrap import Interval
from bench.stats import median, tpot

NO_DIFFERENCE = "no detectable difference"
SEED = 0
COMMAND = "python -m bench.intervals --results docs/results"

Record = Mapping[str, Any]
Metric = Callable[[Record], float | None]


# --- intervals -------------------------------------------------------------------------------


def _clean(values: Iterable[float | None]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def one_sample(
    values: Iterable[float | None], stat: bootstrap.Statistic = bootstrap.median
) -> Interval | None:
    """stat(values) with its 95% interval; None with fewer than 2 values."""
    data = _clean(values)
    if len(data) < 2:
        return None
    return bootstrap.paired_ci(data, [0.0] * len(data), stat=stat, seed=SEED)


def paired_ratio(pairs: Iterable[tuple[float | None, float | None]]) -> Interval | None:
    """The median per-pair ratio a / b with its 95% interval (bootstrap on the logs); pairs
    with a side missing or not positive are left out; None with fewer than 2 pairs."""
    kept = [(a, b) for a, b in pairs if a is not None and b is not None and a > 0 and b > 0]
    if len(kept) < 2:
        return None
    logs = bootstrap.paired_ci(
        [math.log(a) for a, _ in kept], [math.log(b) for _, b in kept], seed=SEED
    )
    return Interval(math.exp(logs.estimate), math.exp(logs.low), math.exp(logs.high), logs.n)


def independent_ratio(
    a: Iterable[float | None],
    b: Iterable[float | None],
    stat: bootstrap.Statistic = bootstrap.median,
) -> Interval | None:
    """stat(a) / stat(b) for independent samples with its 95% interval; None when a side
    has fewer than 2 values."""
    first, second = _clean(a), _clean(b)
    if len(first) < 2 or len(second) < 2:
        return None
    return bootstrap.ratio_ci(first, second, stat=stat, seed=SEED)


def paired_difference(
    pairs: Iterable[tuple[float | None, float | None]], stat: bootstrap.Statistic = bootstrap.mean
) -> Interval | None:
    """stat of the per-pair differences a − b with its 95% interval; None below 2 pairs."""
    kept = [(a, b) for a, b in pairs if a is not None and b is not None]
    if len(kept) < 2:
        return None
    return bootstrap.paired_ci([a for a, _ in kept], [b for _, b in kept], stat=stat, seed=SEED)


def ratio_verdict(interval: Interval | None, below: str = "lower", above: str = "higher") -> str:
    """What a ratio's interval says: `below` or `above` 1, else no detectable difference."""
    if interval is None:
        return "no interval"
    if interval.contains(1.0):
        return NO_DIFFERENCE
    return below if interval.high < 1.0 else above


def difference_verdict(interval: Interval | None) -> str:
    if interval is None:
        return "no interval"
    if interval.contains(0.0):
        return NO_DIFFERENCE
    return "lower" if interval.high < 0.0 else "higher"


# --- formatting ------------------------------------------------------------------------------


def _number(value: float, digits: int) -> str:
    return f"{value:,.{digits}f}"


def fmt_value(interval: Interval | None, digits: int = 0, n: int | None = None) -> str:
    """`8,146 [7,301, 9,041]`; with too few values the reason instead."""
    if interval is None:
        return f"n = {n}: no interval" if n is not None else "no interval"
    return (
        f"{_number(interval.estimate, digits)} "
        f"[{_number(interval.low, digits)}, {_number(interval.high, digits)}]"
    )


def fmt_ratio(interval: Interval | None, n: int | None = None) -> str:
    """`0.80x [0.74, 0.86]`, and ": no detectable difference" when the interval holds 1."""
    if interval is None:
        return f"n = {n}: no interval" if n is not None else "no interval"
    text = f"{interval.estimate:.2f}x [{interval.low:.2f}, {interval.high:.2f}]"
    return text + (f": {NO_DIFFERENCE}" if interval.contains(1.0) else "")


def _signed(value: float, digits: int) -> str:
    text = f"{value:+.{digits}f}"
    return text.replace("-", "−")


def fmt_difference(interval: Interval | None, digits: int = 3) -> str:
    """`−0.001 [−0.068, +0.067]: no detectable difference`."""
    if interval is None:
        return "no interval"
    text = (
        f"{_signed(interval.estimate, digits)} "
        f"[{_signed(interval.low, digits)}, {_signed(interval.high, digits)}]"
    )
    return text + (f": {NO_DIFFERENCE}" if interval.contains(0.0) else "")


def changes(pairs: Iterable[tuple[float | None, float | None]]) -> dict[str, int]:
    """How many pairs went up (a > b), down (a < b) and stayed equal."""
    kept = [(a, b) for a, b in pairs if a is not None and b is not None]
    return {
        "up": sum(1 for a, b in kept if a > b),
        "down": sum(1 for a, b in kept if a < b),
        "same": sum(1 for a, b in kept if a == b),
    }


def fmt_changes(text: str, counts: Mapping[str, int]) -> str:
    """`text`, then "identical on every question" or "(2 up, 0 down)" for the questions
    that changed."""
    if counts["up"] == counts["down"] == 0:
        return f"{text} (identical on every question)"
    return f"{text} ({counts['up']} up, {counts['down']} down)"


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    align = ["---"] + ["---" for _ in header[1:]]
    return [_row(header), _row(align), *(_row(r) for r in rows)]


def interval_dict(interval: Interval | None) -> dict[str, float] | None:
    """An interval as JSON-ready data (None stays None)."""
    return None if interval is None else asdict(interval)


@dataclass
class Section:
    """One doc section's intervals: Markdown lines to print and the same figures as data."""

    doc: str
    title: str
    source: str
    lines: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    def markdown(self) -> str:
        head = [f"## {self.doc}: {self.title}", "", f"Source: `{self.source}`", ""]
        return "\n".join(head + self.lines) + "\n"


# --- latency runs (bench.latency records, bench.batching records) ----------------------------


def record_ttft(record: Record) -> float | None:
    return record.get("ttft_ms") if record.get("ok", True) else None


def record_e2e(record: Record) -> float | None:
    return record.get("e2e_ms") if record.get("ok", True) else None


def record_tpot(record: Record) -> float | None:
    """(E2E − TTFT) / (output tokens − 1), bench.stats' definition."""
    ttft, e2e = record_ttft(record), record_e2e(record)
    if ttft is None or e2e is None:
        return None
    return tpot(ttft, e2e, int(record.get("output_tokens") or 0))


def record_ok(record: Record) -> float | None:
    """1 for a successful request, None for a failed one (so a pair needs both to succeed)."""
    return 1.0 if record.get("ok", True) else None


LATENCY_METRICS: dict[str, Metric] = {
    "TTFT": record_ttft,
    "TPOT": record_tpot,
    "E2E": record_e2e,
}


def keyed(records: Sequence[Record], key: str) -> dict[tuple[Any, int], Record]:
    """Records by (key value, occurrence): a question asked twice pairs in order."""
    seen: dict[Any, int] = defaultdict(int)
    out: dict[tuple[Any, int], Record] = {}
    for record in records:
        value = record.get(key)
        out[(value, seen[value])] = record
        seen[value] += 1
    return out


def pairs_of(
    a: Sequence[Record], b: Sequence[Record], key: str, metric: Metric
) -> list[tuple[float | None, float | None]]:
    """(metric of a, metric of b) for the requests both runs sent with the same `key`."""
    left, right = keyed(a, key), keyed(b, key)
    return [(metric(left[k]), metric(right[k])) for k in left if k in right]


def latency_rows(runs: Mapping[str, Sequence[Record]], labels: Mapping[str, str]) -> list[dict]:
    """Per run: n successful requests and the median of each metric with its interval."""
    rows = []
    for name, label in labels.items():
        records = runs.get(name)
        if records is None:
            continue
        ok = [r for r in records if r.get("ok", True)]
        row: dict[str, Any] = {"run": name, "label": label, "n": len(ok), "sent": len(records)}
        for metric, value in LATENCY_METRICS.items():
            values = _clean(value(r) for r in ok)
            row[metric] = one_sample(values)
            row[f"{metric}_n"] = len(values)
        rows.append(row)
    return rows


def latency_comparisons(
    runs: Mapping[str, Sequence[Record]],
    comparisons: Sequence[tuple[str, str, str]],
    key: str,
) -> list[dict]:
    """Per (a, b, label): the paired ratio a / b of each metric over the shared requests."""
    out = []
    for a, b, label in comparisons:
        if a not in runs or b not in runs:
            continue
        row: dict[str, Any] = {"a": a, "b": b, "label": label}
        both = pairs_of(runs[a], runs[b], key, record_ok)
        row["n"] = sum(1 for x, y in both if x is not None and y is not None)
        for metric, value in LATENCY_METRICS.items():
            pairs = pairs_of(runs[a], runs[b], key, value)
            row[metric] = paired_ratio(pairs)
            row[f"{metric}_verdict"] = ratio_verdict(row[metric])
        out.append(row)
    return out


def latency_section(
    section: Section,
    runs: Mapping[str, Sequence[Record]],
    labels: Mapping[str, str],
    comparisons: Sequence[tuple[str, str, str]],
    key: str,
    pairing: str,
) -> Section:
    rows = latency_rows(runs, labels)
    compared = latency_comparisons(runs, comparisons, key)
    section.lines += ["Medians per run, 95% interval in brackets (ms):", ""]
    section.lines += _table(
        ["run", "n", "TTFT p50", "TPOT p50", "E2E p50"],
        [
            [r["label"], str(r["n"])]
            + [fmt_value(r[m], 0 if m != "TPOT" else 1, r[f"{m}_n"]) for m in LATENCY_METRICS]
            for r in rows
        ],
    )
    section.lines += ["", f"Paired by {pairing}: median of the per-request ratios a / b:", ""]
    section.lines += _table(
        ["a / b", "n pairs", "TTFT", "TPOT", "E2E"],
        [
            [c["label"], str(c["n"])] + [fmt_ratio(c[m], c["n"]) for m in LATENCY_METRICS]
            for c in compared
        ],
    )
    section.data = {
        "rows": [_jsonable(r) for r in rows],
        "comparisons": [_jsonable(c) for c in compared],
    }
    return section


def _jsonable(row: Mapping[str, Any]) -> dict[str, Any]:
    return {k: interval_dict(v) if isinstance(v, Interval) else v for k, v in row.items()}


def _load(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


# --- docs/benchmarks.md ----------------------------------------------------------------------

QUICK_LABELS = {
    "naive-none-c1": "naive, C=1",
    "prefix-none-c1": "+ prefix cache, C=1",
    "prefix-sentences-c1": "+ sentence selection, C=1",
    "prefix-llmlingua-c1": "+ LLMLingua (old two-pass), C=1",
    "prefix-sentences-c4": "+ sentence selection, C=4",
}
QUICK_COMPARISONS = (
    ("prefix-none-c1", "naive-none-c1", "prefix cache / naive"),
    ("prefix-sentences-c1", "prefix-none-c1", "+ sentences / prefix cache"),
    ("prefix-sentences-c1", "naive-none-c1", "+ sentences / naive"),
    ("prefix-llmlingua-c1", "prefix-none-c1", "LLMLingua (old) / prefix cache"),
    ("prefix-sentences-c4", "prefix-sentences-c1", "sentences C=4 / C=1"),
)


def quick_plan(results: Path) -> Section:
    folder = results / "quick"
    runs = {
        name: _load(folder / f"{name}.json")["records"]
        for name in QUICK_LABELS
        if (folder / f"{name}.json").exists()
    }
    section = Section(
        "benchmarks.md", "Ablations 1–3 (the quick plan)", "docs/results/quick/*.json"
    )
    return latency_section(
        section, runs, QUICK_LABELS, QUICK_COMPARISONS, "question", "question (same prompt)"
    )


SPEC_LABELS = {
    "no-spec-c1": "no speculation, C=1",
    "spec-c1": "n-gram k=4, C=1",
    "no-spec-c8": "no speculation, C=8",
    "spec-c8": "n-gram k=4, C=8",
}
SPEC_COMPARISONS = (
    ("spec-c1", "no-spec-c1", "n-gram / none, C=1"),
    ("spec-c8", "no-spec-c8", "n-gram / none, C=8"),
)


def ngram_speculation(results: Path) -> Section:
    folder = results / "spec"
    runs = {
        name: _load(folder / f"{name}.json")["records"]
        for name in SPEC_LABELS
        if (folder / f"{name}.json").exists()
    }
    section = Section(
        "benchmarks.md",
        "Speculative decoding at low and high load (n-gram)",
        "docs/results/spec/*.json",
    )
    return latency_section(section, runs, SPEC_LABELS, SPEC_COMPARISONS, "question", "question")


PREFIX_RUNS = ("off-1", "on-1", "on-2", "off-2")  # make bench-prefix's order
PREFIX_FILE = "squad-prefix-40q.json"


def question_ttfts(doc: Mapping[str, Any]) -> dict[str, float]:
    """TTFT per question id of a one-point quality run's answered questions."""
    return {
        r["question_id"]: r["ttft_ms"]
        for r in doc["results"]
        if r.get("error") is None and r.get("ttft_ms") is not None
    }


def prefix_cache(results: Path) -> Section:
    """The prefix cache off against on, four fresh services in ABBA order: each run's
    median TTFT, each repetition's paired ratio, and the ratio of the per-question means
    of the two runs a side (which cancels a linear drift)."""
    section = Section(
        "benchmarks.md",
        "The prefix cache, 40 SQuAD questions, services off/on/on/off",
        f"docs/results/prefix/*/{PREFIX_FILE}",
    )
    runs = {name: question_ttfts(_load(results / "prefix" / name / PREFIX_FILE))
            for name in PREFIX_RUNS}  # fmt: skip
    rows = [[name, str(len(t)), fmt_value(one_sample(t.values()), 0)] for name, t in runs.items()]
    section.lines += ["TTFT per run (median ms [95% CI]):", ""]
    section.lines += [*_table(["run", "n", "TTFT p50 ms"], rows), ""]
    shared = [q for q in runs["off-1"] if all(q in t for t in runs.values())]

    def mean_of(*names: str) -> dict[str, float]:
        return {q: sum(runs[n][q] for n in names) / len(names) for q in shared}

    ratios = {
        "on-1 / off-1": paired_ratio((runs["on-1"][q], runs["off-1"][q]) for q in shared),
        "on-2 / off-2": paired_ratio((runs["on-2"][q], runs["off-2"][q]) for q in shared),
    }
    on, off = mean_of("on-1", "on-2"), mean_of("off-1", "off-2")
    ratios["on / off (mean of two runs a side)"] = paired_ratio((on[q], off[q]) for q in shared)
    section.lines += ["Paired by question, median per-question TTFT ratio:", ""]
    section.lines += _table(
        ["ratio", "n", "TTFT on / off"],
        [[name, str(len(shared)), fmt_ratio(r)] for name, r in ratios.items()],
    )
    section.data = {
        "runs": {name: interval_dict(one_sample(t.values())) for name, t in runs.items()},
        "ratios": {name: interval_dict(r) for name, r in ratios.items()},
        "n": len(shared),
    }
    return section


def direct_comparison(results: Path) -> Section:
    doc = _load(results / "direct" / "direct.json")
    runs = {"pipeline": doc["pipeline"]["records"], "direct": doc["direct"]["records"]}
    labels = {"pipeline": "chain (old, bench.direct)", "direct": "vLLM alone"}
    section = Section(
        "benchmarks.md",
        "bench.overhead: the old comparison against vLLM (bench.direct)",
        "docs/results/direct/direct.json",
    )
    return latency_section(
        section,
        runs,
        labels,
        (("pipeline", "direct", "chain / vLLM alone"),),
        "index",
        "request (same prompt)",
    )


def batching(results: Path) -> Section:
    doc = _load(results / "batching" / "batching.json")
    runs: dict[str, list[Record]] = defaultdict(list)
    for record in doc["records"]:
        runs[f"{record['side']}-c{record['concurrency']}"].append(record)
    concurrencies = doc["config"]["concurrency"]
    labels = {
        f"{side}-c{c}": f"{side}, C={c}" for c in concurrencies for side in ("static", "continuous")
    }
    comparisons = [
        (f"continuous-c{c}", f"static-c{c}", f"continuous / static, C={c}") for c in concurrencies
    ]
    section = Section(
        "benchmarks.md",
        "Static batching against continuous batching",
        "docs/results/batching/batching.json",
    )
    section = latency_section(
        section, runs, labels, comparisons, "index", "prompt (same prompt and output length)"
    )
    section.lines += [
        "",
        "Latencies count from t=0 (all requests queued at once). Output tokens/s is one wall "
        "time per run: no interval.",
    ]
    return section


def llmlingua_speed(results: Path) -> Section:
    rows: list[dict[str, Any]] = _load(results / "llmlingua-speed" / "llmlingua-speed.json")
    return llmlingua_speed_section(rows)


BASELINE_VARIANT = "condition-compare"
SPEED_KNOBS = (
    ("one pass instead of two", "condition-compare", "one-pass"),
    (
        "chunk-sized segment against 200-token, one pass",
        "one-pass",
        "one-pass, chunk-sized segment",
    ),
    ("two torch threads", "one-pass, chunk-sized segment", "one-pass, chunk-sized, 2 threads"),
    (
        "bfloat16 against fp32 (same setting)",
        "one-pass, chunk-sized segment",
        "one-pass, chunk-sized, bfloat16",
    ),
    ("bfloat16 against condition-compare", "condition-compare", "one-pass, chunk-sized, bfloat16"),
    (
        "net: the default against the setting shipped before",
        "condition-compare",
        "one-pass, chunk-sized segment",
    ),
)


def llmlingua_speed_section(rows: Sequence[Mapping[str, Any]]) -> Section:
    """Per row: speed-up against condition-compare at the same length, ratio_ci of the median
    timings (independent repeats). Per knob: the same over ms per context token, every
    length the two variants share pooled."""
    section = Section(
        "benchmarks.md",
        "Making LLMLingua as cheap as it can be",
        "docs/results/llmlingua-speed/llmlingua-speed.json",
    )
    base = {r["context_tokens"]: r["times_ms"] for r in rows if r["variant"] == BASELINE_VARIANT}
    table = []
    data_rows = []
    for r in rows:
        times = r["times_ms"]
        speedup = independent_ratio(base.get(r["context_tokens"], []), times)
        table.append(
            [
                r["variant"],
                f"{r['context_tokens']:,}",
                str(len(times)),
                fmt_value(one_sample(times), 0, len(times)),
                fmt_ratio(speedup, len(times)),
            ]
        )
        data_rows.append(
            {
                "variant": r["variant"],
                "context_tokens": r["context_tokens"],
                "n": len(times),
                "speedup": interval_dict(speedup),
            }
        )
    section.lines += [
        "Speed-up against condition-compare at the same length (independent timings):",
        "",
    ]
    section.lines += _table(["variant", "context tokens", "n", "median ms", "speed-up"], table)
    knobs = []
    knob_table = []
    for label, before, after in SPEED_KNOBS:
        old = {r["context_tokens"]: r for r in rows if r["variant"] == before}
        new = {r["context_tokens"]: r for r in rows if r["variant"] == after}
        shared = sorted(set(old) & set(new))
        per_token_old = [t / n for n in shared for t in old[n]["times_ms"]]
        per_token_new = [t / n for n in shared for t in new[n]["times_ms"]]
        ratio = independent_ratio(per_token_old, per_token_new)
        n = min(len(per_token_old), len(per_token_new))
        knobs.append(
            {
                "knob": label,
                "before": before,
                "after": after,
                "lengths": shared,
                "n": n,
                "speedup": interval_dict(ratio),
            }
        )
        knob_table.append([label, ", ".join(f"{s:,}" for s in shared), str(n), fmt_ratio(ratio, n)])
    section.lines += [
        "",
        "Per knob, ms per context token, every shared length pooled (speed-up = before / after):",
        "",
    ]
    section.lines += _table(["knob", "lengths", "n a side", "speed-up"], knob_table)
    section.data = {"rows": data_rows, "knobs": knobs}
    return section


def llmlingua_paired(results: Path) -> Section:
    """bench.llmlingua_paired: the shipped LLMLingua setting against the one before it on
    the same retrieved contexts, the median per-question speed-up."""
    doc = _load(results / "llmlingua-paired" / "llmlingua-paired.json")
    section = Section(
        "benchmarks.md",
        "LLMLingua's setting against the one before, paired on SQuAD contexts",
        "docs/results/llmlingua-paired/llmlingua-paired.json",
    )
    timings = doc["timings"]
    old, new = SPEED_KNOBS[-1][1], SPEED_KNOBS[-1][2]
    ratio = paired_ratio((t["ms"][old], t["ms"][new]) for t in timings)
    section.lines += [
        f"Speed-up {old} / {new}, median per question: {fmt_ratio(ratio, len(timings))}"
    ]
    section.data = {"n": len(timings), "speedup": interval_dict(ratio)}
    return section


def context_sweep(results: Path, folder: str, title: str) -> Section:
    doc = _load(results / folder / "context.json")
    section = Section("benchmarks.md", title, f"docs/results/{folder}/context.json")
    return context_sweep_section(section, doc["records"])


def context_sweep_section(section: Section, records: Sequence[Mapping[str, Any]]) -> Section:
    """Per length: each policy's TTFT median and n, always / never and auto / the faster of
    the two (ratio_ci: every request asks its own question, so nothing pairs)."""
    measured = [r for r in records if r["request"]["phase"] == "measure" and r.get("ok")]
    by_cell: dict[tuple[int, str], list[float]] = defaultdict(list)
    for r in measured:
        by_cell[(r["request"]["length"], r["request"]["policy"])].append(float(r["ttft_ms"]))
    table = []
    data = []
    for length in sorted({length for length, _ in by_cell}):
        never, always, auto = (by_cell.get((length, p), []) for p in ("never", "always", "auto"))
        faster_name, faster = faster_policy({"never": never, "always": always})
        n = min(len(never), len(always), len(auto))
        always_never = independent_ratio(always, never)
        auto_faster = independent_ratio(auto, faster)
        table.append(
            [
                f"{length:,}",
                f"{len(never)} / {len(always)} / {len(auto)}",
                fmt_ratio(always_never, n),
                f"{faster_name}: {fmt_ratio(auto_faster, n)}",
            ]
        )
        data.append(
            {
                "length": length,
                "n": {"never": len(never), "always": len(always), "auto": len(auto)},
                "always_over_never": interval_dict(always_never),
                "faster_fixed": faster_name,
                "auto_over_faster": interval_dict(auto_faster),
            }
        )
    section.lines += ["TTFT ratios of medians, independent requests (measure phase):", ""]
    section.lines += _table(
        ["target length", "n never / always / auto", "always / never", "auto / faster fixed"], table
    )
    section.data = {"lengths": data}
    return section


def faster_policy(samples: Mapping[str, Sequence[float]]) -> tuple[str, Sequence[float]]:
    """The policy with the lowest median TTFT (the first on a tie; empty samples last)."""

    def key(policy: str) -> float:
        middle = median(samples[policy])
        return math.inf if middle is None else middle

    name = min(samples, key=key)
    return name, samples[name]


# --- docs/quality.md -------------------------------------------------------------------------

QUALITY_RUNS = (
    ("eval-full/squad-full-40q.json", "SmolLM2-135M as reader, 40 questions"),
    (
        "eval-qwen/squad-qwen-20q-qwen2.5-coder-0.5b-instruct.json",
        "Qwen2.5-Coder-0.5B as reader, 20 questions",
    ),
    ("eval-quick/squad-quick-25q.json", "The quick plan, 25 questions"),
    (
        "eval-qwen15/squad-reader-200q-qwen2.5-coder-1.5b-instruct.json",
        "Qwen2.5-Coder-1.5B as reader, short answers, top-5, 200 random questions",
    ),
    (
        "eval-qwen05/squad-reader-200q-qwen2.5-coder-0.5b-instruct.json",
        "Qwen2.5-Coder-0.5B as reader, short answers, top-5, the same 200 questions",
    ),
    (
        "eval-smollm2/squad-reader-200q-smollm2-135m-instruct.json",
        "SmolLM2-135M as reader, short answers, top-5, the same 200 questions",
    ),
)
# Two readers on the same questions: (stronger run, weaker run, title, sweep points).
READER_PAIRS = (
    (QUALITY_RUNS[1][0], QUALITY_RUNS[0][0], "Qwen2.5-Coder-0.5B against SmolLM2-135M",
     ("none k=3",)),
    (QUALITY_RUNS[3][0], QUALITY_RUNS[4][0], "Qwen2.5-Coder-1.5B against the 0.5B",
     ("none k=5", "sentences@0.5 k=5", "llmlingua@0.5 k=5")),
    (QUALITY_RUNS[4][0], QUALITY_RUNS[5][0],
     "Qwen2.5-Coder-0.5B against SmolLM2-135M, 200 questions,",
     ("none k=5", "sentences@0.5 k=5", "llmlingua@0.5 k=5")),
)  # fmt: skip
# Comparisons the prose makes beyond "each setting against none at the same k".
QUALITY_EXTRA = (
    ("none k=5", "none k=3"),
    ("sentences@0.5 k=5", "none k=3"),
    ("sentences+llmlingua@0.33 k=3", "sentences@0.33 k=3"),
    ("sentences+llmlingua@0.33 k=3", "llmlingua@0.33 k=3"),
)


def score(key: str) -> Metric:
    """A per-question result's `key` as a number (a yes/no as 1 or 0); None when unscored."""
    return lambda r: None if r.get(key) is None else float(r[key])


QUALITY_SCORES: dict[str, Metric] = {
    "EM": score("exact_match"),
    "F1": score("f1"),
    "contains gold": score("contains_gold"),
    "answer kept": score("answer_survived"),
    "recall@k": score("recall"),
}


def point_label(point: Mapping[str, Any]) -> str:
    """`sentences 0.5, k=3` for a sweep point."""
    method = {"llmlingua": "LLMLingua", "sentences+llmlingua": "sentences + LLMLingua"}.get(
        point["method"], point["method"]
    )
    rate = f" {point['rate']:g}" if point.get("rate") is not None else ""
    return f"{method}{rate}, k={point['top_k']}"


def quality_section(section: Section, doc: Mapping[str, Any]) -> Section:
    """Per sweep point: n answered, F1 / answer kept / recall@k means and the TTFT median with
    intervals. Then every point against `none` at its k (and QUALITY_EXTRA), paired by
    question: mean differences of the scores, median per-question TTFT ratio."""
    points = {p["name"]: p for p in doc["config"]["points"]}
    answered: dict[str, dict[str, Record]] = defaultdict(dict)
    for r in doc["results"]:
        if r.get("error") is None:
            answered[r["point"]][r["question_id"]] = r
    rows = []
    for name, point in points.items():
        mine = list(answered[name].values())
        row: dict[str, Any] = {"point": name, "label": point_label(point), "n": len(mine)}
        for score, value in QUALITY_SCORES.items():
            row[score] = one_sample([value(r) for r in mine], bootstrap.mean)
        row["TTFT"] = one_sample([r.get("ttft_ms") for r in mine])
        rows.append(row)
    section.lines += ["Per setting, mean [95% CI] (TTFT: median ms):", ""]
    section.lines += _table(
        ["setting", "n", *QUALITY_SCORES, "TTFT p50 ms"],
        [
            [r["label"], str(r["n"])]
            + [fmt_value(r[s], 3) for s in QUALITY_SCORES]
            + [fmt_value(r["TTFT"], 0)]
            for r in rows
        ],
    )
    wanted = [
        (name, f"none k={p['top_k']}")
        for name, p in points.items()
        if p["method"] != "none" and f"none k={p['top_k']}" in points
    ]
    wanted += [(a, b) for a, b in QUALITY_EXTRA if a in points and b in points]
    compared = []
    for a, b in wanted:
        shared = [q for q in answered[a] if q in answered[b]]
        left, right = answered[a], answered[b]
        row = {
            "a": a,
            "b": b,
            "label": f"{point_label(points[a])} − {point_label(points[b])}",
            "n": len(shared),
        }
        for score, value in QUALITY_SCORES.items():
            pairs = [(value(left[q]), value(right[q])) for q in shared]
            row[score] = paired_difference(pairs)
            row[f"{score}_verdict"] = difference_verdict(row[score])
            row[f"{score}_changes"] = changes(pairs)
        row["TTFT"] = paired_ratio(
            (left[q].get("ttft_ms"), right[q].get("ttft_ms")) for q in shared
        )
        row["TTFT_verdict"] = ratio_verdict(row["TTFT"])
        compared.append(row)
    section.lines += [
        "",
        "Paired by question: mean difference a − b; TTFT: median per-question ratio a / b:",
        "",
    ]
    section.lines += _table(
        ["a − b", "n", *QUALITY_SCORES, "TTFT a / b"],
        [
            [c["label"], str(c["n"])]
            + [fmt_changes(fmt_difference(c[s]), c[f"{s}_changes"]) for s in QUALITY_SCORES]
            + [fmt_ratio(c["TTFT"])]
            for c in compared
        ],
    )
    section.data = {
        "rows": [_jsonable(r) for r in rows],
        "comparisons": [_jsonable(c) for c in compared],
    }
    return section


def reader_comparison(
    section: Section, stronger: Mapping[str, Any], weaker: Mapping[str, Any], point: str
) -> Section:
    """The same sweep point read by two readers, paired by question (the questions both
    answered): mean F1 of each on those questions and the mean difference, kept under the
    point's name in `section.data`."""
    answered = [
        {
            r["question_id"]: r
            for r in doc["results"]
            if r["point"] == point and r.get("error") is None
        }
        for doc in (stronger, weaker)
    ]
    shared = [q for q in answered[0] if q in answered[1]]
    f1 = QUALITY_SCORES["F1"]
    means = [one_sample([f1(side[q]) for q in shared], bootstrap.mean) for side in answered]
    difference = paired_difference((f1(answered[0][q]), f1(answered[1][q])) for q in shared)
    section.lines += [f"F1 at `{point}` on the {len(shared)} questions both runs asked:", ""]
    section.lines += _table(
        ["n", "stronger reader", "weaker reader", "stronger − weaker"],
        [
            [
                str(len(shared)),
                fmt_value(means[0], 3),
                fmt_value(means[1], 3),
                fmt_difference(difference),
            ]
        ],
    )
    section.lines.append("")
    section.data[point] = {
        "n": len(shared),
        "stronger": interval_dict(means[0]),
        "weaker": interval_dict(means[1]),
        "difference": interval_dict(difference),
    }
    return section


def quality(results: Path, path: str, title: str) -> Section:
    section = Section("quality.md", title, f"docs/results/{path}")
    return quality_section(section, _load(results / path))


NOT_STORED = (
    "benchmarks.md, A stronger reader: `scripts.stage_costs` printed medians of n = 5 "
    "requests per compression; the per-request results were not stored, so no interval.",
    "quality.md, Hybrid retrieval: `docs/results/retrieval-modes/squad-dev.json` holds "
    "aggregates only; hybrid − BM25 alone has no per-question results to resample, so no "
    "interval (the intervals against dense were computed during the run).",
    "Throughput figures (req/s, output tokens/s) are one wall time per run: no interval.",
)


# --- the command -----------------------------------------------------------------------------


def all_sections(results: Path) -> list[Section]:
    """Every section whose raw results are present under `results`, in the docs' order."""
    makers: list[tuple[tuple[str, ...], Callable[[], Section]]] = [
        (("quick/prefix-none-c1.json",), partial(quick_plan, results)),
        (("llmlingua-speed/llmlingua-speed.json",), partial(llmlingua_speed, results)),
        (("llmlingua-paired/llmlingua-paired.json",), partial(llmlingua_paired, results)),
        (
            ("context-smollm2/context.json",),
            partial(context_sweep, results, "context-smollm2", "The context sweep, SmolLM2"),
        ),
        (
            ("context-qwen/context.json",),
            partial(context_sweep, results, "context-qwen", "The context sweep, Qwen2.5-0.5B"),
        ),
        (("direct/direct.json",), partial(direct_comparison, results)),
        (("batching/batching.json",), partial(batching, results)),
        (("spec/spec-c1.json",), partial(ngram_speculation, results)),
        (
            tuple(f"prefix/{name}/{PREFIX_FILE}" for name in PREFIX_RUNS),
            partial(prefix_cache, results),
        ),
    ]
    makers += [((path,), partial(quality, results, path, title)) for path, title in QUALITY_RUNS]
    makers += [
        (
            (stronger, weaker),
            partial(reader_comparison_of, results, stronger, weaker, title, points),
        )
        for stronger, weaker, title, points in READER_PAIRS
    ]
    return [make() for paths, make in makers if all((results / p).exists() for p in paths)]


def reader_comparison_of(
    results: Path, stronger: str, weaker: str, title: str, points: Sequence[str]
) -> Section:
    section = Section(
        "quality.md", f"{title} as reader", f"docs/results/{stronger}, docs/results/{weaker}"
    )
    docs = _load(results / stronger), _load(results / weaker)
    for point in points:
        reader_comparison(section, *docs, point)
    return section


def render(sections: Sequence[Section]) -> str:
    lines = [
        f"# n and 95% bootstrap intervals (`{COMMAND}`)",
        "",
        "bench.bootstrap, 2,000 resamples, seed 0. An interval holding 1 (a ratio) or 0 (a "
        f'difference) is "{NO_DIFFERENCE}".',
        "",
    ]
    body = "\n".join(s.markdown() for s in sections)
    tail = ["", "## Not stored", ""] + [f"- {note}" for note in NOT_STORED]
    return "\n".join(lines) + "\n" + body + "\n".join(tail) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path("docs/results"))
    parser.add_argument("--out", type=Path, default=None, help="also write intervals.{md,json}")
    args = parser.parse_args(argv)
    sections = all_sections(args.results)
    text = render(sections)
    print(text, end="")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "intervals.md").write_text(text, encoding="utf-8")
        document = {
            "command": COMMAND,
            "seed": SEED,
            "sections": [
                {"doc": s.doc, "title": s.title, "source": s.source, **s.data} for s in sections
            ],
            "not_stored": list(NOT_STORED),
        }
        (args.out / "intervals.json").write_text(json.dumps(document, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
