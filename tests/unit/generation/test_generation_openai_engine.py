"""generation.openai_engine.OpenAIEngine: the chat completion it asks an OpenAI-compatible
server for, how it reads the server-sent stream back into typed events, and how the server's
failures become ErrorEvents.

The server is an `httpx.MockTransport` handler answering with bytes shaped like vLLM's
`/v1/chat/completions` stream: this is a test of the request, the parsing and the error
mapping; tests/integration talks to a real server. Prompt tokens are counted as
whitespace-separated words, so MESSAGES is 8 tokens.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from generation.openai_engine import OpenAIEndpoint, OpenAIEngine
from pipeline.messages import (
    ErrorEvent,
    FinishEvent,
    GenerationEvent,
    GenerationRequest,
    StageError,
    TokenEvent,
    TokenUsage,
)

BASE_URL = "http://llm.internal:8000/v1"
MODEL = "served-model"
MESSAGES = [
    {"role": "system", "content": "Answer from the sources."},
    {"role": "user", "content": "What is paged attention?"},
]
PROMPT_TOKENS = 8
MAX_MODEL_LEN = 64

UNREACHABLE = StageError(
    503, "the generation server cannot be reached", "service_unavailable", code="engine_unreachable"
)
OVERLOADED = StageError(
    503,
    "the generation server is overloaded or unavailable",
    "service_unavailable",
    code="engine_overloaded",
)
TIMED_OUT = StageError(504, "the generation server stopped answering", "timeout", code="timeout")


def count_words(messages: Sequence[dict[str, str]]) -> int:
    return sum(len(message["content"].split()) for message in messages)


def chunk(
    content: str | None = None, *, role: str | None = None, finish: str | None = None
) -> dict[str, Any]:
    """One `chat.completion.chunk` with one choice, as vLLM streams it (`usage: null`)."""
    delta: dict[str, Any] = {}
    if role is not None:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        "usage": None,
    }


def usage_chunk(prompt: int, completion: int, cached: int | None = None) -> dict[str, Any]:
    """The last chunk `stream_options.include_usage` asks for: no choices, only usage."""
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [], "usage": usage}


def sse(*items: dict[str, Any] | str) -> bytes:
    """Server-sent events, one `data:` line each; a str is sent as it is (e.g. "[DONE]")."""
    lines = (item if isinstance(item, str) else json.dumps(item) for item in items)
    return "".join(f"data: {line}\n\n" for line in lines).encode()


async def then_raise(body: bytes, error: Exception) -> AsyncIterator[bytes]:
    """A streamed body that sends `body`, then fails the next read with `error`."""
    yield body
    raise error


@dataclass
class FakeServer:
    """Answers every request with `status` and `body`, or raises `error` (no connection);
    records each request it gets."""

    status: int = 200
    body: bytes | AsyncIterator[bytes] = b""
    error: Exception | None = None
    requests: list[httpx.Request] = field(default_factory=list)

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.error is not None:
            raise self.error
        return httpx.Response(self.status, content=self.body)


def request(max_tokens: int = 16, temperature: float = 0.7) -> GenerationRequest:
    return GenerationRequest(MESSAGES, max_tokens, temperature, "req-1")


def make_engine(
    server: FakeServer, api_key: str | None = None, base_url: str = BASE_URL
) -> OpenAIEngine:
    client = httpx.AsyncClient(transport=httpx.MockTransport(server.handle))
    return OpenAIEngine(
        OpenAIEndpoint(base_url, MODEL, api_key), client, count_words, MAX_MODEL_LEN
    )


def stream(
    server: FakeServer,
    generation: GenerationRequest | None = None,
    api_key: str | None = None,
    base_url: str = BASE_URL,
) -> list[GenerationEvent]:
    async def drain() -> list[GenerationEvent]:
        engine = make_engine(server, api_key, base_url)
        try:
            return [event async for event in engine.stream(generation or request())]
        finally:
            await engine.aclose()

    return asyncio.run(drain())


def answering(*items: dict[str, Any] | str) -> FakeServer:
    return FakeServer(body=sse(*items))


def refusing(status: int, body: dict[str, Any] | str) -> FakeServer:
    text = body if isinstance(body, str) else json.dumps(body)
    return FakeServer(status=status, body=text.encode())


A_FULL_ANSWER = (
    chunk("", role="assistant"),
    chunk("Paged"),
    chunk(" attention"),
    chunk(finish="stop"),
    usage_chunk(PROMPT_TOKENS, 2, cached=4),
    "[DONE]",
)


# --- the request ----------------------------------------------------------------------------


def test_the_request_streams_the_messages_unchanged_and_asks_for_usage():
    server = answering(*A_FULL_ANSWER)

    stream(server, request(max_tokens=32, temperature=0.2))

    [sent] = server.requests
    assert (sent.method, str(sent.url)) == ("POST", f"{BASE_URL}/chat/completions")
    assert json.loads(sent.content) == {
        "model": MODEL,
        "messages": MESSAGES,
        "max_tokens": 32,
        "temperature": 0.2,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    assert sent.headers["Accept"] == "text/event-stream"
    assert sent.headers["X-Request-Id"] == "req-1"


def test_the_requests_sampling_is_sent_in_openais_fields():
    from pipeline.messages import OutputFormat, Sampling

    schema = {"type": "object"}
    sampling = Sampling(
        top_p=0.5, stop=("END",), seed=9, presence_penalty=0.1, frequency_penalty=0.2,
        logit_bias=((13, -100.0),), logprobs=True, top_logprobs=2,
        output=OutputFormat("json_schema", schema),
    )  # fmt: skip
    server = answering(*A_FULL_ANSWER)

    stream(server, GenerationRequest(MESSAGES, 16, 0.7, "req-1", sampling=sampling))

    sent = json.loads(server.requests[0].content)
    assert {key: sent[key] for key in sent if key not in ("model", "messages", "stream")} == {
        "max_tokens": 16,
        "temperature": 0.7,
        "stream_options": {"include_usage": True},
        "top_p": 0.5,
        "stop": ["END"],
        "seed": 9,
        "presence_penalty": 0.1,
        "frequency_penalty": 0.2,
        "logit_bias": {"13": -100.0},
        "logprobs": True,
        "top_logprobs": 2,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": schema, "strict": True},
        },
    }


def test_logprobs_in_the_stream_ride_on_their_tokens():
    from pipeline.messages import TokenLogprob

    logprobs = {"content": [{"token": "Paged", "logprob": -0.5, "top_logprobs": [
        {"token": "Paged", "logprob": -0.5}, {"token": "Page", "logprob": -1.5}]}]}  # fmt: skip
    with_logprobs = chunk("Paged")
    with_logprobs["choices"][0]["logprobs"] = logprobs

    events = stream(answering(with_logprobs, chunk(finish="stop"), "[DONE]"))

    assert events[0] == TokenEvent(
        "Paged", (TokenLogprob("Paged", -0.5, (("Paged", -0.5), ("Page", -1.5))),)
    )


def test_the_api_key_is_sent_as_a_bearer_token():
    server = answering(*A_FULL_ANSWER)

    stream(server, api_key="sk-secret")

    assert server.requests[0].headers["Authorization"] == "Bearer sk-secret"


@pytest.mark.parametrize("api_key", [None, ""])
def test_no_authorization_header_is_sent_without_a_key(api_key):
    server = answering(*A_FULL_ANSWER)

    stream(server, api_key=api_key)

    assert "Authorization" not in server.requests[0].headers


@pytest.mark.parametrize("base_url", [BASE_URL, f"{BASE_URL}/"])
def test_the_base_url_with_or_without_a_trailing_slash_reaches_chat_completions(base_url):
    server = answering(*A_FULL_ANSWER)

    stream(server, base_url=base_url)

    assert server.requests[0].url.path == "/v1/chat/completions"


# --- reading the stream ---------------------------------------------------------------------


def test_text_deltas_become_tokens_in_order_then_a_finish_with_the_server_usage():
    events = stream(answering(*A_FULL_ANSWER))

    assert events == [
        TokenEvent("Paged"),
        TokenEvent(" attention"),
        FinishEvent("stop", TokenUsage(PROMPT_TOKENS, 2, 4)),
    ]


def test_role_only_empty_and_null_content_chunks_give_no_tokens():
    no_delta = {"id": "chatcmpl-1", "choices": [{"index": 0, "finish_reason": None}]}
    no_choices = {"id": "chatcmpl-1", "choices": None}

    events = stream(
        answering(
            chunk(role="assistant"),
            chunk(""),
            {**chunk(), "choices": [{"index": 0, "delta": {"content": None}}]},
            no_delta,
            no_choices,
            chunk("Hi"),
            chunk(finish="length"),
            usage_chunk(PROMPT_TOKENS, 1),
            "[DONE]",
        )
    )

    assert events == [TokenEvent("Hi"), FinishEvent("length", TokenUsage(PROMPT_TOKENS, 1, 0))]


def test_the_finish_reason_may_come_with_the_last_text():
    events = stream(answering(chunk("Hi", finish="stop"), usage_chunk(9, 1), "[DONE]"))

    assert events == [TokenEvent("Hi"), FinishEvent("stop", TokenUsage(9, 1, 0))]


def test_the_server_usage_wins_over_the_local_count():
    # The server counts with its own tokenizer and knows the cache; ours is only a fallback.
    events = stream(answering(chunk("Hi"), chunk(finish="stop"), usage_chunk(300, 7, 256)))

    assert events[-1] == FinishEvent("stop", TokenUsage(300, 7, 256))


def test_a_server_without_usage_gets_it_counted_here():
    events = stream(
        answering(chunk("Paged"), chunk(" attention"), chunk("."), chunk(finish="stop"), "[DONE]")
    )

    # The prompt with the tokenizer; the completion as one token per content chunk.
    assert events[-1] == FinishEvent("stop", TokenUsage(PROMPT_TOKENS, 3, 0))


@pytest.mark.parametrize(
    "ending",
    [
        pytest.param(("[DONE]",), id="done"),
        pytest.param((usage_chunk(PROMPT_TOKENS, 1), "[DONE]"), id="usage-then-done"),
        pytest.param((), id="closed"),
    ],
)
def test_a_stream_that_ends_without_a_finish_reason_gives_no_finish(ending):
    events = stream(answering(chunk("Hi"), *ending))

    assert events == [TokenEvent("Hi")]


def test_comment_blank_and_event_lines_are_ignored():
    body = (
        b": keep-alive\n\n"
        b"event: message\n"
        b"id: 1\n"
        b"data: " + json.dumps(chunk("Hi")).encode() + b"\n"
        b"\n\n"
        b"retry: 1000\n"
        b"data:" + json.dumps(chunk(finish="stop")).encode() + b"\n\n"
        b"data: [DONE]\n\n"
    )

    events = stream(FakeServer(body=body))

    assert events == [TokenEvent("Hi"), FinishEvent("stop", TokenUsage(PROMPT_TOKENS, 1, 0))]


def test_lines_split_across_network_reads_are_joined():
    body = sse(*A_FULL_ANSWER)

    async def in_pieces() -> AsyncIterator[bytes]:
        for start in range(0, len(body), 7):
            yield body[start : start + 7]

    assert stream(FakeServer(body=in_pieces())) == stream(answering(*A_FULL_ANSWER))


def test_data_after_done_is_ignored():
    events = stream(
        answering(chunk("Hi"), chunk(finish="stop"), "[DONE]", chunk(" more"), "not json")
    )

    assert events == [TokenEvent("Hi"), FinishEvent("stop", TokenUsage(PROMPT_TOKENS, 1, 0))]


def test_nothing_after_done_is_read():
    body = sse(chunk("Hi"), chunk(finish="stop"), "[DONE]")
    server = FakeServer(body=then_raise(body, httpx.ReadTimeout("the server stopped answering")))

    events = stream(server)

    assert events == [TokenEvent("Hi"), FinishEvent("stop", TokenUsage(PROMPT_TOKENS, 1, 0))]


# --- the context window ---------------------------------------------------------------------


def test_a_prompt_that_cannot_fit_is_refused_without_calling_the_server():
    server = answering(*A_FULL_ANSWER)
    max_tokens = MAX_MODEL_LEN - PROMPT_TOKENS + 1

    events = stream(server, request(max_tokens=max_tokens))

    assert events == [
        ErrorEvent(
            StageError(
                400,
                f"the prompt ({PROMPT_TOKENS} tokens) and max_tokens={max_tokens} exceed the "
                f"model's {MAX_MODEL_LEN}-token context",
                param="max_tokens",
                code="context_length_exceeded",
            )
        )
    ]
    assert server.requests == []


def test_a_prompt_that_exactly_fills_the_context_is_sent():
    server = answering(*A_FULL_ANSWER)

    events = stream(server, request(max_tokens=MAX_MODEL_LEN - PROMPT_TOKENS))

    assert len(server.requests) == 1
    assert isinstance(events[-1], FinishEvent)


# --- the server's refusals ------------------------------------------------------------------

VLLM_TOO_LONG = (
    "This model's maximum context length is 2048 tokens. However, you requested 2600 tokens "
    "(2100 in the messages, 500 in the completion). Please reduce the length of the messages "
    "or completion."
)


@pytest.mark.parametrize(
    ("status", "body"),
    [
        pytest.param(
            400,
            {"error": {"message": VLLM_TOO_LONG, "type": "BadRequestError", "code": 400}},
            id="openai-shape",
        ),
        pytest.param(
            400,
            {"object": "error", "message": VLLM_TOO_LONG, "type": "BadRequestError"},
            id="vllm-flat-shape",
        ),
        pytest.param(422, {"message": VLLM_TOO_LONG}, id="422"),
        pytest.param(413, {"error": VLLM_TOO_LONG}, id="413-string-error"),
    ],
)
def test_a_prompt_the_server_finds_too_long_keeps_its_400_and_message(status, body):
    events = stream(refusing(status, body))

    assert events == [
        ErrorEvent(
            StageError(400, VLLM_TOO_LONG, param="max_tokens", code="context_length_exceeded")
        )
    ]


@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        pytest.param(
            400,
            {"error": {"message": "temperature must be at most 2", "type": "BadRequestError"}},
            "temperature must be at most 2",
            id="openai-shape",
        ),
        pytest.param(
            422,
            {"object": "error", "message": "max_tokens must be at least 1"},
            "max_tokens must be at least 1",
            id="vllm-flat-shape",
        ),
        pytest.param(400, "bad request", "bad request", id="plain-text"),
    ],
)
def test_another_request_the_server_refuses_keeps_its_400_and_message(status, body, message):
    events = stream(refusing(status, body))

    assert events == [ErrorEvent(StageError(400, message, code="invalid_generation_request"))]


@pytest.mark.parametrize("status", [429, 503, 408, 502, 504])
def test_an_overloaded_server_is_a_retryable_503(status):
    events = stream(refusing(status, {"error": {"message": "queue full: 4096 waiting"}}))

    assert events == [ErrorEvent(OVERLOADED)]


@pytest.mark.parametrize("status", [401, 403, 404, 500])
def test_other_server_errors_are_a_502_that_does_not_pass_the_body_on(status):
    secret = "The model `served-model` does not exist; key sk-leaked rejected at /srv/app.py"

    [event] = stream(refusing(status, {"error": {"message": secret, "type": "NotFoundError"}}))

    assert event == ErrorEvent(
        StageError(502, f"the generation server answered {status}", "server_error")
    )
    assert "sk-leaked" not in event.error.message


# --- transport failures ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [
        httpx.ConnectError("[Errno 111] Connection refused"),
        httpx.ConnectTimeout("timed out"),
        httpx.PoolTimeout("no free connection"),
    ],
    ids=lambda error: type(error).__name__,
)
def test_a_server_that_cannot_be_reached_is_a_retryable_503(error):
    events = stream(FakeServer(error=error))

    assert events == [ErrorEvent(UNREACHABLE)]


def test_a_connection_lost_mid_stream_ends_the_stream_with_an_error():
    body = sse(chunk("Hi"))
    error = httpx.RemoteProtocolError("peer closed connection")

    events = stream(FakeServer(body=then_raise(body, error)))

    assert events == [TokenEvent("Hi"), ErrorEvent(UNREACHABLE)]


def test_a_server_that_stops_answering_before_the_first_token_is_a_504():
    events = stream(FakeServer(error=httpx.ReadTimeout("timed out")))

    assert events == [ErrorEvent(TIMED_OUT)]


def test_a_server_that_stops_answering_mid_stream_is_a_504_after_the_tokens_sent():
    body = sse(chunk("Paged"), chunk(" attention"))

    events = stream(FakeServer(body=then_raise(body, httpx.ReadTimeout("timed out"))))

    assert events == [TokenEvent("Paged"), TokenEvent(" attention"), ErrorEvent(TIMED_OUT)]


# --- a server that misbehaves inside the stream ---------------------------------------------


@pytest.mark.parametrize(
    "error_chunk",
    [
        pytest.param(
            {"error": {"message": "CUDA out of memory at /srv/worker.py", "code": 500}},
            id="openai-shape",
        ),
        pytest.param(
            {"object": "error", "message": "CUDA out of memory at /srv/worker.py"},
            id="vllm-flat-shape",
        ),
    ],
)
def test_an_error_in_the_stream_is_a_502_and_nothing_after_it_is_read(error_chunk):
    body = sse(chunk("Hi"), error_chunk, chunk(" more"), chunk(finish="stop"))
    # Reading past the error would raise the timeout and show as a 504.
    server = FakeServer(body=then_raise(body, httpx.ReadTimeout("timed out")))

    events = stream(server)

    assert events == [
        TokenEvent("Hi"),
        ErrorEvent(
            StageError(502, "the generation server sent an error in the stream", "server_error")
        ),
    ]


@pytest.mark.parametrize(
    ("data", "what"),
    [
        pytest.param("{not json", "a stream chunk that is not JSON", id="not-json"),
        pytest.param("[1, 2]", "a stream chunk that is not an object", id="not-an-object"),
    ],
)
def test_a_chunk_that_is_not_a_json_object_is_a_502_and_ends_the_stream(data, what):
    events = stream(answering(chunk("Hi"), data, chunk(" more"), chunk(finish="stop")))

    assert events == [
        TokenEvent("Hi"),
        ErrorEvent(StageError(502, f"the generation server sent {what}", "server_error")),
    ]


@pytest.mark.parametrize(
    "bad_chunk",
    [
        pytest.param({"choices": [{"index": 0, "delta": "Hi"}]}, id="delta-not-an-object"),
        pytest.param({"choices": ["Hi"]}, id="choice-not-an-object"),
        pytest.param({"choices": [], "usage": {"prompt_tokens": "n/a"}}, id="usage-not-numbers"),
    ],
)
def test_a_chunk_of_the_wrong_shape_is_a_502(bad_chunk):
    events = stream(answering(chunk("Hi"), bad_chunk, chunk(finish="stop")))

    assert events[0] == TokenEvent("Hi")
    assert isinstance(events[-1], ErrorEvent)
    assert events[-1].error.status == 502


# --- served models and health ---------------------------------------------------------------


def test_served_models_reads_the_models_list_with_the_key():
    listing = {"object": "list", "data": [{"id": MODEL, "object": "model"}, {"id": "other"}]}
    server = FakeServer(body=json.dumps(listing).encode())

    async def models() -> list[dict[str, Any]]:
        engine = make_engine(server, api_key="sk-secret", base_url=f"{BASE_URL}/")
        return await engine.served_models()

    assert asyncio.run(models()) == listing["data"]
    [sent] = server.requests
    assert (sent.method, str(sent.url)) == ("GET", f"{BASE_URL}/models")
    assert sent.headers["Authorization"] == "Bearer sk-secret"


def test_served_models_raises_when_the_server_refuses():
    server = refusing(401, {"error": {"message": "bad key"}})

    with pytest.raises(httpx.HTTPStatusError):
        asyncio.run(make_engine(server).served_models())


def test_health_does_not_depend_on_the_server():
    # Replacing the replica cannot mend a server elsewhere; requests fail with a 503 instead.
    server = FakeServer(error=httpx.ConnectError("[Errno 111] Connection refused"))

    assert asyncio.run(make_engine(server).check_health()) is None
    assert server.requests == []
