"""app.admission: the in-flight gate, the per-key token bucket and the body-size limit."""

from __future__ import annotations

import asyncio
import json

import pytest

from app.admission import BodySizeLimit, InFlightGate, KeyRateLimiter


def test_gate_admits_up_to_its_limit_and_again_after_a_leave():
    gate = InFlightGate(2)

    assert [gate.try_enter() for _ in range(3)] == [True, True, False]
    gate.leave()
    assert gate.try_enter() is True
    assert gate.in_flight == 2


def test_gate_never_counts_below_zero():
    gate = InFlightGate(1)
    gate.leave()

    assert gate.in_flight == 0
    assert gate.try_enter() is True


def test_gate_limit_must_be_positive():
    with pytest.raises(ValueError):
        InFlightGate(0)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_bucket_allows_a_burst_then_refills_at_the_rate():
    clock = Clock()
    limiter = KeyRateLimiter(rate_per_s=2.0, burst=3, clock=clock)

    assert [limiter.acquire("k") for _ in range(3)] == [None, None, None]
    wait = limiter.acquire("k")
    assert wait == pytest.approx(0.5)
    clock.now += 0.5
    assert limiter.acquire("k") is None
    assert limiter.acquire("k") == pytest.approx(0.5)


def test_buckets_are_per_key_and_bounded():
    clock = Clock()
    limiter = KeyRateLimiter(rate_per_s=1.0, burst=1, clock=clock, max_keys=2)

    assert limiter.acquire("a") is None
    assert limiter.acquire("b") is None
    assert limiter.acquire("a") is not None  # a's one token is spent; b is untouched
    limiter.acquire("c")  # evicts the least recently seen key, b
    assert limiter.acquire("b") is None  # b comes back with a full bucket


async def drive(app, headers: list[tuple[bytes, bytes]], chunks: list[bytes]):
    """Run one HTTP request through `app`; returns (sent messages, body chunks read)."""
    incoming = [
        {"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1}
        for i, chunk in enumerate(chunks)
    ]
    read: list[int] = []

    async def receive():
        message = incoming.pop(0)
        read.append(len(message["body"]))
        return message

    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/rag/query", "headers": headers}
    await app(scope, receive, send)
    return sent, read


class EchoApp:
    """Reads the whole body and answers 200 with its length."""

    async def __call__(self, scope, receive, send):
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": str(len(body)).encode()})


def limited(max_bytes: int = 10) -> BodySizeLimit:
    return BodySizeLimit(EchoApp(), max_bytes, render_error=lambda scope: {"error": "too big"})


def test_declared_length_over_the_limit_is_413_without_reading_the_body():
    sent, read = asyncio.run(drive(limited(), [(b"content-length", b"11")], [b"x" * 11]))

    assert sent[0]["status"] == 413
    assert json.loads(sent[1]["body"]) == {"error": "too big"}
    assert read == []


def test_declared_length_within_the_limit_passes_through():
    sent, read = asyncio.run(drive(limited(), [(b"content-length", b"10")], [b"x" * 10]))

    assert (sent[0]["status"], sent[1]["body"]) == (200, b"10")
    assert read == [10]


def test_undeclared_body_stops_being_read_once_over_the_limit():
    chunks = [b"x" * 6, b"x" * 6, b"x" * 6, b"x" * 6]

    sent, read = asyncio.run(drive(limited(), [], chunks))

    assert sent[0]["status"] == 413
    assert read == [6, 6]  # the third and fourth chunks were never read


def test_undeclared_body_within_the_limit_is_replayed_whole():
    sent, _ = asyncio.run(drive(limited(), [], [b"abc", b"def"]))

    assert (sent[0]["status"], sent[1]["body"]) == (200, b"6")
