"""bench.loadgen, bench.stats and bench.latency against in-process fake streams (no network).

The fake server is an httpx.MockTransport whose handler streams server-sent events in the
service's formats (app/rag_format.py, app/openai_format.py), with short sleeps so that the
client-side timings are measurable. Expected statistics are worked out by hand in comments.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import httpx
import pytest

from advisor.cli import load_bench_result
from bench import latency
from bench.loadgen import (
    RequestRecord,
    RequestSpec,
    arrival_offsets_s,
    make_client,
    poisson_gaps_s,
    request_body,
    run_load,
)
from bench.stats import (
    advisor_figures,
    meets_slos,
    percentile,
    summarize,
    summary_markdown,
    tpot_ms,
)

# A step of a fake stream: seconds to wait, then the SSE text to send.
Step = tuple[float, str]
TIMINGS = {"retrieve": 12.0, "compress": 3.0, "ttft": 40.0, "total": 95.0}


def sse(event: str | None, data: Any) -> str:
    body = data if isinstance(data, str) else json.dumps(data)
    return (f"event: {event}\n" if event else "") + f"data: {body}\n\n"


def rag_steps(
    texts: Sequence[str],
    *,
    first_s: float = 0.0,
    gap_s: float = 0.0,
    completion_tokens=None,
    degraded: str | None = None,
) -> list[Step]:
    """sources, one delta per text (the first after first_s, the rest gap_s apart), done,
    [DONE]; usage.completion_tokens defaults to the number of deltas."""
    tokens = len(texts) if completion_tokens is None else completion_tokens
    done = {
        "id": "r1",
        "answer": "".join(texts),
        "sources": [],
        "compression_method": "sentences",
        "context_truncated": False,
        "finish_reason": "stop",
        "usage": {
            "prompt_tokens": 800,
            "cached_prompt_tokens": 256,
            "cached_prompt_tokens_by_segment": {
                "system": 250,
                "history": 0,
                "passages": 6,
                "question": 0,
            },
            "context_tokens_before": 800,
            "context_tokens_after": 400,
            "completion_tokens": tokens,
            "continued_turns": 2,
        },
        "timings_ms": TIMINGS,
        "tpot_ms": 21.0,
        "degraded": degraded,
    }
    steps: list[Step] = [(0.0, sse("sources", {"id": "r1", "sources": []}))]
    steps += [
        (first_s if i == 0 else gap_s, sse("delta", {"text": t})) for i, t in enumerate(texts)
    ]
    return [*steps, (0.0, sse("done", done)), (0.0, sse(None, "[DONE]"))]


def chat_chunk(delta: dict | None = None, finish: str | None = None, **extra: Any) -> str:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    body = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": choices, **extra}
    return sse(None, body)


def chat_steps(
    texts: Sequence[str], *, first_s: float = 0.0, gap_s: float = 0.0, usage_tokens=None
) -> list[Step]:
    """Role-only chunk with sources, one content chunk per text, the finish chunk with `rag`,
    a usage chunk when usage_tokens is given, [DONE]."""
    steps: list[Step] = [(0.0, chat_chunk({"role": "assistant", "content": ""}, sources=[]))]
    steps += [
        (first_s if i == 0 else gap_s, chat_chunk({"content": t})) for i, t in enumerate(texts)
    ]
    rag = {"timings_ms": TIMINGS, "tpot_ms": 21.0, "compression_method": "sentences"}
    steps.append((0.0, chat_chunk({}, "stop", rag=rag)))
    if usage_tokens is not None:
        usage = {"prompt_tokens": 800, "completion_tokens": usage_tokens, "total_tokens": 0}
        steps.append((0.0, chat_chunk(None, usage=usage)))
    return [*steps, (0.0, sse(None, "[DONE]"))]


class FakeServer:
    """A MockTransport handler that streams `steps_for(request)` and counts requests in
    flight (from the handler's call to the end of the body)."""

    def __init__(self, steps_for: Callable[[httpx.Request], list[Step] | httpx.Response]):
        self.steps_for = steps_for
        self.requests: list[httpx.Request] = []
        self.in_flight = 0
        self.max_in_flight = 0

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        steps = self.steps_for(request)
        if isinstance(steps, httpx.Response):
            return steps
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        return httpx.Response(
            200, headers={"content-type": "text/event-stream"}, content=self._body(steps)
        )

    async def _body(self, steps: list[Step]) -> AsyncIterator[bytes]:
        try:
            for delay_s, text in steps:
                if delay_s:
                    await asyncio.sleep(delay_s)
                yield text.encode()
        finally:
            self.in_flight -= 1

    def client(self, api_key: str | None = None) -> httpx.AsyncClient:
        return make_client(
            "http://bench.test", api_key=api_key, transport=httpx.MockTransport(self)
        )


def load(
    server: FakeServer,
    specs: Sequence[RequestSpec],
    *,
    api_key: str | None = None,
    rate_per_s: float | None = None,
    concurrency: int | None = None,
    seed: int = 0,
    **options: Any,
) -> list[RequestRecord]:
    """run_load against `server`, one at a time unless a rate or concurrency is given."""
    if rate_per_s is None and concurrency is None:
        concurrency = 1

    async def go() -> list[RequestRecord]:
        async with server.client(api_key) as client:
            return await run_load(
                client, specs, rate_per_s=rate_per_s, concurrency=concurrency, seed=seed, **options
            )

    return asyncio.run(go())


RAG = RequestSpec("rag", "What is TTFT?", max_tokens=16)
CHAT = RequestSpec("chat", "What is TTFT?", max_tokens=16)


def error_response(status: int, message: str, code: str) -> httpx.Response:
    body = {"error": {"message": message, "type": "service_unavailable", "param": None}}
    body["error"]["code"] = code
    return httpx.Response(status, json=body, headers={"Retry-After": "1"})


# --- loadgen: one request ------------------------------------------------------------------


def test_rag_stream_timings_usage_and_server_stages():
    server = FakeServer(lambda _: rag_steps(["A", "B", "C", "D"], first_s=0.05, gap_s=0.02,
                                            completion_tokens=7))  # fmt: skip
    spec = RequestSpec("rag", "Why?", 32, top_k=3, compression_method="sentences",
                       compression_rate=0.5)  # fmt: skip
    [record] = load(server, [spec], concurrency=1)

    assert record.ok and record.status == 200 and record.error_kind is None
    # 50 ms before the first delta, then 3 gaps of 20 ms (asyncio sleeps never end early by
    # more than clock granularity; the slack covers it).
    assert record.ttft_ms is not None and record.e2e_ms is not None
    assert 45 <= record.ttft_ms < record.e2e_ms
    assert len(record.itl_ms) == 3 and all(gap >= 15 for gap in record.itl_ms)
    assert record.ttft_ms + sum(record.itl_ms) <= record.e2e_ms + 1e-6
    # usage.completion_tokens (7) wins over the 4 deltas.
    assert (record.output_tokens, record.content_deltas, record.usage_completion_tokens) == (
        7,
        4,
        7,
    )
    assert record.server_timings_ms == TIMINGS and record.server_tpot_ms == 21.0
    assert record.answer == "ABCD"  # the text a client sends back as history
    assert record.send_at_ms is not None and record.end_at_ms is not None
    assert record.end_at_ms - record.send_at_ms == pytest.approx(record.e2e_ms)

    [request] = server.requests
    assert request.url.path == "/v1/rag/query"
    assert json.loads(request.content) == {
        "question": "Why?",
        "max_tokens": 32,
        "stream": True,
        "top_k": 3,
        "compression": {"method": "sentences", "rate": 0.5},
    }


def test_chat_stream_skips_empty_deltas_and_reads_usage_and_rag_extras():
    def steps(_: httpx.Request) -> list[Step]:
        *body, finish, usage, done = chat_steps(["x", "y", "z"], first_s=0.04, gap_s=0.02,
                                                usage_tokens=5)  # fmt: skip
        # An empty content chunk mid-stream is neither a token nor an ITL gap.
        return [*body[:2], (0.01, chat_chunk({"content": ""})), *body[2:], finish, usage, done]

    server = FakeServer(steps)
    spec = RequestSpec("chat", "Why?", 8, top_k=2, compression_method="none", model="m")
    [record] = load(server, [spec], api_key="k" * 16)

    assert record.ok, record.error
    # The role-only first chunk arrives at once; TTFT waits for "x" 40 ms later.
    assert record.ttft_ms is not None and record.ttft_ms >= 35
    assert record.content_deltas == 3 and len(record.itl_ms) == 2
    assert record.output_tokens == 5 and record.usage_completion_tokens == 5
    assert record.server_timings_ms == TIMINGS and record.server_tpot_ms == 21.0

    [request] = server.requests
    assert request.url.path == "/v1/chat/completions"
    assert request.headers["authorization"] == "Bearer " + "k" * 16
    assert json.loads(request.content) == {
        "model": "m",
        "messages": [{"role": "user", "content": "Why?"}],
        "max_tokens": 8,
        "stream": True,
        "stream_options": {"include_usage": True},
        "rag": {"top_k": 2, "compression": {"method": "none"}},
    }


def test_output_tokens_fall_back_to_the_delta_count_without_usage():
    [record] = load(FakeServer(lambda _: chat_steps(["a", "b", "c"])), [CHAT])
    assert record.ok and record.usage_completion_tokens is None
    assert record.output_tokens == record.content_deltas == 3


def test_request_body_leaves_out_unset_options():
    assert request_body(RAG) == {"question": "What is TTFT?", "max_tokens": 16, "stream": True}
    assert "rag" not in request_body(CHAT)
    assert request_body(RequestSpec("rag", "q", 1, compression_rate=0.3))["compression"] == {
        "rate": 0.3
    }
    assert request_body(RequestSpec("rag", "q", 1, answer_style="short"))["answer_style"] == "short"
    chat = request_body(RequestSpec("chat", "q", 1, answer_style="short"))
    assert chat["rag"] == {"answer_style": "short"}


def test_chat_spec_can_carry_its_own_messages_and_temperature():
    messages = (
        {"role": "system", "content": "Answer from the sources."},
        {"role": "user", "content": "Sources:\n...\n\nQuestion: What is TTFT?"},
    )
    spec = RequestSpec("chat", "What is TTFT?", 8, model="m", messages=messages, temperature=0.0)

    body = request_body(spec)
    assert body == {
        "model": "m",
        "messages": [dict(message) for message in messages],
        "max_tokens": 8,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.0,
    }
    # The body holds copies: a client that edits it cannot change the spec.
    body["messages"][0]["content"] = "changed"
    assert spec.messages is not None and spec.messages[0]["content"] == "Answer from the sources."
    assert request_body(RequestSpec("rag", "q", 4, temperature=0.7))["temperature"] == 0.7
    turns = ({"role": "user", "content": "a?"}, {"role": "assistant", "content": "b."})
    assert request_body(RequestSpec("rag", "q", 4, history=turns))["history"] == list(turns)
    assert "history" not in request_body(RAG)
    with pytest.raises(ValueError, match="rag endpoint"):
        RequestSpec("chat", "q", 4, history=turns)
    assert "temperature" not in request_body(CHAT)


def test_messages_belong_to_the_chat_endpoint_and_must_not_be_empty():
    with pytest.raises(ValueError, match="chat endpoint only"):
        RequestSpec("rag", "q", 4, messages=({"role": "user", "content": "q"},))
    with pytest.raises(ValueError, match="must not be empty"):
        RequestSpec("chat", "q", 4, messages=())


def test_chat_spec_with_messages_streams_and_records_prompt_tokens():
    def steps(_: httpx.Request) -> list[Step]:
        *body, _usage, done = chat_steps(["x", "y"], usage_tokens=2)
        # vLLM's own usage chunk: cached tokens under prompt_tokens_details.
        usage = {
            "prompt_tokens": 912,
            "completion_tokens": 2,
            "total_tokens": 914,
            "prompt_tokens_details": {"cached_tokens": 256},
        }
        return [*body, (0.0, chat_chunk(None, usage=usage)), done]

    server = FakeServer(steps)
    messages = ({"role": "system", "content": "s"}, {"role": "user", "content": "u"})
    spec = RequestSpec("chat", "label", 8, messages=messages)
    [record] = load(server, [spec])

    assert record.ok, record.error
    assert record.question == "label"
    assert (record.usage_prompt_tokens, record.usage_cached_prompt_tokens) == (912, 256)
    assert json.loads(server.requests[0].content)["messages"] == [dict(m) for m in messages]


def test_rag_done_event_says_whether_the_answer_was_degraded():
    [plain] = load(FakeServer(lambda _: rag_steps(["a"])), [RAG])
    [fallback] = load(FakeServer(lambda _: rag_steps(["a"], degraded="compressor_timeout")), [RAG])

    assert plain.ok and plain.degraded is None
    assert fallback.ok and fallback.degraded == "compressor_timeout"


def test_rag_done_event_gives_prompt_and_cached_tokens():
    [record] = load(FakeServer(lambda _: rag_steps(["a", "b"])), [RAG])
    assert (record.usage_prompt_tokens, record.usage_cached_prompt_tokens) == (800, 256)
    assert record.usage_cached_by_segment == {
        "system": 250,
        "history": 0,
        "passages": 6,
        "question": 0,
    }
    assert record.usage_continued_turns == 2
    # A chat usage chunk without details: prompt tokens, no cached count, no split.
    [record] = load(FakeServer(lambda _: chat_steps(["a"], usage_tokens=1)), [CHAT])
    assert (record.usage_prompt_tokens, record.usage_cached_prompt_tokens) == (800, None)
    assert record.usage_cached_by_segment is None
    assert record.usage_continued_turns is None


# --- loadgen: failures ---------------------------------------------------------------------


def test_http_503_is_recorded_with_its_message_and_never_retried():
    server = FakeServer(lambda _: error_response(503, "queue full (request r9)", "overloaded"))
    [record] = load(server, [RAG])

    assert not record.ok and record.status == 503 and record.error_kind == "http_503"
    assert record.error == "queue full (request r9) [overloaded]"
    assert record.ttft_ms is None and record.output_tokens == 0
    assert len(server.requests) == 1


def test_mid_stream_error_event_fails_the_request_after_its_first_token():
    error = {"error": {"message": "past deadline", "type": "timeout", "code": "timeout"}}

    def steps(_: httpx.Request) -> list[Step]:
        head = rag_steps(["A", "B"], gap_s=0.01)[:3]  # sources and both deltas
        return [*head, (0.0, sse("error", error)), (0.0, sse(None, "[DONE]"))]

    [record] = load(FakeServer(steps), [RAG])
    assert not record.ok and record.status == 200 and record.error_kind == "stream_error"
    assert record.error == "past deadline [timeout]"
    assert record.ttft_ms is not None and record.output_tokens == 2


def test_answering_is_set_by_a_first_token_never_by_a_refusal():
    refused = asyncio.Event()
    load(FakeServer(lambda _: error_response(503, "full", "overloaded")), [RAG], answering=refused)
    assert not refused.is_set()

    server = FakeServer(lambda _: rag_steps(["A", "B"], first_s=0.1, gap_s=0.1))

    async def go() -> tuple[float, float, list[RequestRecord]]:
        answering = asyncio.Event()
        async with server.client() as client:
            started = time.perf_counter()
            load_task = asyncio.create_task(
                run_load(client, [RAG], rate_per_s=None, concurrency=1, seed=0,
                         answering=answering)
            )  # fmt: skip
            await answering.wait()
            set_after_s = time.perf_counter() - started
            records = await load_task
            return set_after_s, time.perf_counter() - started, records

    set_after_s, ended_after_s, [record] = asyncio.run(go())
    # Set at the first delta (100 ms in), before the second one ends the stream.
    assert record.ok and record.ttft_ms is not None
    assert 0.09 <= set_after_s < ended_after_s
    assert abs(set_after_s * 1000 - record.ttft_ms) < 50


def test_chat_error_chunk_fails_the_request():
    error = {"error": {"message": "boom", "type": "server_error", "code": "internal_error"}}
    steps = [*chat_steps(["a"])[:2], (0.0, sse(None, error)), (0.0, sse(None, "[DONE]"))]
    [record] = load(FakeServer(lambda _: steps), [CHAT])
    assert (record.ok, record.error_kind, record.error) == (
        False,
        "stream_error",
        "boom [internal_error]",
    )


def test_connection_failure_is_a_transport_error():
    def refuse(request: httpx.Request) -> list[Step]:
        raise httpx.ConnectError("connection refused", request=request)

    records = load(FakeServer(refuse), [RAG, CHAT], concurrency=2)
    assert [(r.ok, r.status, r.error_kind) for r in records] == [(False, None, "transport")] * 2
    assert all("connection refused" in (r.error or "") for r in records)


def test_stream_without_its_final_event_is_incomplete():
    steps = rag_steps(["A"])[:2]  # sources and a delta, then the connection closes
    [record] = load(FakeServer(lambda _: steps), [RAG])
    assert not record.ok and record.error_kind == "incomplete"


def test_malformed_event_is_a_protocol_error():
    [record] = load(FakeServer(lambda _: [(0.0, sse("delta", "{not json"))]), [RAG])
    assert not record.ok and record.error_kind == "protocol"


def test_request_timeout_bounds_a_stalled_stream():
    server = FakeServer(lambda _: rag_steps(["A", "B"], gap_s=5.0))
    [record] = load(server, [RAG], request_timeout_s=0.1)
    assert not record.ok and record.error_kind == "timeout"
    assert record.e2e_ms is not None and 90 <= record.e2e_ms < 1000


def test_run_deadline_stops_sending_and_cuts_requests_in_flight():
    # 2 req/s, seed 3: arrivals past 0.3 s are never sent; those sent stall and are cut.
    offsets = arrival_offsets_s(6, 2.0, seed=3)
    expected_sent = sum(offset < 0.3 for offset in offsets)
    assert 0 < expected_sent < 6
    server = FakeServer(lambda _: rag_steps(["A", "B"], gap_s=5.0))
    records = load(server, [RAG] * 6, rate_per_s=2.0, seed=3, deadline_s=0.3)

    sent = [r for r in records if r.send_at_ms is not None]
    assert len(sent) == len(server.requests) == expected_sent
    assert all(r.error_kind == "timeout" for r in sent)
    assert all(r.error_kind == "not_sent" and not r.ok for r in records[expected_sent:])
    assert max(r.end_at_ms or 0 for r in records) < 1000


def test_run_load_wants_exactly_one_arrival_mode():
    async def go(rate: float | None, concurrency: int | None) -> None:
        async with FakeServer(lambda _: rag_steps(["A"])).client() as client:
            await run_load(client, [RAG], rate_per_s=rate, concurrency=concurrency, seed=0)

    for rate, concurrency in ((None, None), (1.0, 2)):
        with pytest.raises(ValueError, match="exactly one"):
            asyncio.run(go(rate, concurrency))
    for rate, concurrency in ((0.0, None), (float("nan"), None), (None, 0)):
        with pytest.raises(ValueError):
            asyncio.run(go(rate, concurrency))


# --- loadgen: arrivals ---------------------------------------------------------------------


def test_poisson_gaps_are_seeded_and_their_mean_is_one_over_the_rate():
    gaps = poisson_gaps_s(20_000, 4.0, seed=7)
    assert gaps == poisson_gaps_s(20_000, 4.0, seed=7)
    assert gaps[:10] != poisson_gaps_s(10, 4.0, seed=8)
    assert min(gaps) > 0
    # Exponential with mean 0.25 s: the sample mean's standard error is 0.25 / sqrt(20000)
    # = 0.0018, so 3% (0.0075) is over 4 standard errors; the std of an exponential equals
    # its mean.
    assert statistics.fmean(gaps) == pytest.approx(0.25, rel=0.03)
    assert statistics.pstdev(gaps) == pytest.approx(0.25, rel=0.05)
    with pytest.raises(ValueError):
        poisson_gaps_s(3, 0.0, seed=0)


def test_arrival_offsets_start_at_zero_and_add_up_the_gaps():
    gaps = poisson_gaps_s(3, 5.0, seed=1)
    assert arrival_offsets_s(4, 5.0, seed=1) == pytest.approx(
        [0.0, gaps[0], gaps[0] + gaps[1], gaps[0] + gaps[1] + gaps[2]]
    )
    assert arrival_offsets_s(0, 5.0, seed=1) == []


def test_poisson_run_sends_each_request_at_its_arrival_time():
    # Each answer takes 2 s, eight times the whole schedule: an open-loop sender sends all
    # five before the first answer ends, a sender that waits for answers could not. Checked
    # that way rather than by a few ms of lateness, which a busy machine (the suite starts a
    # service beside the unit tests) cannot promise.
    answer_s = 2.0
    server = FakeServer(lambda _: rag_steps(["A"], first_s=answer_s))
    records = load(server, [RAG] * 5, rate_per_s=20.0, seed=11)
    offsets_ms = [offset * 1000 for offset in arrival_offsets_s(5, 20.0, seed=11)]

    assert [r.scheduled_at_ms for r in records] == pytest.approx(offsets_ms)
    sends_ms = [r.send_at_ms for r in records]
    assert all(r.ok for r in records) and None not in sends_ms
    for sent_ms, offset_ms in zip(sends_ms, offsets_ms, strict=True):
        assert sent_ms >= offset_ms - 1, "sent before it was due"
    assert sends_ms == sorted(sends_ms)
    assert max(sends_ms) < min(sends_ms) + answer_s * 1000, "a send waited for an answer"


def test_concurrency_limit_is_reached_and_never_exceeded():
    server = FakeServer(lambda _: rag_steps(["A", "B"], first_s=0.01, gap_s=0.01))
    records = load(server, [RAG] * 12, concurrency=3)
    assert all(r.ok for r in records) and len(server.requests) == 12
    assert server.max_in_flight == 3


# --- stats ---------------------------------------------------------------------------------


def test_percentiles_interpolate_linearly_between_ranks():
    values = [50.0, 15.0, 40.0, 20.0, 35.0]  # sorted: 15 20 35 40 50, n - 1 = 4
    assert percentile(values, 50) == 35.0  # rank 2
    assert percentile(values, 90) == pytest.approx(46.0)  # rank 3.6: 40 + 0.6 * 10
    assert percentile(values, 99) == pytest.approx(49.6)  # rank 3.96: 40 + 0.96 * 10
    assert percentile(values, 25) == 20.0  # rank 1
    assert percentile(values, 0) == 15.0 and percentile(values, 100) == 50.0
    assert percentile([1.0, 2.0], 50) == 1.5
    assert percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile(values, 101)


def record(
    index: int,
    *,
    ttft: float = 100.0,
    e2e: float = 1100.0,
    tokens: int = 11,
    ok: bool = True,
    send: float = 0.0,
    itl: Sequence[float] = (),
    kind: str | None = None,
    timings: dict[str, float] | None = None,
) -> RequestRecord:
    return RequestRecord(
        index,
        "rag",
        "q",
        send_at_ms=send,
        end_at_ms=send + e2e,
        ttft_ms=ttft if ok else None,
        itl_ms=list(itl),
        e2e_ms=e2e,
        output_tokens=tokens,
        ok=ok,
        status=200 if ok else 503,
        error_kind=None if ok else kind or "http_503",
        server_timings_ms=timings,
    )


def test_tpot_is_decode_time_over_tokens_after_the_first():
    assert tpot_ms(record(0, ttft=100, e2e=1100, tokens=11)) == 100.0  # 1000 ms / 10
    assert tpot_ms(record(0, ttft=100, e2e=300, tokens=2)) == 200.0  # 200 ms / 1
    assert tpot_ms(record(0, tokens=1)) is None
    assert tpot_ms(record(0, tokens=0)) is None
    assert tpot_ms(record(0, ok=False)) is None


def test_summary_counts_throughput_goodput_and_distributions():
    slo = {"slo_ttft_ms": 500.0, "slo_tpot_ms": 50.0}
    records = [
        # TTFT 200, TPOT (1000 - 200) / 20 = 40: meets both.
        record(0, ttft=200, e2e=1000, tokens=21, send=0, itl=[30, 50],
               timings={"retrieve": 10, "compress": 2, "ttft": 150, "total": 900}),
        # TTFT 600: misses the TTFT SLO.
        record(1, ttft=600, e2e=1600, tokens=21, send=200, itl=[40]),
        # TPOT (2000 - 100) / 19 = 100: misses the TPOT SLO.
        record(2, ttft=100, e2e=2000, tokens=20, send=400,
               timings={"retrieve": 30, "compress": 4, "ttft": 50, "total": 1800}),
        # One token: no TPOT, judged on TTFT alone, meets.
        record(3, ttft=300, e2e=300, tokens=1, send=500),
        # Failed, ends last: counts toward the duration, not toward throughput.
        record(4, ok=False, e2e=50, tokens=0, send=1950),
        # Never sent.
        RequestRecord(5, "rag", "q", error_kind="not_sent"),
    ]  # fmt: skip
    assert [meets_slos(r, **slo) for r in records] == [True, False, False, True, False, False]
    s = summarize(records, **slo)

    assert (s.requests, s.sent, s.succeeded, s.failed, s.not_sent) == (6, 5, 4, 1, 1)
    assert s.errors == {"http_503": 1, "not_sent": 1}
    # First send 0 ms, last end 1950 + 50 = 2000 ms (record 4) and 400 + 2000 (record 2).
    assert s.duration_s == pytest.approx(2.4)
    assert s.requests_per_s == pytest.approx(4 / 2.4)
    assert s.output_tokens == 21 + 21 + 20 + 1
    assert s.output_tokens_per_s == pytest.approx(63 / 2.4)
    assert s.met_slos == 2 and s.goodput_requests_per_s == pytest.approx(2 / 2.4)

    assert s.ttft_ms is not None and s.tpot_ms is not None and s.itl_ms is not None
    assert s.ttft_ms.n == 4 and s.ttft_ms.p50 == 250.0  # 100 200 300 600: rank 1.5
    assert s.ttft_ms.mean == 300.0 and s.ttft_ms.max == 600.0
    # TPOTs 40, 50 (1000 / 20), 100: p50 50, p90 rank 1.8 -> 50 + 0.8 * 50 = 90.
    assert s.tpot_ms.n == 3 and s.tpot_ms.p50 == 50.0 and s.tpot_ms.p90 == pytest.approx(90.0)
    assert (s.itl_ms.n, s.itl_ms.p50) == (3, 40.0)  # pooled 30 40 50
    assert s.e2e_ms is not None and s.e2e_ms.p50 == 1300.0  # 300 1000 1600 2000: rank 1.5
    retrieve = s.server_ms["retrieve"]
    assert retrieve is not None and (retrieve.n, retrieve.p50) == (2, 20.0)
    assert s.server_ms["tpot"] is None

    assert advisor_figures(s) == {
        "ttft_ms": 250.0,
        "tpot_ms": 50.0,
        "output_tokens_per_s": pytest.approx(63 / 2.4),
    }
    table = summary_markdown(s)
    assert "| TTFT | 4 | 300 | 250 |" in table and "| server tpot | 0 | - |" in table
    assert "goodput 0.833 req/s (2 met TTFT <= 500 ms, TPOT <= 50.0 ms)" in table


def test_no_slo_means_every_success_counts_and_no_success_means_no_figures():
    s = summarize([record(0, ttft=9e9, e2e=9e9 + 10, tokens=2)])
    assert s.met_slos == 1
    failed = summarize([record(0, ok=False)])
    assert failed.succeeded == 0 and failed.ttft_ms is None
    assert advisor_figures(failed) == {}


# --- CLI -----------------------------------------------------------------------------------


def patch_client(monkeypatch: pytest.MonkeyPatch, server: FakeServer) -> None:
    def fake_make_client(base_url: str, **kwargs: Any) -> httpx.AsyncClient:
        return make_client(base_url, **kwargs, transport=httpx.MockTransport(server))

    monkeypatch.setattr(latency, "make_client", fake_make_client)


@pytest.mark.parametrize("endpoint", ["rag", "chat"])
def test_cli_writes_result_table_and_advisor_input(monkeypatch, tmp_path, capsys, endpoint):
    steps = rag_steps if endpoint == "rag" else chat_steps
    server = FakeServer(lambda _: steps(["A", "B", "C"], gap_s=0.005, **(
        {} if endpoint == "rag" else {"usage_tokens": 3})))  # fmt: skip
    patch_client(monkeypatch, server)
    questions = tmp_path / "questions.txt"
    questions.write_text("first question\n\n  second question  \n")
    secret = "s3cret-key-0123456789"

    rc = latency.main(
        ["--url", "http://127.0.0.1:8000", "--api-key", secret, "--endpoint", endpoint,
         "--concurrency", "2", "--num-requests", "5", "--max-tokens", "8", "--top-k", "3",
         "--compression", "sentences", "--rate-keep", "0.5", "--questions", str(questions),
         "--label", "lab", "--out", str(tmp_path / "out")]
    )  # fmt: skip

    assert rc == 0
    out = tmp_path / "out"
    result = json.loads((out / "lab.json").read_text())
    assert secret not in (out / "lab.json").read_text()
    assert result["config"]["api_key_set"] is True and result["config"]["endpoint"] == endpoint
    assert [r["question"] for r in result["records"]] == [
        "first question", "second question", "first question", "second question",
        "first question",
    ]  # fmt: skip
    assert all(r["ok"] and r["output_tokens"] == 3 for r in result["records"])
    assert result["summary"]["succeeded"] == 5 and result["summary"]["ttft_ms"]["n"] == 5
    assert all(r.headers["authorization"] == f"Bearer {secret}" for r in server.requests)
    body = json.loads(server.requests[0].content)
    options = body if endpoint == "rag" else body["rag"]
    assert options["top_k"] == 3
    # A named method is measured as itself: the service's `auto` policy must not skip it.
    assert options["compression"] == {"method": "sentences", "rate": 0.5, "policy": "always"}

    markdown = (out / "lab.md").read_text()
    assert "| metric (ms) | n | mean | p50 | p90 | p99 | max |" in markdown
    assert "| TTFT | 5 |" in markdown and "| server retrieve | 5 | 12.0 |" in markdown
    printed = capsys.readouterr().out
    assert "| TTFT | 5 |" in printed and "lab.advisor.json" in printed

    figures = load_bench_result(out / "lab.advisor.json")
    assert set(figures) == {"ttft_ms", "tpot_ms", "output_tokens_per_s"}
    assert figures["ttft_ms"] == result["summary"]["ttft_ms"]["p50"]


def test_cli_exits_1_when_every_request_fails(monkeypatch, tmp_path, capsys):
    patch_client(monkeypatch, FakeServer(lambda _: error_response(503, "not ready", "nr")))
    rc = latency.main(
        ["--url", "http://x", "--rate", "50", "--num-requests", "3", "--max-tokens", "4",
         "--out", str(tmp_path)]
    )  # fmt: skip
    assert rc == 1
    result = json.loads((tmp_path / "rag-r50-default.json").read_text())
    assert [r["question"] for r in result["records"]] == list(latency.DEFAULT_QUESTIONS[:3])
    assert (tmp_path / "rag-r50-default.md").exists()
    assert not (tmp_path / "rag-r50-default.advisor.json").exists()
    assert "every request failed: {'http_503': 3}" in capsys.readouterr().err


@pytest.mark.parametrize(
    "extra",
    [
        ["--rate", "1", "--concurrency", "2"],
        ["--concurrency", "0"],
        ["--rate", "-1"],
        ["--concurrency", "1", "--rate-keep", "1.5"],
        ["--concurrency", "1", "--label", "../escape"],
    ],
)
def test_cli_refuses_bad_arguments(tmp_path, capsys, extra):
    base = ["--url", "http://x", "--num-requests", "1", "--max-tokens", "4", "--out", "o"]
    with pytest.raises(SystemExit) as exit_info:
        latency.main([*base, *extra])
    assert exit_info.value.code == 2
    assert "error" in capsys.readouterr().err


def test_load_points_can_start_at_another_question_and_cycle():
    argv = "--url http://s --concurrency 2 --num-requests 4 --max-tokens 8 --first-question 2"
    args = latency.build_parser().parse_args([*argv.split(), "--out", "x"])

    specs = latency.build_specs(args, ("q0", "q1", "q2", "q3"))

    assert [spec.question for spec in specs] == ["q2", "q3", "q0", "q1"]
