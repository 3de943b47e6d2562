"""Rendering of /v1/rag/query results: one JSON body, or server-sent events.

Stream: `event: sources`, then `event: delta` per batch of token text, then
`event: citations`, then `event: done` with the whole result (usage and timings), then
`data: [DONE]`. A failure after the first
token is sent as `event: error` with the OpenAI error body.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable

from sse_starlette import ServerSentEvent

from app.errors import ApiError, error_body
from app.schemas import (
    CachedSegments,
    CitationInfo,
    CompressionDecisionInfo,
    ContextPassage,
    RagQueryResponse,
    RagUsage,
    RetrievalQueryInfo,
    Source,
    Timings,
)
from pipeline.messages import Citation, PreparedPrompt, RetrievalQuery, TokenEvent
from pipeline.rag import DoneEvent, FailedEvent, PipelineEvent, RagQuery, RagResult, SourcesEvent

Renderer = Callable[[AsyncIterator[PipelineEvent]], AsyncIterator[ServerSentEvent]]


def sse_event(data: str, event: str | None = None) -> ServerSentEvent:
    """One server-sent event, lines ending in a bare newline as the OpenAI API's do."""
    return ServerSentEvent(data, event=event, sep="\n")


DONE = sse_event("[DONE]")


def sources_of(prepared: PreparedPrompt) -> list[Source]:
    return [
        Source(id=s.chunk_id, doc_id=s.doc_id, title=s.title, score=round(s.score, 4))
        for s in prepared.sources
    ]


def citations_of(citations: tuple[Citation, ...] | None) -> list[CitationInfo] | None:
    if citations is None:
        return None
    return [
        CitationInfo(
            answer_span=(c.answer_start, c.answer_end),
            source_id=c.source_id,
            source_span=(c.source_start, c.source_end),
            score=c.score,
        )
        for c in citations
    ]


def retrieval_query_of(query: RetrievalQuery) -> RetrievalQueryInfo:
    return RetrievalQueryInfo(mode=query.mode, text=query.text, rewrite_failed=query.rewrite_failed)


def response_model(result: RagResult) -> RagQueryResponse:
    """The result as the API shows it (figures rounded for display)."""
    prepared = result.prepared
    decision = prepared.decision
    return RagQueryResponse(
        id=result.request_id,
        answer=result.answer,
        sources=sources_of(prepared),
        collection=result.collection,
        index_version=result.index_version,
        citations=citations_of(result.citations),
        answer_style=result.answer_style,
        retrieval_query=retrieval_query_of(result.retrieval_query),
        history_turns_used=prepared.history_turns,
        compression_method=prepared.method,
        compression_decision=(
            None
            if decision is None
            else CompressionDecisionInfo(
                requested_method=result.requested_method,
                compressed=decision.compress,
                predicted_saving_ms=decision.predicted_saving_ms,
                predicted_cost_ms=decision.predicted_cost_ms,
            )
        ),
        degraded=prepared.degraded,
        context_truncated=prepared.truncated,
        finish_reason=result.finish_reason,
        usage=RagUsage(
            prompt_tokens=result.usage.prompt_tokens,
            cached_prompt_tokens=result.usage.cached_tokens,
            context_tokens_before=prepared.context_tokens_before,
            context_tokens_after=prepared.context_tokens_after,
            completion_tokens=result.usage.completion_tokens,
            continued_turns=prepared.continued_turns,
            cached_prompt_tokens_by_segment=(
                None if (split := result.cached_by_segment) is None else CachedSegments(**split)
            ),
        ),
        timings_ms=Timings(
            retrieve=_round(result.retrieve.own_ms),
            compress=_round(result.prepare.own_ms),
            rewrite=_round(result.rewrite_ms),
            attribute=_round(result.attribute_ms),
            queue=_round(result.queue_ms),
            network=_round(result.network_ms),
            ttft=_round(result.ttft_ms),
            total=_round(result.total_ms),
        ),
        tpot_ms=None if result.tpot_ms is None else _round(result.tpot_ms),
        context=(
            [ContextPassage(id=s.chunk_id, text=s.text) for s in prepared.sources]
            if result.include_context
            else None
        ),
    )


def response_body(result: RagResult) -> dict:
    return response_model(result).model_dump()


def sse_events(query: RagQuery) -> Renderer:
    async def render(events: AsyncIterator[PipelineEvent]) -> AsyncIterator[ServerSentEvent]:
        async for event in events:
            if isinstance(event, TokenEvent):
                yield _event("delta", {"text": event.text})
            elif isinstance(event, SourcesEvent):
                prepared = event.prepared
                yield _event("sources", {
                    "id": query.request_id,
                    "sources": [source.model_dump() for source in sources_of(prepared)],
                    "compression_method": prepared.method,
                    "context_tokens_before": prepared.context_tokens_before,
                    "context_tokens_after": prepared.context_tokens_after,
                    "degraded": prepared.degraded,
                    "retrieval_query": retrieval_query_of(event.retrieval_query).model_dump(),
                })  # fmt: skip
            elif isinstance(event, DoneEvent):
                body = response_body(event.result)
                yield _event("citations", {"citations": body["citations"]})
                yield _event("done", body)
            elif isinstance(event, FailedEvent):
                yield error_event(ApiError.from_stage(event.error), query.request_id)
                break
        yield DONE

    return render


def error_event(error: ApiError, request_id: str) -> ServerSentEvent:
    return _event("error", error_body(error, request_id))


def _event(name: str, data: dict) -> ServerSentEvent:
    return sse_event(json.dumps(data, ensure_ascii=False), event=name)


def _round(value: float) -> float:
    return round(value, 2)
