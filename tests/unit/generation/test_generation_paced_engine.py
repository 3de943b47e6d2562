"""generation.paced_engine.PacedEngine: the null engine of bench.chaos' overload runs,
max_tokens tokens at a fixed pace, and a FinishEvent whose usage counts them."""

from __future__ import annotations

import asyncio

import pytest

from generation.paced_engine import TOKEN_TEXT, PacedEngine
from pipeline.messages import FinishEvent, GenerationRequest, TokenEvent, TokenUsage

MESSAGES = [
    {"role": "system", "content": "Answer from the sources."},
    {"role": "user", "content": "What is paged attention?"},
]


def request(max_tokens: int) -> GenerationRequest:
    return GenerationRequest(MESSAGES, max_tokens, 0.0, "req-1")


async def timed_stream(engine: PacedEngine, max_tokens: int) -> list[tuple[float, object]]:
    loop = asyncio.get_running_loop()
    started = loop.time()
    return [(loop.time() - started, event) async for event in engine.stream(request(max_tokens))]


@pytest.mark.parametrize("max_tokens", [1, 7])
def test_it_streams_max_tokens_tokens_then_a_finish_with_the_usage(max_tokens):
    timed = asyncio.run(timed_stream(PacedEngine(ttft_ms=0, tpot_ms=0), max_tokens))

    events = [event for _, event in timed]
    assert events[:-1] == [TokenEvent(TOKEN_TEXT)] * max_tokens
    # Prompt tokens are the whitespace-separated words of every message: 4 + 4.
    assert events[-1] == FinishEvent("length", TokenUsage(8, max_tokens, 0))


def test_no_tokens_asked_gives_only_the_finish():
    timed = asyncio.run(timed_stream(PacedEngine(ttft_ms=0, tpot_ms=0), 0))

    assert [event for _, event in timed] == [FinishEvent("length", TokenUsage(8, 0, 0))]


def test_tokens_come_at_the_configured_pace():
    timed = asyncio.run(timed_stream(PacedEngine(ttft_ms=20, tpot_ms=5), 5))

    token_times = [at for at, event in timed if isinstance(event, TokenEvent)]
    assert len(token_times) == 5
    assert 0.019 <= token_times[0] < 0.2  # the first token after ttft_ms
    assert 0.039 <= token_times[-1] < 0.3  # ttft_ms + 4 x tpot_ms
    assert token_times == sorted(token_times)
    assert timed[-1][0] - token_times[-1] < 0.05  # the finish follows the last token


def test_the_null_engine_is_always_healthy():
    assert asyncio.run(PacedEngine(1, 1).check_health()) is None
