"""The request path, stage by stage: retrieve -> compress and fit -> generate (streamed).

Plain asyncio over a `Stages` protocol, so the HTTP layer and the tests can drive it without
Ray. Failures before the first token raise ApiError (the caller still chooses the status);
failures after it arrive as an `ErrorEvent` in the stream.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from app.errors import ApiError, StageError
from app.log import get_logger
from app.schemas import (
    CompressionDecisionInfo,
    ContextPassage,
    RagQueryResponse,
    RagUsage,
    Source,
    Timings,
)
from retrieval.compression import CompressionPlan
from retrieval.context import Retrieval
from retrieval.preparation import PreparedPrompt

logger = get_logger(__name__)


class Stages(Protocol):
    """The three downstream stages, however they are reached."""

    async def retrieve(self, question: str, top_k: int) -> Retrieval | StageError: ...

    async def prepare(
        self, question: str, retrieval: Retrieval, plan: CompressionPlan, max_output_tokens: int
    ) -> PreparedPrompt | StageError: ...

    def generate(
        self, messages: list[dict[str, str]], max_tokens: int, temperature: float
    ) -> AsyncIterator[dict[str, Any]]: ...


class MetricsSink(Protocol):
    def observe(self, result: RagResult) -> None: ...


@dataclass(frozen=True)
class RagQuery:
    question: str
    top_k: int
    plan: CompressionPlan
    max_tokens: int
    temperature: float
    request_id: str
    include_context: bool = False
    received_at: float = field(default_factory=time.perf_counter)


@dataclass(frozen=True)
class SourcesEvent:
    sources: list[Source]
    prepared: PreparedPrompt


@dataclass(frozen=True)
class TokenEvent:
    text: str


@dataclass(frozen=True)
class ErrorEvent:
    error: ApiError


# The pipeline's result is the /v1/rag/query response body itself.
RagResult = RagQueryResponse


@dataclass(frozen=True)
class DoneEvent:
    result: RagResult


PipelineEvent = SourcesEvent | TokenEvent | ErrorEvent | DoneEvent


class RagPipeline:
    def __init__(self, stages: Stages, metrics: MetricsSink | None = None) -> None:
        self._stages = stages
        self._metrics = metrics

    async def run(self, query: RagQuery) -> AsyncGenerator[PipelineEvent, None]:
        """Yield SourcesEvent, TokenEvents, then DoneEvent (or ErrorEvent mid-stream)."""
        retrieval = _unwrap(await self._stages.retrieve(query.question, query.top_k))
        retrieved_at = time.perf_counter()
        prepared = _unwrap(
            await self._stages.prepare(query.question, retrieval, query.plan, query.max_tokens)
        )
        prepared_at = time.perf_counter()
        sources = [
            Source(id=c.chunk_id, doc_id=c.doc_id, title=c.title, score=round(c.score, 4))
            for c in prepared.chunks
        ]
        yield SourcesEvent(sources, prepared)

        pieces: list[str] = []
        first_token_at: float | None = None
        finish_reason: str | None = None
        usage: dict[str, Any] = {}
        stream = self._stages.generate(prepared.messages, query.max_tokens, query.temperature)
        async for event in stream:
            kind = event.get("type")
            if kind == "token":
                first_token_at = first_token_at or time.perf_counter()
                pieces.append(event["text"])
                yield TokenEvent(event["text"])
            elif kind == "finish":
                finish_reason = event["reason"]
            elif kind == "usage":
                usage = event
            elif kind == "error":
                error = _generation_error(event)
                if first_token_at is None:
                    raise error
                yield ErrorEvent(error)
                return
        finished_at = time.perf_counter()
        first_token_at = first_token_at or finished_at
        result = _result(
            query, prepared, sources, "".join(pieces), finish_reason, usage,
            _ms(query.received_at, retrieved_at), _ms(retrieved_at, prepared_at),
            _ms(query.received_at, first_token_at), _ms(query.received_at, finished_at),
        )  # fmt: skip
        if self._metrics is not None:
            try:
                self._metrics.observe(result)
            except Exception:  # a metrics failure must never cost the user the answer
                logger.exception("recording metrics failed (request %s)", query.request_id)
        yield DoneEvent(result)


def tpot_ms(total_ms: float, ttft_ms: float, completion_tokens: int) -> float | None:
    """Mean time per output token after the first, as `vllm bench serve` defines it."""
    if completion_tokens < 2:
        return None
    return (total_ms - ttft_ms) / (completion_tokens - 1)


def _result(
    query: RagQuery,
    prepared: PreparedPrompt,
    sources: list[Source],
    answer: str,
    finish_reason: str | None,
    usage: dict[str, Any],
    retrieve_ms: float,
    compress_ms: float,
    ttft_ms: float,
    total_ms: float,
) -> RagResult:
    completion_tokens = int(usage.get("completion_tokens", 0))
    return RagResult(
        id=query.request_id,
        answer=answer,
        sources=sources,
        compression_method=prepared.method,
        compression_decision=_decision_info(query.plan, prepared),
        context_truncated=prepared.truncated,
        finish_reason=finish_reason,
        usage=RagUsage(
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            cached_prompt_tokens=int(usage.get("cached_tokens", 0)),
            context_tokens_before=prepared.context_tokens_before,
            context_tokens_after=prepared.context_tokens_after,
            completion_tokens=completion_tokens,
        ),
        timings_ms=Timings(
            retrieve=round(retrieve_ms, 2),
            compress=round(compress_ms, 2),
            ttft=round(ttft_ms, 2),
            total=round(total_ms, 2),
        ),
        tpot_ms=_round(tpot_ms(total_ms, ttft_ms, completion_tokens)),
        context=(
            [ContextPassage(id=c.chunk_id, text=c.text) for c in prepared.chunks]
            if query.include_context
            else None
        ),
    )


def _decision_info(
    plan: CompressionPlan, prepared: PreparedPrompt
) -> CompressionDecisionInfo | None:
    decision = prepared.decision
    if decision is None:
        return None
    return CompressionDecisionInfo(
        requested_method=plan.method,
        compressed=decision.compress,
        predicted_saving_ms=decision.predicted_saving_ms,
        predicted_cost_ms=decision.predicted_cost_ms,
    )


def _unwrap(value: Any) -> Any:
    if isinstance(value, StageError):
        raise ApiError.from_stage(value)
    return value


def _generation_error(event: dict[str, Any]) -> ApiError:
    status = int(event.get("status", 500))
    if status >= 500:
        return ApiError(502, "the generator failed", "server_error", code="generation_failed")
    error_type = str(event.get("error_type") or "invalid_request_error")
    return ApiError(status, str(event.get("message")), error_type)


def _ms(start: float, end: float) -> float:
    return (end - start) * 1000


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)
