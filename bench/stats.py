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

Percentiles are numpy's default ("linear"), linear interpolation between closest ranks:
for sorted values v[0..n-1] and q in [0, 100], h = (n - 1) * q / 100 and the result is
v[floor(h)] + (h - floor(h)) * (v[floor(h) + 1] - v[floor(h)]). The median is the 50th.

This module is the benchmarks' one place for such figures: percentiles, medians and means of
measured values, per-second rates and the number format of the latency tables. Confidence
intervals are bench.bootstrap's.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from bench.loadgen import STAGE_NAMES, RequestRecord

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
    """Time per output token, (E2E - TTFT) / (output_tokens - 1); None below 2 tokens."""
    if output_tokens < 2:
        return None
    return (e2e_ms - ttft_ms) / (output_tokens - 1)


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
    ends = [r.end_at_ms for r in sent if r.end_at_ms is not None]
    starts = [r.send_at_ms for r in sent if r.send_at_ms is not None]
    duration_s = (max(ends) - min(starts)) / 1000 if ends and starts else 0.0
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
        duration_s=duration_s,
        requests_per_s=per_s(len(good), duration_s),
        output_tokens=output_tokens,
        output_tokens_per_s=per_s(output_tokens, duration_s),
        slo_ttft_ms=slo_ttft_ms,
        slo_tpot_ms=slo_tpot_ms,
        met_slos=met,
        goodput_requests_per_s=per_s(met, duration_s),
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


def markdown_table(summary: Summary) -> str:
    """The summary as Markdown: a line of counts and rates, then one row per latency."""
    s = summary
    slo = f"TTFT <= {format_ms(s.slo_ttft_ms)} ms, TPOT <= {format_ms(s.slo_tpot_ms)} ms"
    errors = ", ".join(f"{kind} {count}" for kind, count in sorted(s.errors.items())) or "none"
    lines = [
        f"{s.succeeded}/{s.requests} succeeded ({s.failed} failed, {s.not_sent} not sent; "
        f"errors: {errors}) in {s.duration_s:.2f} s: {s.requests_per_s:.3f} req/s, "
        f"{s.output_tokens_per_s:.1f} output tokens/s, goodput {s.goodput_requests_per_s:.3f} "
        f"req/s ({s.met_slos} met {slo})",
        "",
        "| metric (ms) | n | mean | p50 | p90 | p99 | max |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    rows: list[tuple[str, Distribution | None]] = [
        ("TTFT", s.ttft_ms),
        ("TPOT", s.tpot_ms),
        ("ITL", s.itl_ms),
        ("E2E", s.e2e_ms),
    ]
    rows += [(f"server {name}", dist) for name, dist in s.server_ms.items()]
    for name, dist in rows:
        if dist is None:
            lines.append(f"| {name} | 0 | - | - | - | - | - |")
            continue
        cells = (dist.mean, dist.p50, dist.p90, dist.p99, dist.max)
        lines.append(f"| {name} | {dist.n} | " + " | ".join(format_ms(v) for v in cells) + " |")
    return "\n".join(lines)
