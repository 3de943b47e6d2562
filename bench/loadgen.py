"""Load against the service's streaming endpoints, timed on the client (asyncio + httpx).

Arrivals are either open-loop, Poisson at a given rate (exponential gaps from a seeded
`random.Random`, first request at time 0), or closed-loop at a fixed concurrency (a semaphore:
the next request starts when one finishes). Every request streams, and its timings are taken
with `time.perf_counter` as events arrive:

- TTFT: send -> first non-empty content delta (the chat endpoint's role-only first chunk and
  the RAG endpoint's `sources` event do not count);
- ITL: each gap between consecutive non-empty content deltas;
- E2E: send -> `data: [DONE]` (or the connection closing, or the failure); the rest of the
  body is then read so that HTTP/1.1 can reuse the connection;
- output tokens: `usage.completion_tokens` from the server's final event when present, else
  the number of content deltas; `usage.prompt_tokens` and the cached prompt tokens are kept
  as the server reports them.

Requests are bounded: each by `request_timeout_s`, the run by `deadline_s`; requests not
started by the deadline are recorded as not sent. Nothing is retried, a 503 included.

Endpoints (see docs/api.md and app/rag_format.py, app/openai_format.py for the stream formats):
- "rag":  POST /v1/rag/query {question, max_tokens, stream, top_k?, compression?}; SSE
          `event: sources`, `event: delta` {"text"}, `event: done` {usage, timings_ms,
          tpot_ms}, `data: [DONE]`; a failure after the first token is `event: error`.
- "chat": POST /v1/chat/completions, OpenAI chunks with `stream_options.include_usage`; the
          retrieval options ride in `rag`; the finish chunk's `rag` carries timings_ms and
          tpot_ms, the usage chunk the token count; a late failure is a `data: {"error"}`.
          A spec may carry the `messages` themselves (no `rag` options): then the same
          requests go to any OpenAI-compatible server, vLLM's own included.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import random
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from bench.client import QUERY_PATH, auth_headers, openai_error

Endpoint = Literal["rag", "chat"]
ENDPOINTS: tuple[Endpoint, ...] = ("rag", "chat")
ENDPOINT_PATHS: dict[str, str] = {"rag": QUERY_PATH, "chat": "/v1/chat/completions"}
DEFAULT_CHAT_MODEL = "smollm2-135m-instruct"
STAGE_NAMES = ("retrieve", "compress", "queue", "network", "ttft", "total")
DEFAULT_REQUEST_TIMEOUT_S = 300.0
# How long to wait for the end of the body after [DONE]; see _drain.
DRAIN_TIMEOUT_S = 1.0
# Error bodies are kept for the record, cut to this length.
MAX_ERROR_CHARS = 500
_DONE = "[DONE]"


@dataclass(frozen=True)
class RequestSpec:
    """One request to send: the question and its generation and retrieval options."""

    endpoint: Endpoint
    question: str
    max_tokens: int
    top_k: int | None = None
    compression_method: str | None = None
    compression_rate: float | None = None
    # "always" measures the method itself; "auto" lets the service's cost model decide.
    compression_policy: str | None = None
    # Lay passages out for the prefix cache (compression.reuse); None: the service's default.
    compression_reuse: bool | None = None
    # Ask the service to return the (compressed) passages the model saw; the chat
    # endpoint's record then keeps them with the sources (RequestRecord.passages).
    include_context: bool = False
    model: str = DEFAULT_CHAT_MODEL
    # Chat endpoint only: the messages to send as they are, in place of one user message
    # holding `question` (which then only labels the record). For a model server with no
    # RAG chain in front, e.g. the final prompts sent straight to vLLM (bench.overhead).
    messages: tuple[dict[str, str], ...] | None = None
    temperature: float | None = None  # None: the server's default
    # RAG endpoint only: the conversation before `question`, oldest first, as
    # ({"role": "user" | "assistant", "content": ...}, ...).
    history: tuple[dict[str, str], ...] = ()
    answer_style: str | None = None  # "short" or "explained"; None: the service's default

    def __post_init__(self) -> None:
        if self.messages is not None and self.endpoint != "chat":
            raise ValueError("messages apply to the chat endpoint only")
        if self.history and self.endpoint != "rag":
            raise ValueError("history applies to the rag endpoint only")
        if self.messages is not None and not self.messages:
            raise ValueError("messages must not be empty")


@dataclass
class RequestRecord:
    """What the client saw of one request. Times are ms; `*_at_ms` fields are offsets from
    the run's start, the rest are durations. `send_at_ms` is None for a request never sent."""

    index: int
    endpoint: str
    question: str
    scheduled_at_ms: float | None = None
    send_at_ms: float | None = None
    end_at_ms: float | None = None
    ttft_ms: float | None = None
    itl_ms: list[float] = field(default_factory=list)
    e2e_ms: float | None = None
    output_tokens: int = 0
    content_deltas: int = 0
    usage_completion_tokens: int | None = None
    usage_prompt_tokens: int | None = None
    usage_cached_prompt_tokens: int | None = None
    # The cached tokens by prompt part (system, history, passages, question), where given.
    usage_cached_by_segment: dict[str, int] | None = None
    # Earlier questions sent as the generator saw them (the continued layout), where given.
    usage_continued_turns: int | None = None
    ok: bool = False
    status: int | None = None
    error_kind: str | None = None
    error: str | None = None
    # The OpenAI error body's `code` (HTTP error or stream error event) and the response's
    # Retry-After header, when there were any.
    error_code: str | None = None
    retry_after: str | None = None
    server_timings_ms: dict[str, float] | None = None
    server_tpot_ms: float | None = None
    # Why the answer went out with its context uncompressed (the response's `degraded`).
    degraded: str | None = None
    # With include_context on the chat endpoint: (id, title, text) of each passage the
    # model saw, in prompt order.
    passages: list[tuple[str, str, str]] | None = None
    # The answer's text as streamed (what a client sends back as the next turn's history).
    answer: str = ""


def request_body(spec: RequestSpec) -> dict[str, Any]:
    """The JSON body of a streaming request for `spec` on its endpoint."""
    rag: dict[str, Any] = {}
    if spec.top_k is not None:
        rag["top_k"] = spec.top_k
    compression = {
        key: value
        for key, value in (
            ("method", spec.compression_method),
            ("rate", spec.compression_rate),
            ("policy", spec.compression_policy),
            ("reuse", spec.compression_reuse),
        )
        if value is not None
    }
    if compression:
        rag["compression"] = compression
    if spec.include_context:
        rag["include_context"] = True
    if spec.answer_style is not None:
        rag["answer_style"] = spec.answer_style
    sampling = {} if spec.temperature is None else {"temperature": spec.temperature}
    if spec.endpoint == "rag":
        history = {"history": [dict(turn) for turn in spec.history]} if spec.history else {}
        return {
            "question": spec.question,
            **history,
            "max_tokens": spec.max_tokens,
            "stream": True,
            **sampling,
            **rag,
        }
    messages = (
        [{"role": "user", "content": spec.question}]
        if spec.messages is None
        else [dict(message) for message in spec.messages]
    )
    body: dict[str, Any] = {
        "model": spec.model,
        "messages": messages,
        "max_tokens": spec.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        **sampling,
    }
    if rag:
        body["rag"] = rag
    return body


def poisson_gaps_s(count: int, rate_per_s: float, seed: int) -> list[float]:
    """`count` exponential inter-arrival gaps (mean 1 / rate_per_s) from `random.Random(seed)`."""
    if not 0 < rate_per_s < math.inf:
        raise ValueError(f"rate_per_s must be a positive number, got {rate_per_s}")
    rng = random.Random(seed)
    return [rng.expovariate(rate_per_s) for _ in range(count)]


def arrival_offsets_s(count: int, rate_per_s: float, seed: int) -> list[float]:
    """Send offsets of `count` Poisson arrivals: the first at 0, each next one a gap later."""
    if count <= 0:
        return []
    gaps = poisson_gaps_s(count - 1, rate_per_s, seed)
    return list(itertools.accumulate(gaps, initial=0.0))


def make_client(
    base_url: str,
    *,
    api_key: str | None = None,
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
    transport: httpx.AsyncBaseTransport | None = None,
) -> httpx.AsyncClient:
    """An async client for the service: the bearer key when given, no connection cap (the
    arrival process decides the load, not the pool), and no proxies from the environment, so
    the timings are of the direct path."""
    headers = auth_headers(api_key)
    return httpx.AsyncClient(
        base_url=base_url,
        headers=headers,
        timeout=httpx.Timeout(request_timeout_s, connect=min(10.0, request_timeout_s)),
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
        transport=transport,
        trust_env=False,
    )


async def run_load(
    client: httpx.AsyncClient,
    requests: Sequence[RequestSpec],
    *,
    rate_per_s: float | None,
    concurrency: int | None,
    seed: int,
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
    deadline_s: float | None = None,
    answering: asyncio.Event | None = None,
) -> list[RequestRecord]:
    """Send `requests` in order, Poisson at `rate_per_s` or at a fixed `concurrency` (exactly
    one of the two), and return one record per request, in the same order. `seed` fixes
    the Poisson gaps. Each request gets at most `request_timeout_s`; none is sent, and none
    runs, past `deadline_s` from the start. `answering`, when given, is set as the first
    token of any response arrives (a fault test strikes the generator then, while it holds
    requests). Failures are recorded, never raised or retried."""
    if (rate_per_s is None) == (concurrency is None):
        raise ValueError("give exactly one of rate_per_s and concurrency")
    if rate_per_s is not None and not 0 < rate_per_s < math.inf:
        raise ValueError(f"rate_per_s must be a positive number, got {rate_per_s}")
    if concurrency is not None and concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    if not request_timeout_s > 0:
        raise ValueError(f"request_timeout_s must be positive, got {request_timeout_s}")
    if deadline_s is not None and not deadline_s > 0:
        raise ValueError(f"deadline_s must be positive, got {deadline_s}")
    offsets = None if rate_per_s is None else arrival_offsets_s(len(requests), rate_per_s, seed)
    records = [RequestRecord(i, spec.endpoint, spec.question) for i, spec in enumerate(requests)]
    start = time.perf_counter()
    deadline = math.inf if deadline_s is None else start + deadline_s

    async def send(spec: RequestSpec, record: RequestRecord) -> None:
        budget_s = min(request_timeout_s, deadline - time.perf_counter())
        if budget_s > 0:
            await _send(client, spec, record, start, budget_s, answering)

    async with asyncio.TaskGroup() as group:
        if offsets is not None:
            for spec, record, offset_s in zip(requests, records, offsets, strict=True):
                record.scheduled_at_ms = offset_s * 1000
                if start + offset_s >= deadline:
                    break
                await asyncio.sleep(max(0.0, start + offset_s - time.perf_counter()))
                group.create_task(send(spec, record))
        else:
            gate = asyncio.Semaphore(concurrency or 1)

            async def gated(spec: RequestSpec, record: RequestRecord) -> None:
                async with gate:
                    await send(spec, record)

            for spec, record in zip(requests, records, strict=True):
                group.create_task(gated(spec, record))
    for record in records:
        if record.send_at_ms is None:
            record.error_kind = "not_sent"
            record.error = "the run's deadline passed before it was sent"
    return records


@dataclass
class _Stream:
    """Running state of one response stream."""

    sent_at: float
    answering: asyncio.Event | None = None
    first_at: float | None = None
    last_at: float | None = None
    gaps_s: list[float] = field(default_factory=list)
    deltas: int = 0
    text: list[str] = field(default_factory=list)
    usage_tokens: int | None = None
    prompt_tokens: int | None = None
    cached_prompt_tokens: int | None = None
    cached_by_segment: dict[str, int] | None = None
    continued_turns: int | None = None
    timings_ms: dict[str, float] | None = None
    tpot_ms: float | None = None
    degraded: str | None = None
    titles: dict[str, str] = field(default_factory=dict)
    passages: list[tuple[str, str, str]] | None = None
    ended_at: float | None = None
    complete: bool = False
    error: str | None = None
    error_code: str | None = None

    def content(self, text: object, now: float) -> None:
        if not isinstance(text, str) or not text:
            return
        if self.last_at is None:
            self.first_at = now
            if self.answering is not None:
                self.answering.set()
        else:
            self.gaps_s.append(now - self.last_at)
        self.last_at = now
        self.deltas += 1
        self.text.append(text)

    def context(self, sources: object, rag: object) -> None:
        """Titles from the sources chunk; the passages from the finish chunk's `rag`."""
        if isinstance(sources, list):
            for source in sources:
                if isinstance(source, dict) and "id" in source:
                    self.titles[str(source["id"])] = str(source.get("title", ""))
        passages = rag.get("context") if isinstance(rag, dict) else None
        if isinstance(passages, list):
            self.passages = [
                (str(p["id"]), self.titles.get(str(p["id"]), ""), str(p.get("text", "")))
                for p in passages
                if isinstance(p, dict) and "id" in p
            ]

    def segments(self, split: object) -> None:
        """The cached tokens by prompt part: in the RAG `done` event's usage, or in the
        OpenAI finish chunk's `rag`."""
        if isinstance(split, dict) and all(isinstance(v, int) for v in split.values()):
            self.cached_by_segment = {str(k): v for k, v in split.items()}

    def finals(self, usage: object, rag: object) -> None:
        if isinstance(usage, dict):
            if isinstance(usage.get("completion_tokens"), int):
                self.usage_tokens = usage["completion_tokens"]
            if isinstance(usage.get("prompt_tokens"), int):
                self.prompt_tokens = usage["prompt_tokens"]
            # The RAG `done` event says cached_prompt_tokens; OpenAI usage nests cached_tokens.
            details = usage.get("prompt_tokens_details")
            cached = usage.get(
                "cached_prompt_tokens",
                details.get("cached_tokens") if isinstance(details, dict) else None,
            )
            if isinstance(cached, int):
                self.cached_prompt_tokens = cached
            self.segments(usage.get("cached_prompt_tokens_by_segment"))
            if isinstance(usage.get("continued_turns"), int):
                self.continued_turns = usage["continued_turns"]
        if not isinstance(rag, dict):
            return
        self.segments(rag.get("cached_prompt_tokens_by_segment"))
        timings = rag.get("timings_ms")
        if isinstance(timings, dict):
            self.timings_ms = {
                name: float(timings[name])
                for name in STAGE_NAMES
                if isinstance(timings.get(name), int | float)
            }
        if isinstance(rag.get("tpot_ms"), int | float):
            self.tpot_ms = float(rag["tpot_ms"])
        if isinstance(rag.get("degraded"), str):
            self.degraded = rag["degraded"]


async def _send(
    client: httpx.AsyncClient,
    spec: RequestSpec,
    record: RequestRecord,
    run_start: float,
    budget_s: float,
    answering: asyncio.Event | None = None,
) -> None:
    """Send one request, read its stream within `budget_s`, and fill `record`."""
    sent_at = time.perf_counter()
    record.send_at_ms = (sent_at - run_start) * 1000
    stream = _Stream(sent_at, answering)
    kind: str | None = None
    try:
        async with (
            asyncio.timeout(budget_s),
            client.stream(
                "POST",
                ENDPOINT_PATHS[spec.endpoint],
                json=request_body(spec),
                headers={"accept": "text/event-stream"},
            ) as response,
        ):
            record.status = response.status_code
            record.retry_after = response.headers.get("retry-after")
            if response.status_code != 200:
                kind = f"http_{response.status_code}"
                body = await _read_capped(response)
                stream.error, stream.error_code = _error_message(body), _error_code(body)
            else:
                reader = _read_rag if spec.endpoint == "rag" else _read_chat
                await reader(_sse_events(response.aiter_lines()), stream)
                if stream.error is not None:
                    kind = "stream_error"
                elif not stream.complete:
                    kind = "incomplete"
                    stream.error = "the stream ended before its final event"
    except (TimeoutError, httpx.TimeoutException):
        kind = "timeout"
        stream.error = f"no complete response within {budget_s:.1f} s"
    except httpx.HTTPError as error:
        kind = "transport"
        stream.error = f"{type(error).__name__}: {error}"[:MAX_ERROR_CHARS]
    except ValueError as error:  # malformed JSON in an event
        kind = "protocol"
        stream.error = f"malformed event: {error}"[:MAX_ERROR_CHARS]
    except Exception as error:  # one odd request must not sink the run's other records
        kind = "client_error"
        stream.error = f"{type(error).__name__}: {error}"[:MAX_ERROR_CHARS]
    if kind is not None or stream.ended_at is None:
        stream.ended_at = time.perf_counter()
    _fill(record, stream, stream.ended_at, run_start, kind)


def _fill(
    record: RequestRecord, stream: _Stream, ended_at: float, run_start: float, kind: str | None
) -> None:
    record.end_at_ms = (ended_at - run_start) * 1000
    record.e2e_ms = (ended_at - stream.sent_at) * 1000
    if stream.first_at is not None:
        record.ttft_ms = (stream.first_at - stream.sent_at) * 1000
    record.itl_ms = [gap * 1000 for gap in stream.gaps_s]
    record.content_deltas = stream.deltas
    record.answer = "".join(stream.text)
    record.usage_completion_tokens = stream.usage_tokens
    record.usage_prompt_tokens = stream.prompt_tokens
    record.usage_cached_prompt_tokens = stream.cached_prompt_tokens
    record.usage_cached_by_segment = stream.cached_by_segment
    record.usage_continued_turns = stream.continued_turns
    record.output_tokens = stream.deltas if stream.usage_tokens is None else stream.usage_tokens
    record.server_timings_ms = stream.timings_ms
    record.server_tpot_ms = stream.tpot_ms
    record.degraded = stream.degraded
    record.passages = stream.passages
    record.ok = kind is None
    record.error_kind = kind
    record.error = stream.error
    record.error_code = stream.error_code


async def _read_rag(events: AsyncIterator[tuple[str | None, str]], stream: _Stream) -> None:
    async for name, data in events:
        now = time.perf_counter()
        if data == _DONE:
            stream.ended_at = now
            await _drain(events)
            break
        payload = _json_object(data)
        if name == "delta":
            stream.content(payload.get("text"), now)
        elif name == "done":
            stream.finals(payload.get("usage"), payload)
            stream.complete = True
        elif name == "error":
            stream.error, stream.error_code = _error_message(data), _error_code(data)
            break


async def _read_chat(events: AsyncIterator[tuple[str | None, str]], stream: _Stream) -> None:
    async for _, data in events:
        now = time.perf_counter()
        if data == _DONE:
            stream.ended_at = now
            stream.complete = True
            await _drain(events)
            break
        payload = _json_object(data)
        if "error" in payload:
            stream.error, stream.error_code = _error_message(data), _error_code(data)
            break
        for choice in payload.get("choices") or []:
            if isinstance(choice, dict) and isinstance(choice.get("delta"), dict):
                stream.content(choice["delta"].get("content"), now)
        stream.finals(payload.get("usage"), payload.get("rag"))
        stream.context(payload.get("sources"), payload.get("rag"))


async def _drain(events: AsyncIterator[tuple[str | None, str]]) -> None:
    """Read what follows [DONE], so HTTP/1.1 can reuse the connection for the next request.
    A server that holds the stream open only costs the connection: the request is done."""
    try:
        async with asyncio.timeout(DRAIN_TIMEOUT_S):
            async for _ in events:
                pass
    except (TimeoutError, httpx.HTTPError):
        pass


async def _sse_events(lines: AsyncIterator[str]) -> AsyncIterator[tuple[str | None, str]]:
    """(event name or None, data) for each server-sent event, as its blank line arrives."""
    name: str | None = None
    data: list[str] = []
    async for raw in lines:
        line = raw.rstrip("\r\n")
        if not line:
            if data:
                yield name, "\n".join(data)
            name, data = None, []
            continue
        if line.startswith(":"):
            continue
        key, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if key == "event":
            name = value
        elif key == "data":
            data.append(value)
    if data:
        yield name, "\n".join(data)


def _json_object(data: str) -> dict[str, Any]:
    payload = json.loads(data)
    if not isinstance(payload, dict):
        raise ValueError(f"expected a JSON object, got {data[:80]!r}")
    return payload


async def _read_capped(response: httpx.Response) -> str:
    body = b""
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) >= MAX_ERROR_CHARS * 4:
            break
    return body.decode("utf-8", errors="replace")


def _error_message(body: str) -> str:
    """The message of an OpenAI-shaped error body (and its code), else the body, cut short."""
    error = openai_error(body) or {}
    if not error.get("message"):
        return body[:MAX_ERROR_CHARS]
    code = error.get("code") or error.get("type")
    return (f"{error['message']} [{code}]" if code else str(error["message"]))[:MAX_ERROR_CHARS]


def _error_code(body: str) -> str | None:
    """The `code` of an OpenAI-shaped error body, if it has one."""
    code = (openai_error(body) or {}).get("code")
    return code if isinstance(code, str) else None
