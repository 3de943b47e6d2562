"""Rendering of /v1/rag/query results: one JSON body, or server-sent events.

Stream: `event: sources`, then `event: delta` per token piece, then `event: done` with the
whole result (usage and timings), then `data: [DONE]`. A failure after the first token is
sent as `event: error` with the OpenAI error body.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable

from app.errors import error_body
from app.pipeline import DoneEvent, ErrorEvent, PipelineEvent, RagQuery, RagResult, SourcesEvent

Renderer = Callable[[AsyncIterator[PipelineEvent]], AsyncIterator[str]]


def response_body(result: RagResult) -> dict:
    return result.model_dump()


def sse_events(query: RagQuery) -> Renderer:
    async def render(events: AsyncIterator[PipelineEvent]) -> AsyncIterator[str]:
        async for event in events:
            if isinstance(event, SourcesEvent):
                prepared = event.prepared
                yield _sse("sources", {
                    "id": query.request_id,
                    "sources": [source.model_dump() for source in event.sources],
                    "compression_method": prepared.method,
                    "context_tokens_before": prepared.context_tokens_before,
                    "context_tokens_after": prepared.context_tokens_after,
                })  # fmt: skip
            elif isinstance(event, DoneEvent):
                yield _sse("done", response_body(event.result))
            elif isinstance(event, ErrorEvent):
                yield _sse("error", error_body(event.error, query.request_id))
                break
            else:
                yield _sse("delta", {"text": event.text})
        yield "data: [DONE]\n\n"

    return render


def _sse(event: str, data: dict) -> str:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"
