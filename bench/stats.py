"""Latency statistics over load-generator records, with `vllm bench serve`'s definitions.

- TTFT: send -> first non-empty content delta, per successful request.
- TPOT per request: (E2E - TTFT) / (output_tokens - 1); undefined (None) below 2 tokens.
- ITL: every gap between consecutive content deltas, pooled over successful requests. One
  delta may carry several tokens, so ITL and TPOT differ when the server batches pieces.
- E2E: send -> `data: [DONE]` (the end of the stream).
- Throughput: successful requests and their output tokens over the run's duration, from the
  first send to the last request's end (failures included, since they held the run open).
- Goodput: successful requests per second that met both SLOs. A request with no TPOT
  (fewer than 2 tokens) cannot miss the TPOT SLO, so only its TTFT is judged.

Outcomes of a reliability run (bench.chaos), one per request (`outcome`): succeeded;
refused, cleanly before any answer (429 or 503 *with* Retry-After, in the error shape) or,
once streaming, `interrupted` by a final error event whose code says a stage was
unavailable; failed (anything else: a 5xx other than those, a 503 without Retry-After, a
broken or incomplete stream, a transport error); hung (no complete response within the
client's timeout).

Percentiles are numpy's default ("linear"), linear interpolation between closest ranks:
for sorted values v[0..n-1] and q in [0, 100], h = (n - 1) * q / 100 and the result is
v[floor(h)] + (h - floor(h)) * (v[floor(h) + 1] - v[floor(h)]). The median is the 50th.

This module is the lab's one place for such figures: percentiles, medians and means of
measured values, per-second rates, the number format of the latency tables, and the 95%
confidence intervals every comparison is reported with:

- `ratio_ci(a, b, stat)`: stat(a) / stat(b) for two independent samples (each resampled on
  its own); `independent_ratio` is the same on raw values (None left out).
- `paired_ci(a, b, stat)`: stat(a - b) for paired samples (the same prompts on both sides,
  resampled together); `paired_difference` on raw pairs, `paired_ratio` the median per-pair
  ratio a / b (bootstrapped on the logarithms), `one_sample` a statistic of one sample.

Percentile intervals over 2,000 draws from numpy's generator with seed 0, so a rerun on the
same records reports the same numbers. A difference whose interval holds 0 (a ratio whose
interval holds 1) is reported as "no detectable difference", never as a gain. TPOT is the
product's own definition (`pipeline.rag.tpot_ms`), so the lab and the service's
`timings.tpot_ms` cannot drift apart.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from bench import tables
from bench.loadgen import STAGE_NAMES, RequestRecord
from pipeline.rag import tpot_ms as product_tpot_ms

PERCENTILES = (50.0, 90.0, 99.0)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) of `values` by linear interpolation; ValueError when empty
    or q is out of range."""
    if not len(values):
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    return float(np.percentile(np.asarray(values, dtype=float), q))


def percentile_or_none(values: Sequence[float], q: float) -> float | None:
    """`percentile`, or None when there are no values."""
    return percentile(values, q) if len(values) else None


def median(values: Iterable[float | None]) -> float | None:
    """The median (50th percentile) of the values that are not None; None when none are."""
    return percentile_or_none(_present(values), 50)


def mean(values: Iterable[float | None]) -> float | None:
    """The arithmetic mean of the values that are not None; None when none are."""
    present = _present(values)
    return math.fsum(present) / len(present) if present else None


def per_s(count: float, duration_s: float) -> float:
    """`count` per second of `duration_s`; 0 for a run of no duration."""
    return count / duration_s if duration_s > 0 else 0.0


def tpot(ttft_ms: float, e2e_ms: float, output_tokens: int) -> float | None:
    """Time per output token, (E2E - TTFT) / (output_tokens - 1); None below 2 tokens: the
    service's own definition, applied to client-side times."""
    return product_tpot_ms(e2e_ms, ttft_ms, output_tokens)


def format_ms(value: float | None) -> str:
    """A latency for a table: one decimal below 100, none from 100; "-" for None."""
    if value is None:
        return "-"
    return f"{value:,.1f}" if abs(value) < 100 else f"{value:,.0f}"


def _present(values: Iterable[float | None]) -> list[float]:
    return [float(value) for value in values if value is not None]


@dataclass(frozen=True)
class Distribution:
    """Count, mean, p50/p90/p99 and max of one latency, in ms."""

    n: int
    mean: float
    p50: float
    p90: float
    p99: float
    max: float


def distribution(values: Iterable[float]) -> Distribution | None:
    """The distribution of `values`, or None when there are none."""
    data = list(values)
    if not data:
        return None
    p50, p90, p99 = (percentile(data, q) for q in PERCENTILES)
    return Distribution(len(data), math.fsum(data) / len(data), p50, p90, p99, max(data))


def tpot_ms(record: RequestRecord) -> float | None:
    """(E2E - TTFT) / (output_tokens - 1) for a successful request with at least 2 output
    tokens, else None."""
    if not record.ok or record.ttft_ms is None or record.e2e_ms is None:
        return None
    return tpot(record.ttft_ms, record.e2e_ms, record.output_tokens)


def meets_slos(record: RequestRecord, slo_ttft_ms: float | None, slo_tpot_ms: float | None) -> bool:
    """True when a successful request's TTFT and TPOT are within the SLOs (None: no limit)."""
    if not record.ok or record.ttft_ms is None:
        return False
    if slo_ttft_ms is not None and record.ttft_ms > slo_ttft_ms:
        return False
    tpot = tpot_ms(record)
    return slo_tpot_ms is None or tpot is None or tpot <= slo_tpot_ms


@dataclass(frozen=True)
class Summary:
    """What a load run measured. Rates are per second of `duration_s`; distributions in ms."""

    requests: int
    sent: int
    succeeded: int
    failed: int
    not_sent: int
    errors: dict[str, int]
    duration_s: float
    requests_per_s: float
    output_tokens: int
    output_tokens_per_s: float
    slo_ttft_ms: float | None
    slo_tpot_ms: float | None
    met_slos: int
    goodput_requests_per_s: float
    ttft_ms: Distribution | None
    tpot_ms: Distribution | None
    itl_ms: Distribution | None
    e2e_ms: Distribution | None
    server_ms: dict[str, Distribution | None]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def duration_s(records: Sequence[RequestRecord]) -> float:
    """From the first send to the last end of the sent requests, in s (0 for none)."""
    sent = [r for r in records if r.send_at_ms is not None]
    ends = [r.end_at_ms for r in sent if r.end_at_ms is not None]
    starts = [r.send_at_ms for r in sent if r.send_at_ms is not None]
    return (max(ends) - min(starts)) / 1000 if ends and starts else 0.0


def summarize(
    records: Sequence[RequestRecord],
    *,
    slo_ttft_ms: float | None = None,
    slo_tpot_ms: float | None = None,
) -> Summary:
    """Counts, throughput, goodput and latency distributions of one run's records.

    `server_ms` holds the server's own stage timings (retrieve, compress, ttft, total) and
    its tpot, from successful requests that reported them."""
    sent = [r for r in records if r.send_at_ms is not None]
    good = [r for r in records if r.ok]
    run_s = duration_s(records)
    output_tokens = sum(r.output_tokens for r in good)
    met = sum(meets_slos(r, slo_ttft_ms, slo_tpot_ms) for r in good)
    server: dict[str, Distribution | None] = {
        stage: distribution(
            r.server_timings_ms[stage]
            for r in good
            if r.server_timings_ms and r.server_timings_ms.get(stage) is not None
        )
        for stage in STAGE_NAMES
    }
    server["tpot"] = distribution(r.server_tpot_ms for r in good if r.server_tpot_ms is not None)
    return Summary(
        requests=len(records),
        sent=len(sent),
        succeeded=len(good),
        failed=len(sent) - len(good),
        not_sent=len(records) - len(sent),
        errors=dict(Counter(r.error_kind for r in records if r.error_kind)),
        duration_s=run_s,
        requests_per_s=per_s(len(good), run_s),
        output_tokens=output_tokens,
        output_tokens_per_s=per_s(output_tokens, run_s),
        slo_ttft_ms=slo_ttft_ms,
        slo_tpot_ms=slo_tpot_ms,
        met_slos=met,
        goodput_requests_per_s=per_s(met, run_s),
        ttft_ms=distribution(r.ttft_ms for r in good if r.ttft_ms is not None),
        tpot_ms=distribution(t for r in good if (t := tpot_ms(r)) is not None),
        itl_ms=distribution(gap for r in good for gap in r.itl_ms),
        e2e_ms=distribution(r.e2e_ms for r in good if r.e2e_ms is not None),
        server_ms=server,
    )


def advisor_figures(summary: Summary) -> dict[str, float]:
    """{ttft_ms: p50, tpot_ms: p50, output_tokens_per_s} for `python -m advisor --bench-result`;
    keys without a positive figure are left out, since the advisor refuses them."""
    figures = {
        "ttft_ms": summary.ttft_ms.p50 if summary.ttft_ms else None,
        "tpot_ms": summary.tpot_ms.p50 if summary.tpot_ms else None,
        "output_tokens_per_s": summary.output_tokens_per_s,
    }
    return {key: value for key, value in figures.items() if value is not None and value > 0}


def summary_markdown(summary: Summary) -> str:
    """The summary as Markdown: a line of counts and rates, then one row per latency."""
    s = summary
    slo = f"TTFT <= {format_ms(s.slo_ttft_ms)} ms, TPOT <= {format_ms(s.slo_tpot_ms)} ms"
    errors = ", ".join(f"{kind} {count}" for kind, count in sorted(s.errors.items())) or "none"
    latencies: list[tuple[str, Distribution | None]] = [
        ("TTFT", s.ttft_ms),
        ("TPOT", s.tpot_ms),
        ("ITL", s.itl_ms),
        ("E2E", s.e2e_ms),
        *((f"server {name}", dist) for name, dist in s.server_ms.items()),
    ]
    rows = [
        [name, 0, "-", "-", "-", "-", "-"]
        if dist is None
        else [name, dist.n, *map(format_ms, (dist.mean, dist.p50, dist.p90, dist.p99, dist.max))]
        for name, dist in latencies
    ]
    header = ["metric (ms)", "n", "mean", "p50", "p90", "p99", "max"]
    return "\n".join(
        [
            f"{s.succeeded}/{s.requests} succeeded ({s.failed} failed, {s.not_sent} not sent; "
            f"errors: {errors}) in {s.duration_s:.2f} s: {s.requests_per_s:.3f} req/s, "
            f"{s.output_tokens_per_s:.1f} output tokens/s, goodput "
            f"{s.goodput_requests_per_s:.3f} req/s ({s.met_slos} met {slo})",
            "",
            tables.markdown_table(header, rows, numeric=range(1, 7)),
        ]
    )


# --- outcomes of a reliability run ----------------------------------------------------------

REFUSAL_STATUSES = (429, 503)
# Error codes of a stream cut short because a stage went away (pipeline.rag._interrupted,
# and a vLLM engine found dead mid-answer).
INTERRUPTION_SUFFIXES = ("_unavailable", "_overloaded", "engine_dead")


def outcome(record: RequestRecord) -> str:
    """succeeded | refused | interrupted | failed | hung | not_sent."""
    if record.ok:
        return "succeeded"
    if record.error_kind == "not_sent":
        return "not_sent"
    if record.error_kind == "timeout":
        return "hung"
    if record.status in REFUSAL_STATUSES and record.retry_after and record.error_code:
        return "refused"
    if record.error_kind == "stream_error" and (record.error_code or "").endswith(
        INTERRUPTION_SUFFIXES
    ):
        return "interrupted"
    return "failed"


def counts(records: Sequence[RequestRecord]) -> dict[str, int]:
    tally = Counter(outcome(record) for record in records)
    kinds = ("succeeded", "refused", "interrupted", "failed", "hung", "not_sent")
    return {"sent": sum(r.send_at_ms is not None for r in records)} | {
        kind: tally.get(kind, 0) for kind in kinds
    }


def reject_ms(records: Sequence[RequestRecord]) -> list[float]:
    """Time from send to the refusal, for every cleanly refused request."""
    return [r.e2e_ms for r in records if outcome(r) == "refused" and r.e2e_ms is not None]


def admitted_e2e_ms(records: Sequence[RequestRecord]) -> list[float]:
    return [r.e2e_ms for r in records if r.ok and r.e2e_ms is not None]


def answered_per_s(records: Sequence[RequestRecord]) -> float | None:
    """Complete answers per second, over the span from the first send to the last end."""
    span_s = duration_s(records)
    return sum(r.ok for r in records) / span_s if span_s else None


def failures(records: Sequence[RequestRecord], limit: int = 5) -> list[str]:
    """A few failed or hung requests, described for a report or an assertion message."""
    bad = [r for r in records if outcome(r) in ("failed", "hung")]
    return [f"#{r.index} {r.status} {r.error_kind} {r.error}" for r in bad[:limit]]


# --- 95% intervals -----------------------------------------------------------------------------

Statistic = Callable[[np.ndarray], float]

NO_DIFFERENCE = "no detectable difference"
SEED = 0


def sample_median(values: np.ndarray) -> float:
    """The median of a resample (a bootstrap statistic: no None, never empty)."""
    return float(np.median(values))


def sample_mean(values: np.ndarray) -> float:
    """The mean of a resample (a bootstrap statistic; of 0/1 values, a proportion)."""
    return float(np.mean(values))


def quantile(q: float) -> Statistic:
    """The q-th percentile (0-100) as a statistic."""

    def statistic(values: np.ndarray) -> float:
        return float(np.percentile(values, q))

    statistic.__name__ = f"p{q:g}"
    return statistic


@dataclass(frozen=True)
class Interval:
    estimate: float
    low: float
    high: float
    n: int

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def text(self, digits: int = 2, unit: str = "") -> str:
        fmt = f"{{:.{digits}f}}"
        return (
            f"{fmt.format(self.estimate)}{unit} [{fmt.format(self.low)}, {fmt.format(self.high)}]"
        )


def ratio_ci(
    a: Sequence[float],
    b: Sequence[float],
    stat: Statistic = sample_median,
    resamples: int = 2000,
    seed: int = SEED,
) -> Interval:
    """stat(a) / stat(b) with a 95% interval; n is the smaller sample."""
    first, second = _array(a), _array(b)
    rng = np.random.default_rng(seed)
    draws = np.empty(resamples)
    for i in range(resamples):
        top = stat(rng.choice(first, first.size))
        bottom = stat(rng.choice(second, second.size))
        draws[i] = top / bottom if bottom else np.nan
    low, high = np.nanpercentile(draws, [2.5, 97.5])
    bottom = stat(second)
    estimate = stat(first) / bottom if bottom else float("nan")
    return Interval(estimate, float(low), float(high), min(first.size, second.size))


def paired_ci(
    a: Sequence[float],
    b: Sequence[float],
    stat: Statistic = sample_median,
    resamples: int = 2000,
    seed: int = SEED,
) -> Interval:
    """stat of the per-pair differences a[i] - b[i], with a 95% interval."""
    first, second = _array(a), _array(b)
    if first.size != second.size:
        raise ValueError("paired samples must have the same length")
    differences = first - second
    rng = np.random.default_rng(seed)
    draws = np.array([stat(rng.choice(differences, differences.size)) for _ in range(resamples)])
    low, high = np.percentile(draws, [2.5, 97.5])
    return Interval(stat(differences), float(low), float(high), differences.size)


def _array(values: Sequence[float]) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    if array.size == 0:
        raise ValueError("a bootstrap needs at least one value on each side")
    return array


def _finite(values: Iterable[float | None]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def one_sample(values: Iterable[float | None], stat: Statistic = sample_median) -> Interval | None:
    """stat(values) with its 95% interval (paired_ci against zeros resamples the values
    themselves); None with fewer than 2 values: one value says nothing of its spread."""
    data = _finite(values)
    if len(data) < 2:
        return None
    return paired_ci(data, [0.0] * len(data), stat=stat)


def clustered_share(groups: Sequence[Sequence[float]]) -> Interval | None:
    """The share of 1s over every value of `groups` (such as the sentences of each answer),
    with a 95% interval that resamples whole groups, since the values of one group are not
    independent; n counts the values. None with fewer than 2 non-empty groups."""
    kept = [_array(group) for group in groups if len(group)]
    if len(kept) < 2:
        return None
    sums = np.array([group.sum() for group in kept])
    sizes = np.array([group.size for group in kept])
    rng = np.random.default_rng(SEED)
    draws = []
    for _ in range(2000):
        chosen = rng.integers(0, len(kept), len(kept))
        draws.append(sums[chosen].sum() / sizes[chosen].sum())
    low, high = np.percentile(draws, [2.5, 97.5])
    return Interval(float(sums.sum() / sizes.sum()), float(low), float(high), int(sizes.sum()))


def paired_ratio(pairs: Iterable[tuple[float | None, float | None]]) -> Interval | None:
    """The median per-pair ratio a / b with its 95% interval (bootstrap on the logs); pairs
    with a side missing or not positive are left out; None with fewer than 2 pairs."""
    kept = [(a, b) for a, b in pairs if a is not None and b is not None and a > 0 and b > 0]
    if len(kept) < 2:
        return None
    logs = paired_ci([math.log(a) for a, _ in kept], [math.log(b) for _, b in kept])
    return Interval(math.exp(logs.estimate), math.exp(logs.low), math.exp(logs.high), logs.n)


def independent_ratio(
    a: Iterable[float | None], b: Iterable[float | None], stat: Statistic = sample_median
) -> Interval | None:
    """stat(a) / stat(b) for independent samples with its 95% interval; None when a side
    has fewer than 2 values."""
    first, second = _finite(a), _finite(b)
    if len(first) < 2 or len(second) < 2:
        return None
    return ratio_ci(first, second, stat=stat)


def paired_difference(
    pairs: Iterable[tuple[float | None, float | None]], stat: Statistic = sample_mean
) -> Interval | None:
    """stat of the per-pair differences a - b with its 95% interval; None below 2 pairs."""
    kept = [(a, b) for a, b in pairs if a is not None and b is not None]
    if len(kept) < 2:
        return None
    return paired_ci([a for a, _ in kept], [b for _, b in kept], stat=stat)


def difference_verdict(interval: Interval | None) -> str:
    """ "higher" or "lower" when a difference's interval excludes 0, else NO_DIFFERENCE
    (also when there was nothing to compare)."""
    if interval is None or interval.contains(0.0):
        return NO_DIFFERENCE
    return "lower" if interval.high < 0.0 else "higher"


def fmt_ratio(interval: Interval | None, n: int | None = None) -> str:
    """`0.80x [0.74, 0.86]`, and ": no detectable difference" when the interval holds 1."""
    if interval is None:
        return f"n = {n}: no interval" if n is not None else "no interval"
    text = f"{interval.estimate:.2f}x [{interval.low:.2f}, {interval.high:.2f}]"
    return text + (f": {NO_DIFFERENCE}" if interval.contains(1.0) else "")


def fmt_difference(interval: Interval | None) -> str:
    """`-0.047 [-0.084, -0.011]`, and " (no detectable difference)" when the interval holds
    0; "-" for none."""
    if interval is None:
        return "-"
    text = f"{interval.estimate:+.3f} [{interval.low:+.3f}, {interval.high:+.3f}]"
    return text + (f" ({NO_DIFFERENCE})" if interval.contains(0.0) else "")


def fmt_interval(interval: Interval | None, digits: int = 3) -> str:
    """`0.800 [0.700, 0.880] (n=120)`, or "-" for none."""
    return "-" if interval is None else f"{interval.text(digits)} (n={interval.n})"


def interval_dict(interval: Interval | None) -> dict[str, float] | None:
    """An interval as JSON-ready data (None stays None)."""
    return None if interval is None else asdict(interval)
