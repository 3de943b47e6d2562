"""The request path, stage by stage: retrieve -> prepare (compress and fit) -> generate.

Plain asyncio over the `Stages` protocol. Before the first token a failure is raised
(`RequestRefused`, `StageUnavailable`), so the HTTP layer still chooses the status; after it,
a failure arrives as a `FailedEvent` at the end of the stream. When the compressor cannot
answer (at capacity, dead, too slow, broken) the request goes on with the uncompressed
context cut to the token budget, built here by the fallback preparer, and says so in
`PreparedPrompt.degraded`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol, TypeVar

from pipeline.log import get_logger
from pipeline.messages import (
    CompressionPlan,
    ErrorEvent,
    FinishEvent,
    GenerationEvent,
    GenerationRequest,
    PreparedPrompt,
    Retrieval,
    StageError,
    StageTiming,
    TokenEvent,
    TokenUsage,
)
from pipeline.stages import FallbackPreparer, Stages, StageUnavailable

logger = get_logger(__name__)

T = TypeVar("T")


class RequestRefused(Exception):
    """A stage refused the request itself (bad input, prompt too long, engine refusal)."""

    def __init__(self, error: StageError) -> None:
        super().__init__(error.message)
        self.error = error


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


@dataclass(frozen=True, slots=True)
class HopTiming:
    """One call to a stage, split: the stage's own work, the wait before the stage began it
    (routing queue and transport in), and the rest of the round trip (transport back)."""

    own_ms: float
    queue_ms: float
    network_ms: float

    @classmethod
    def of(cls, timing: StageTiming, called_at_s: float, round_trip_ms: float) -> HopTiming:
        queue_ms = max(0.0, (timing.started_at_s - called_at_s) * 1000)
        network_ms = max(0.0, round_trip_ms - queue_ms - timing.own_ms)
        return cls(timing.own_ms, queue_ms, network_ms)

    @classmethod
    def local(cls, own_ms: float) -> HopTiming:
        return cls(own_ms, 0.0, 0.0)


@dataclass(frozen=True)
class RagResult:
    """Everything about one answered request, unrounded; the HTTP layer renders it."""

    request_id: str
    requested_method: str
    answer: str
    prepared: PreparedPrompt
    finish_reason: str | None
    usage: TokenUsage
    retrieve: HopTiming
    prepare: HopTiming
    ttft_ms: float
    total_ms: float
    include_context: bool

    @property
    def tpot_ms(self) -> float | None:
        """Mean time per output token after the first, as `vllm bench serve` defines it."""
        return tpot_ms(self.total_ms, self.ttft_ms, self.usage.completion_tokens)


@dataclass(frozen=True, slots=True)
class SourcesEvent:
    prepared: PreparedPrompt


@dataclass(frozen=True, slots=True)
class FailedEvent:
    """The stream failed after its first token; nothing follows."""

    error: StageError


@dataclass(frozen=True, slots=True)
class DoneEvent:
    result: RagResult


PipelineEvent = SourcesEvent | TokenEvent | FailedEvent | DoneEvent


class RagPipeline:
    def __init__(
        self,
        stages: Stages,
        fallback: FallbackPreparer | None = None,
        compressor_timeout_s: float | None = None,
        metrics: MetricsSink | None = None,
    ) -> None:
        self._stages = stages
        self._fallback = fallback
        self._compressor_timeout_s = compressor_timeout_s
        self._metrics = metrics

    async def run(self, query: RagQuery) -> AsyncGenerator[PipelineEvent, None]:
        """Yield a SourcesEvent, TokenEvents, then a DoneEvent (or a FailedEvent)."""
        retrieval, retrieve_hop = await self._retrieve(query)
        prepared, prepare_hop = await self._prepare(query, retrieval)
        yield SourcesEvent(prepared)

        pieces: list[str] = []
        first_token_at: float | None = None
        finish: FinishEvent | None = None
        request = GenerationRequest(
            prepared.messages, query.max_tokens, query.temperature, query.request_id
        )
        try:
            # aclosing: leaving early (an error event, a client gone) closes the generator
            # stream now, which cancels the call on its replica.
            async with contextlib.aclosing(self._stages.generate(request)) as stream:
                async for batch in stream:
                    # One text event per run of tokens in a batch: what the generator sent
                    # together goes on together, so per-event costs downstream (rendering,
                    # the proxy, the client) are paid per batch, not per token.
                    for event in _merged(batch):
                        if isinstance(event, TokenEvent):
                            first_token_at = first_token_at or time.perf_counter()
                            pieces.append(event.text)
                            yield event
                        elif isinstance(event, FinishEvent):
                            finish = event
                        elif isinstance(event, ErrorEvent):
                            if first_token_at is None:
                                raise _refusal(event.error)
                            yield FailedEvent(_public(event.error))
                            return
        except StageUnavailable as exc:
            if first_token_at is None:
                raise
            yield FailedEvent(_interrupted(exc))
            return
        if finish is None:
            error = StageError(502, "the generator ended the stream early", "server_error")
            if first_token_at is None:
                raise RequestRefused(error)
            yield FailedEvent(error)
            return
        finished_at = time.perf_counter()
        result = RagResult(
            request_id=query.request_id,
            requested_method=query.plan.method,
            answer="".join(pieces),
            prepared=prepared,
            finish_reason=finish.reason,
            usage=finish.usage,
            retrieve=retrieve_hop,
            prepare=prepare_hop,
            ttft_ms=_ms(query.received_at, first_token_at or finished_at),
            total_ms=_ms(query.received_at, finished_at),
            include_context=query.include_context,
        )
        if self._metrics is not None:
            try:
                self._metrics.observe(result)
            except Exception:  # a metrics failure must never cost the user the answer
                logger.exception("recording metrics failed (request %s)", query.request_id)
        yield DoneEvent(result)

    async def _retrieve(self, query: RagQuery) -> tuple[Retrieval, HopTiming]:
        called_at_s, started = time.time(), time.perf_counter()
        retrieval = _unwrap(await self._stages.retrieve(query.question, query.top_k))
        hop = HopTiming.of(retrieval.timing, called_at_s, _ms(started, time.perf_counter()))
        return retrieval, hop

    async def _prepare(
        self, query: RagQuery, retrieval: Retrieval
    ) -> tuple[PreparedPrompt, HopTiming]:
        called_at_s, started = time.time(), time.perf_counter()
        try:
            async with asyncio.timeout(self._compressor_timeout_s):
                answer = await self._stages.prepare(
                    query.question, retrieval, query.plan, query.max_tokens
                )
        except StageUnavailable as exc:
            degraded = f"compressor_{exc.kind}"
        except TimeoutError:
            degraded = "compressor_timeout"
        except Exception:
            logger.exception("the compressor failed (request %s)", query.request_id)
            degraded = "compressor_failed"
        else:
            prepared = _unwrap(answer)
            hop = HopTiming.of(prepared.timing, called_at_s, _ms(started, time.perf_counter()))
            return prepared, hop
        if self._fallback is None:
            raise StageUnavailable("compressor", "unavailable", degraded)
        logger.warning("%s: uncompressed context (request %s)", degraded, query.request_id)
        try:
            prepared = await asyncio.to_thread(
                self._fallback.prepare,
                query.question,
                retrieval,
                replace(query.plan, method="none"),
                query.max_tokens,
                degraded,
            )
        except ValueError as exc:  # the question alone does not fit the context window
            raise RequestRefused(StageError(400, str(exc), param="question")) from None
        return prepared, HopTiming.local(prepared.timing.own_ms)


def _merged(batch: Sequence[GenerationEvent]) -> list[GenerationEvent]:
    """`batch` with each run of consecutive TokenEvents joined into one."""
    merged: list[GenerationEvent] = []
    for event in batch:
        if isinstance(event, TokenEvent) and merged and isinstance(merged[-1], TokenEvent):
            merged[-1] = TokenEvent(merged[-1].text + event.text)
        else:
            merged.append(event)
    return merged


def tpot_ms(total_ms: float, ttft_ms: float, completion_tokens: int) -> float | None:
    if completion_tokens < 2:
        return None
    return (total_ms - ttft_ms) / (completion_tokens - 1)


def _unwrap(value: T | StageError) -> T:
    if isinstance(value, StageError):
        raise RequestRefused(value)
    return value


def _refusal(error: StageError) -> Exception:
    """A generation error before the first token: a dead engine is a retryable 503; any
    other server-side failure a 502; the request's own fault keeps its status."""
    if error.status == 503:
        return StageUnavailable("generator", "unavailable", error.message)
    return RequestRefused(_public(error))


def _public(error: StageError) -> StageError:
    """What a client may see of a generation error: its own mistakes in full; the engine's
    failures without their details (which can name internals)."""
    if error.status == 503:
        return StageError(
            503, f"{error.message}; retry the request", "service_unavailable", code=error.code
        )
    if error.status >= 500:
        return StageError(502, "the generator failed", "server_error", code="generation_failed")
    return error


def _interrupted(exc: StageUnavailable) -> StageError:
    return StageError(
        503,
        f"the answer was interrupted: {exc}; retry the request",
        "service_unavailable",
        code=f"{exc.stage}_{exc.kind}",
    )


def _ms(start: float, end: float) -> float:
    return (end - start) * 1000
