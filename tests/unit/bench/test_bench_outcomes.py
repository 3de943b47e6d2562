"""bench.stats' outcomes: each load-generator record sorted into succeeded, refused,
interrupted, failed, hung or not sent; the figures taken from them; and bench.chaos's /readyz
poller, against a tiny HTTP server started here."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from bench import stats as outcomes
from bench.chaos import ReadinessLog, watch_readiness
from bench.loadgen import RequestRecord


def rec(index: int = 0, **fields) -> RequestRecord:
    """A sent record (send at index * 10 ms) with the given fields."""
    fields.setdefault("send_at_ms", index * 10.0)
    return RequestRecord(index, "rag", f"q{index}", **fields)


def ok(index: int = 0, e2e_ms: float = 100.0) -> RequestRecord:
    return rec(index, ok=True, status=200, e2e_ms=e2e_ms)


def http_error(index: int, status: int, *, retry_after=None, code=None, e2e_ms=5.0):
    return rec(
        index, status=status, error_kind=f"http_{status}", error="refused", error_code=code,
        retry_after=retry_after, e2e_ms=e2e_ms,
    )  # fmt: skip


def stream_error(code: str | None) -> RequestRecord:
    """A final error event after the stream began."""
    return rec(status=200, error_kind="stream_error", error="stopped", error_code=code)


# --- outcome ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        (ok(), "succeeded"),
        (http_error(0, 429, retry_after="1", code="rate_limited"), "refused"),
        (http_error(0, 503, retry_after="5", code="overloaded"), "refused"),
        # Refusals must say when to retry and be in the error shape.
        (http_error(0, 503, code="overloaded"), "failed"),
        (http_error(0, 503), "failed"),
        (http_error(0, 429, retry_after="1"), "failed"),
        (http_error(0, 429, code="rate_limited"), "failed"),
        # Other statuses never count as a refusal, Retry-After or not.
        (http_error(0, 500, retry_after="1", code="internal_error"), "failed"),
        (http_error(0, 502, retry_after="1", code="bad_gateway"), "failed"),
        # A stream cut short by a stage going away.
        (stream_error("generator_unavailable"), "interrupted"),
        (stream_error("retriever_overloaded"), "interrupted"),
        (stream_error("engine_dead"), "interrupted"),  # the vLLM engine died mid-answer
        (stream_error("internal_error"), "failed"),
        (stream_error(None), "failed"),
        (stream_error("unavailable_stage"), "failed"),
        # An HTTP 503 whose code says unavailable is not a stream interruption.
        (http_error(0, 503, code="generator_unavailable"), "failed"),
        (http_error(0, 500, code="engine_dead"), "failed"),
        (rec(status=200, error_kind="incomplete"), "failed"),
        (rec(error_kind="transport"), "failed"),
        (rec(error_kind="protocol", status=200), "failed"),
        (rec(status=200, error_kind="timeout"), "hung"),
        (rec(error_kind="timeout"), "hung"),
        (RequestRecord(0, "rag", "q", error_kind="not_sent"), "not_sent"),
    ],
)  # fmt: skip
def test_outcome_classification(record, expected):
    assert outcomes.outcome(record) == expected


def mixed() -> list[RequestRecord]:
    return [
        ok(0, 120.0),
        ok(1, 80.0),
        http_error(2, 503, retry_after="1", code="overloaded", e2e_ms=4.0),
        http_error(3, 429, retry_after="2", code="rate_limited", e2e_ms=8.0),
        http_error(4, 503, e2e_ms=30.0),  # no Retry-After: failed
        rec(5, status=200, error_kind="stream_error", error_code="compressor_unavailable"),
        rec(6, status=200, error_kind="timeout", error="no complete response", e2e_ms=9.0),
        RequestRecord(7, "rag", "q7", error_kind="not_sent", error="deadline"),
        rec(8, ok=True, status=200, e2e_ms=None),  # succeeded, but no timing
    ]


def test_counts_tallies_every_kind_and_the_sent():
    assert outcomes.counts(mixed()) == {
        "sent": 8,
        "succeeded": 3,
        "refused": 2,
        "interrupted": 1,
        "failed": 1,
        "hung": 1,
        "not_sent": 1,
    }


def test_counts_of_nothing_are_zeros_with_every_key():
    assert outcomes.counts([]) == dict.fromkeys(
        ("sent", "succeeded", "refused", "interrupted", "failed", "hung", "not_sent"), 0
    )


def test_reject_ms_are_the_clean_refusals_only():
    assert outcomes.reject_ms(mixed()) == [4.0, 8.0]


def test_admitted_e2e_are_the_successes_with_a_time():
    assert outcomes.admitted_e2e_ms(mixed()) == [120.0, 80.0]


def test_failures_describe_the_failed_and_hung_in_order():
    assert outcomes.failures(mixed()) == [
        "#4 503 http_503 refused",
        "#6 200 timeout no complete response",
    ]


def test_failures_are_capped_at_the_limit():
    records = [rec(i, status=500, error_kind="http_500", error=f"e{i}") for i in range(8)]
    assert outcomes.failures(records) == [f"#{i} 500 http_500 e{i}" for i in range(5)]
    assert outcomes.failures(records, limit=2) == ["#0 500 http_500 e0", "#1 500 http_500 e1"]
    assert outcomes.failures([ok(0), http_error(1, 429, retry_after="1", code="x")]) == []


# --- ReadinessLog -------------------------------------------------------------------------


def test_ready_share_is_the_share_of_200_polls():
    assert ReadinessLog().ready_share() is None
    log = ReadinessLog([(0.0, 200, {}), (0.5, 503, {}), (1.0, None, {}), (1.5, 200, {})])
    assert log.ready_share() == 0.5
    assert ReadinessLog([(0.0, 503, {})]).ready_share() == 0.0


def test_first_time_is_the_first_matching_sample_at_or_after_the_start():
    log = ReadinessLog(
        [
            (0.0, 200, {"generator": 2}),
            (0.5, 200, {"generator": 1}),
            (1.0, 503, {"generator": 0}),
            (1.5, 200, {"generator": 1}),
            (2.0, 200, {"generator": 2}),
        ]
    )

    def short(status, replicas):
        return replicas.get("generator", 2) < 2

    assert log.first_time(short) == 0.5
    assert log.first_time(short, after_s=0.6) == 1.0
    assert log.first_time(short, after_s=1.5) == 1.5  # at_s == after_s counts
    assert log.first_time(short, after_s=1.6) is None
    assert log.first_time(lambda status, replicas: status == 503) == 1.0
    assert log.first_time(lambda status, replicas: status is None) is None
    assert ReadinessLog().first_time(short) is None


# --- watch_readiness against a local server ------------------------------------------------


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def watch(url: str, polls: int, started: float | None = None) -> ReadinessLog:
    """Run the watcher until it has `polls` samples, then cancel it."""
    log = ReadinessLog()
    task = asyncio.create_task(watch_readiness(url, log, interval_s=0.01, started=started))
    deadline = time.monotonic() + 10
    while len(log.samples) < polls:
        assert time.monotonic() < deadline, f"only {len(log.samples)} polls in 10 s"
        assert not task.done(), "the watcher ended on its own"
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    return log


def test_watch_readiness_records_each_poll_until_cancelled(readyz):
    server = readyz(
        [
            (200, {"ready": True, "replicas": {"retriever": 1, "generator": 1}}),
            (503, {"ready": False, "replicas": {"retriever": 0, "generator": 1}}),
            (200, "not json"),  # an unreadable answer is a failed poll
            (200, {"ready": True}),  # no replicas given: none known
        ]
    )

    log = asyncio.run(watch(server.url, 5))

    samples = log.samples[:5]
    assert [status for _, status, _ in samples] == [200, 503, None, 200, 200]
    assert [replicas for _, _, replicas in samples] == [
        {"retriever": 1, "generator": 1},
        {"retriever": 0, "generator": 1},
        {},
        {},
        {},
    ]
    times = [at for at, _, _ in samples]
    assert times == sorted(times) and 0 <= times[0] < 5
    assert server.gets >= 5
    assert log.first_time(lambda status, replicas: status == 503) == times[1]


def test_watch_readiness_counts_from_the_given_start(readyz):
    server = readyz([(200, {"replicas": {}})])

    log = asyncio.run(watch(server.url, 2, started=time.perf_counter() - 100))

    assert all(100 <= at < 110 for at, _, _ in log.samples)


def test_watch_readiness_records_an_unreachable_service_as_none():
    log = asyncio.run(watch(f"http://127.0.0.1:{closed_port()}", 3))

    assert [(status, replicas) for _, status, replicas in log.samples[:3]] == [(None, {})] * 3
    assert log.ready_share() == 0.0


def test_answered_per_s_counts_complete_answers_over_the_whole_span():
    records = [
        RequestRecord(0, "rag", "q", send_at_ms=0.0, end_at_ms=1000.0, ok=True),
        RequestRecord(1, "rag", "q", send_at_ms=500.0, end_at_ms=2000.0, ok=True),
        RequestRecord(2, "rag", "q", send_at_ms=600.0, end_at_ms=700.0, status=503),
        RequestRecord(3, "rag", "q"),  # never sent
    ]

    assert outcomes.answered_per_s(records) == 1.0  # 2 answers over 2 s
    assert outcomes.answered_per_s(records[3:]) is None
