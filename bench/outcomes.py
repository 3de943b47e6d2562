"""What happened to each request of a load run, in the four kinds a reliability claim needs.

- succeeded: a complete answer.
- refused: cleanly refused before any answer: 429 or 503 *with* Retry-After, in the error
  shape; or, once streaming, a final error event whose code says a stage was unavailable
  (`interrupted`, counted apart).
- failed: anything else: a 5xx other than those, a 503 without Retry-After, a broken or
  incomplete stream, a transport error.
- hung: no complete response within the client's timeout.

Plus the figures the chaos runs report: time to reject, admitted E2E percentiles, and a
poller that watches /readyz while the load runs.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx

from bench.client import READY_PATH, ready_replicas
from bench.loadgen import RequestRecord
from bench.stats import percentile_or_none

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


# The q-th percentile (0-100), None for no values: bench.stats's, under the name callers use.
percentile = percentile_or_none


def reject_ms(records: Sequence[RequestRecord]) -> list[float]:
    """Time from send to the refusal, for every cleanly refused request."""
    return [r.e2e_ms for r in records if outcome(r) == "refused" and r.e2e_ms is not None]


def admitted_e2e_ms(records: Sequence[RequestRecord]) -> list[float]:
    return [r.e2e_ms for r in records if r.ok and r.e2e_ms is not None]


def answered_per_s(records: Sequence[RequestRecord]) -> float | None:
    """Complete answers per second, over the span from the first send to the last end."""
    sent = [r for r in records if r.send_at_ms is not None]
    if not sent:
        return None
    span_s = (max(r.end_at_ms or 0 for r in sent) - min(r.send_at_ms or 0 for r in sent)) / 1000
    return sum(r.ok for r in records) / span_s if span_s else None


def failures(records: Sequence[RequestRecord], limit: int = 5) -> list[str]:
    """A few failed or hung requests, described for a report or an assertion message."""
    bad = [r for r in records if outcome(r) in ("failed", "hung")]
    return [f"#{r.index} {r.status} {r.error_kind} {r.error}" for r in bad[:limit]]


@dataclass
class ReadinessLog:
    """(seconds since start, HTTP status, replicas per stage) of each /readyz poll."""

    samples: list[tuple[float, int | None, dict[str, int]]] = field(default_factory=list)

    def ready_share(self) -> float | None:
        if not self.samples:
            return None
        return sum(status == 200 for _, status, _ in self.samples) / len(self.samples)

    def first_time(self, predicate, after_s: float = 0.0) -> float | None:
        """When (s) a sample at or after `after_s` first satisfied `predicate(status, replicas)`."""
        for at_s, status, replicas in self.samples:
            if at_s >= after_s and predicate(status, replicas):
                return at_s
        return None


async def watch_readiness(
    base_url: str, log: ReadinessLog, interval_s: float = 0.5, started: float | None = None
) -> None:
    """Poll /readyz until cancelled, appending to `log` (a failed poll records None)."""
    start = time.perf_counter() if started is None else started
    async with httpx.AsyncClient(base_url=base_url, timeout=5, trust_env=False) as client:
        while True:
            try:
                response = await client.get(READY_PATH)
                status, replicas = response.status_code, ready_replicas(response)
            except (httpx.HTTPError, ValueError):
                status, replicas = None, {}
            log.samples.append((time.perf_counter() - start, status, replicas))
            await asyncio.sleep(interval_s)
