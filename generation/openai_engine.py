"""Chat completions from any OpenAI-compatible server, as typed events.

For teams that already run their engine outside Ray (TGI, TensorRT-LLM's OpenAI frontend,
SGLang, a vLLM fleet): the prompt is the pipeline's own `messages` (static system prompt
first, so the server's prefix cache holds it), streamed from `/chat/completions` with
`stream_options.include_usage`, and read back into `TokenEvent`s and one `FinishEvent`, as
`generation.vllm_engine` does for the in-Ray engine.

Failures become the same `StageError`s the in-Ray engine gives: a server that cannot be
reached, or says it is overloaded, is a retryable 503; a server that stops answering is a
504; the request's own fault (a prompt past the context window) keeps its 400; anything
else the server does wrong is a 502, its details logged, never sent to the client.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from pipeline.log import get_logger
from pipeline.messages import (
    ErrorEvent,
    FinishEvent,
    GenerationEvent,
    GenerationRequest,
    Sampling,
    StageError,
    TokenEvent,
    TokenLogprob,
    TokenUsage,
)

logger = get_logger(__name__)

# Tokens of a chat prompt as the served model's chat template renders it.
PromptCounter = Callable[[Sequence[dict[str, str]]], int]

# Status codes of the server that mean "try again later", not "this request is wrong".
_RETRYABLE = frozenset({408, 429, 502, 503, 504})
# Status codes that blame the request (the client's max_tokens, a prompt too long).
_REQUEST_FAULT = frozenset({400, 413, 422})


@dataclass(frozen=True)
class OpenAIEndpoint:
    """Where the server is and what to ask it for."""

    base_url: str  # up to and including /v1
    model: str  # the model's name on that server
    api_key: str | None = None


class OpenAIEngine:
    """One `httpx.AsyncClient` (a connection pool) per engine; `count_prompt` counts the
    prompt with the served model's tokenizer, to refuse a prompt that cannot fit before it
    is sent and to report usage when the server gives none."""

    def __init__(
        self,
        endpoint: OpenAIEndpoint,
        client: httpx.AsyncClient,
        count_prompt: PromptCounter,
        max_model_len: int,
    ) -> None:
        self._endpoint = endpoint
        self._client = client
        self._count_prompt = count_prompt
        self._max_model_len = max_model_len
        self._url = endpoint.base_url.rstrip("/") + "/chat/completions"
        self._headers = {"Accept": "text/event-stream"}
        if endpoint.api_key:
            self._headers["Authorization"] = f"Bearer {endpoint.api_key}"

    async def stream(self, request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        prompt_tokens = self._count_prompt(request.messages)
        if prompt_tokens + request.max_tokens > self._max_model_len:
            yield ErrorEvent(
                StageError(
                    400,
                    f"the prompt ({prompt_tokens} tokens) and max_tokens={request.max_tokens} "
                    f"exceed the model's {self._max_model_len}-token context",
                    param="max_tokens",
                    code="context_length_exceeded",
                )
            )
            return
        body = {
            "model": self._endpoint.model,
            "messages": request.messages,
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
            **sampling_fields(request.sampling),
        }
        headers = {**self._headers, "X-Request-Id": request.request_id}
        reader = _StreamReader(prompt_tokens)
        try:
            async with self._client.stream("POST", self._url, json=body, headers=headers) as reply:
                if reply.status_code != 200:
                    await reply.aread()
                    yield ErrorEvent(_refused(reply, request.request_id))
                    return
                async for line in reply.aiter_lines():
                    for event in reader.feed(line):
                        yield event
                        if isinstance(event, ErrorEvent):
                            return
                    if reader.done:  # what a server sends after [DONE] is not waited for
                        break
        except httpx.TimeoutException as exc:
            yield ErrorEvent(_timed_out(exc, reader.tokens_seen, request.request_id))
            return
        except httpx.TransportError as exc:
            logger.warning("the generation server failed (request %s): %s", request.request_id, exc)
            yield ErrorEvent(
                StageError(
                    503,
                    "the generation server cannot be reached",
                    "service_unavailable",
                    code="engine_unreachable",
                )
            )
            return
        if finish := reader.finish():
            yield finish

    async def check_health(self) -> None:
        """Always healthy: replacing this replica cannot mend a server elsewhere. A server
        that cannot be reached fails each request at once with a retryable 503 instead."""
        return None

    async def served_models(self) -> list[dict[str, Any]]:
        """The server's `/models` list (for a start-up check); raises on any failure."""
        headers = {k: v for k, v in self._headers.items() if k == "Authorization"}
        reply = await self._client.get(
            self._endpoint.base_url.rstrip("/") + "/models", headers=headers
        )
        reply.raise_for_status()
        return list(reply.json().get("data", []))

    async def aclose(self) -> None:
        await self._client.aclose()


class _StreamReader:
    """Turns the server-sent lines of one streamed chat completion into events.

    Text comes as `choices[0].delta.content`; the finish reason with the last choice; usage
    (with `prompt_tokens_details.cached_tokens` where the server reports it) in a final
    chunk with no choices. A server that sends no usage gets it counted here: the prompt
    with the tokenizer, the completion as one token per content chunk (what vLLM, TGI and
    SGLang send when streaming)."""

    def __init__(self, prompt_tokens: int) -> None:
        self._prompt_tokens = prompt_tokens
        self.tokens_seen = 0
        self._reason: str | None = None
        self._usage: TokenUsage | None = None
        self.done = False

    def feed(self, line: str) -> list[GenerationEvent]:
        if not line.startswith("data:") or self.done:
            return []
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            self.done = True
            return []
        try:
            chunk = json.loads(data)
        except json.JSONDecodeError:
            return [ErrorEvent(_bad_server("a stream chunk that is not JSON", data))]
        if not isinstance(chunk, dict):
            return [ErrorEvent(_bad_server("a stream chunk that is not an object", data))]
        if "error" in chunk or chunk.get("object") == "error":
            return [ErrorEvent(_bad_server("an error in the stream", data))]
        try:
            return self._read(chunk)
        except (AttributeError, TypeError, ValueError):
            return [ErrorEvent(_bad_server("a stream chunk of the wrong shape", data))]

    def _read(self, chunk: dict[str, Any]) -> list[GenerationEvent]:
        if usage := chunk.get("usage"):
            self._usage = _usage_of(usage)
        events: list[GenerationEvent] = []
        for choice in chunk.get("choices") or ():
            text = (choice.get("delta") or {}).get("content")
            logprobs = _logprobs_of(choice.get("logprobs"))
            if text or logprobs:
                self.tokens_seen += 1
                events.append(TokenEvent(str(text or ""), logprobs))
            if choice.get("finish_reason"):
                self._reason = str(choice["finish_reason"])
        return events

    def finish(self) -> FinishEvent | None:
        """The FinishEvent once the server said why it stopped; None for a stream cut short
        (the pipeline reports that as a failed generation)."""
        if self._reason is None:
            return None
        usage = self._usage or TokenUsage(self._prompt_tokens, self.tokens_seen, 0)
        return FinishEvent(self._reason, usage)


def sampling_fields(sampling: Sampling) -> dict[str, Any]:
    """The chat request's fields for what a request set beyond the defaults."""
    fields: dict[str, Any] = sampling.set_fields()
    if sampling.logit_bias:
        fields["logit_bias"] = {str(token): bias for token, bias in sampling.logit_bias}
    if sampling.logprobs:
        fields["logprobs"] = True
        fields["top_logprobs"] = sampling.top_logprobs
    output = sampling.output
    if output.kind == "json_object":
        fields["response_format"] = {"type": "json_object"}
    elif output.kind == "json_schema":
        schema = {"name": "answer", "schema": output.schema, "strict": True}
        fields["response_format"] = {"type": "json_schema", "json_schema": schema}
    return fields


def _logprobs_of(logprobs: dict[str, Any] | None) -> tuple[TokenLogprob, ...]:
    if not logprobs:
        return ()
    return tuple(
        TokenLogprob(
            str(item["token"]),
            float(item["logprob"]),
            tuple((str(t["token"]), float(t["logprob"])) for t in item.get("top_logprobs") or ()),
        )
        for item in logprobs.get("content") or ()
    )


def _usage_of(usage: dict[str, Any]) -> TokenUsage:
    details = usage.get("prompt_tokens_details") or {}
    return TokenUsage(
        int(usage.get("prompt_tokens") or 0),
        int(usage.get("completion_tokens") or 0),
        int(details.get("cached_tokens") or 0),
    )


def _refused(reply: httpx.Response, request_id: str) -> StageError:
    """The server answered the request with an error status."""
    status, message = reply.status_code, _error_message(reply)
    if status in _REQUEST_FAULT:
        lowered = message.lower()
        # vLLM and SGLang say "maximum context length"; TGI names its max_new_tokens.
        fits = ("context" in lowered and "length" in lowered) or "max_new_tokens" in lowered
        code = "context_length_exceeded" if fits else "invalid_generation_request"
        return StageError(400, message, param="max_tokens" if fits else None, code=code)
    logger.warning(
        "the generation server answered %d (request %s): %s", status, request_id, message
    )
    if status in _RETRYABLE:
        return StageError(
            503,
            "the generation server is overloaded or unavailable",
            "service_unavailable",
            code="engine_overloaded",
        )
    # 401/403/404 are this service's configuration (key, model name), 5xx the server's.
    return StageError(502, f"the generation server answered {status}", "server_error")


def _timed_out(exc: httpx.TimeoutException, tokens_seen: int, request_id: str) -> StageError:
    logger.warning(
        "the generation server timed out after %d tokens (request %s): %s",
        tokens_seen,
        request_id,
        type(exc).__name__,
    )
    if isinstance(exc, httpx.ConnectTimeout | httpx.PoolTimeout):
        return StageError(
            503,
            "the generation server cannot be reached",
            "service_unavailable",
            code="engine_unreachable",
        )
    return StageError(504, "the generation server stopped answering", "timeout", code="timeout")


def _bad_server(what: str, data: str) -> StageError:
    logger.warning("the generation server sent %s: %.300s", what, data)
    return StageError(502, f"the generation server sent {what}", "server_error")


def _error_message(reply: httpx.Response) -> str:
    """The error's message in OpenAI's shape (`{"error": {"message"}}`), vLLM's older flat
    shape (`{"message"}`), or the body's first 300 characters."""
    try:
        body = reply.json()
    except ValueError:
        return reply.text[:300]
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if isinstance(error, str):
            return error
        if body.get("message"):
            return str(body["message"])
    return reply.text[:300]
