"""The OpenAI chat-completions face of the pipeline: the question in, `chat.completion` out.

Only the last user message is the question; the system prompt is the service's own (it
is what the prefix cache holds), so client system messages and earlier turns are not sent
to the model. Sources ride along in an extra `sources` field.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from app.errors import bad_request, error_body
from app.pipeline import DoneEvent, ErrorEvent, PipelineEvent, RagQuery, RagResult, SourcesEvent
from app.rag_format import Renderer
from app.schemas import ChatCompletionRequest


def question_of(body: ChatCompletionRequest) -> str:
    """Text of the last user message (string content or text parts)."""
    for message in reversed(body.messages):
        if message.role != "user":
            continue
        if isinstance(message.content, str):
            return message.content
        parts = message.content or []
        return " ".join(str(p.get("text", "")) for p in parts if p.get("type") == "text")
    raise bad_request("messages must contain a user message", param="messages")


def usage_body(result: RagResult) -> dict:
    usage = result.usage
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_prompt_tokens},
    }


def completion_body(result: RagResult, model: str, created: int) -> dict:
    return {
        "id": f"chatcmpl-{result.id}",
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": result.answer},
                "finish_reason": result.finish_reason or "stop",
            }
        ],
        "usage": usage_body(result),
        "sources": [source.model_dump() for source in result.sources],
        "rag": _rag_extras(result),
    }


def sse_chunks(query: RagQuery, model: str, created: int, include_usage: bool) -> Renderer:
    chunk_id = f"chatcmpl-{query.request_id}"

    def chunk(delta: dict, finish_reason: str | None = None, **extra) -> str:
        body = {
            "id": chunk_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
            **extra,
        }
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

    async def render(events: AsyncIterator[PipelineEvent]) -> AsyncIterator[str]:
        async for event in events:
            if isinstance(event, SourcesEvent):
                sources = [source.model_dump() for source in event.sources]
                yield chunk({"role": "assistant", "content": ""}, sources=sources)
            elif isinstance(event, DoneEvent):
                result = event.result
                yield chunk({}, result.finish_reason or "stop", rag=_rag_extras(result))
                if include_usage:
                    yield _usage_chunk(chunk_id, created, model, result)
            elif isinstance(event, ErrorEvent):
                yield f"data: {json.dumps(error_body(event.error, query.request_id))}\n\n"
                break
            else:
                yield chunk({"content": event.text})
        yield "data: [DONE]\n\n"

    return render


def _usage_chunk(chunk_id: str, created: int, model: str, result: RagResult) -> str:
    body = {
        "id": chunk_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage_body(result),
    }
    return f"data: {json.dumps(body)}\n\n"


def _rag_extras(result: RagResult) -> dict:
    return {
        "compression_method": result.compression_method,
        "context_tokens_before": result.usage.context_tokens_before,
        "context_tokens_after": result.usage.context_tokens_after,
        "context_truncated": result.context_truncated,
        "timings_ms": result.timings_ms.model_dump(),
        "tpot_ms": result.tpot_ms,
        "context": None if result.context is None else [c.model_dump() for c in result.context],
    }
