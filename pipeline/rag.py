"""The request path, stage by stage: (rewrite) -> retrieve -> prepare (compress and fit)
-> generate -> attribute.

Plain asyncio over the `Stages` protocol. Before the first token a failure is raised
(`RequestRefused`, `StageUnavailable`), so the HTTP layer still chooses the status; after it,
a failure arrives as a `FailedEvent` at the end of the stream. When the compressor cannot
answer (at capacity, dead, too slow, broken) the request goes on with the uncompressed
context cut to the token budget, built here by the fallback preparer, and says so in
`PreparedPrompt.degraded`. A follow-up is retrieved by a standalone question (the recent
user turns joined, or a rewrite by the generator). The answer's text is cleaned of invalid
citation markers and leaked source tags as it streams; once it is complete, the compressor
attributes its sentences to source sentences. Citations are an extra: when attribution
fails or is slow, the answer goes out without them.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol, TypeVar

from pipeline.answer_text import AnswerStreamCleaner
from pipeline.conversation import (
    ConversationSettings,
    join_question,
    read_rewrite,
    recent_turns,
    rewrite_messages,
)
from pipeline.log import get_logger
from pipeline.messages import (
    DEFAULT_COLLECTION,
    DEFAULT_SAMPLING,
    DEFAULT_SEARCH,
    AnswerStyle,
    Attribution,
    Citation,
    CompressionPlan,
    Conversation,
    ErrorEvent,
    FinishEvent,
    GenerationEvent,
    GenerationRequest,
    PreparedPrompt,
    PromptSegment,
    Retrieval,
    RetrievalQuery,
    RetrievalQueryMode,
    Sampling,
    SearchOptions,
    StageError,
    StageTiming,
    TokenEvent,
    TokenLogprob,
    TokenUsage,
    Turn,
)
from pipeline.stages import FallbackPreparer, Stages, StageUnavailable

logger = get_logger(__name__)

T = TypeVar("T")

# A generation stream that closed without a FinishEvent.
ENDED_EARLY = StageError(502, "the generator ended the stream early", "server_error")


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
    history: tuple[Turn, ...] = ()
    retrieval_query: RetrievalQueryMode = "join"
    answer_style: AnswerStyle = "explained"
    citations: bool = True
    search: SearchOptions = DEFAULT_SEARCH
    sampling: Sampling = DEFAULT_SAMPLING
    # Answers to generate from the one retrieval and prompt (OpenAI's `n`).
    n: int = 1
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
class AnswerChoice:
    """One answer to the prompt; a result's `extra_choices` (a request's `n` > 1) are index 1 on."""

    index: int
    text: str
    finish_reason: str | None
    completion_tokens: int
    logprobs: tuple[TokenLogprob, ...] = ()


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
    # From arrival to the last token; `total_ms` also counts the attribution after it.
    generated_ms: float
    total_ms: float
    include_context: bool
    retrieval_query: RetrievalQuery
    answer_style: AnswerStyle = "explained"
    rewrite_ms: float = 0.0
    # None: not asked for, or attribution failed (the answer goes out without citations).
    citations: tuple[Citation, ...] | None = None
    attribute: HopTiming | None = None
    # What was searched: the collection and the one version of it the whole request read.
    collection: str = DEFAULT_COLLECTION
    index_version: str = ""
    # With Sampling.logprobs: the answer's tokens' log probabilities.
    logprobs: tuple[TokenLogprob, ...] = ()
    # With n > 1: the other answers, from the same prompt.
    extra_choices: tuple[AnswerChoice, ...] = ()

    @property
    def tpot_ms(self) -> float | None:
        """Mean time per output token after the first, as `vllm bench serve` defines it."""
        return tpot_ms(self.generated_ms, self.ttft_ms, self.usage.completion_tokens)

    @property
    def cached_by_segment(self) -> dict[PromptSegment, int] | None:
        """The engine's cached prompt tokens by the part of the prompt they came from."""
        layout = self.prepared.layout
        return None if layout is None else layout.cached_by_segment(self.usage.cached_tokens)

    @property
    def attribute_ms(self) -> float:
        return self.attribute.own_ms if self.attribute is not None else 0.0

    @property
    def queue_ms(self) -> float:
        """Time the stage calls waited before their stage began them, all hops together."""
        return sum(hop.queue_ms for hop in self._hops())

    @property
    def network_ms(self) -> float:
        """The rest of the stage calls' round trips (transport), all hops together."""
        return sum(hop.network_ms for hop in self._hops())

    def _hops(self) -> list[HopTiming]:
        hops = [self.retrieve, self.prepare]
        return hops if self.attribute is None else [*hops, self.attribute]


@dataclass(frozen=True, slots=True)
class SourcesEvent:
    prepared: PreparedPrompt
    retrieval_query: RetrievalQuery


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
        conversation: ConversationSettings | None = None,
        attribution_timeout_s: float | None = 2.0,
    ) -> None:
        self._stages = stages
        self._fallback = fallback
        self._compressor_timeout_s = compressor_timeout_s
        self._metrics = metrics
        self._conversation = conversation or ConversationSettings()
        self._attribution_timeout_s = attribution_timeout_s

    def set_timeouts(
        self, compressor_timeout_s: float | None, attribution_timeout_s: float | None
    ) -> None:
        """New waits for the compressor and for attribution, from the next request on."""
        self._compressor_timeout_s = compressor_timeout_s
        self._attribution_timeout_s = attribution_timeout_s

    async def run(self, query: RagQuery) -> AsyncGenerator[PipelineEvent, None]:
        """Yield a SourcesEvent, TokenEvents, then a DoneEvent (or a FailedEvent)."""
        opened = await self._open(query)
        yield SourcesEvent(opened.prepared, opened.search)

        answer = _AnswerSoFar(_cleaner(query, opened.prepared))
        failed = False
        # aclosing: a consumer that leaves early closes the stream below at once, and with it
        # the generation call.
        async with contextlib.aclosing(self._streamed(query, opened, answer)) as events:
            async for event in events:
                failed = isinstance(event, FailedEvent)
                yield event
        if failed:  # nothing follows a FailedEvent
            return
        if (finish := answer.finish) is None:  # the stream closed without a finish
            if answer.first_token_at is None:
                raise RequestRefused(ENDED_EARLY)
            if rest := answer.cleaner.finish():
                yield TokenEvent(rest)
            yield FailedEvent(ENDED_EARLY)
            return
        if (last := answer.last()) is not None:
            yield last
        result = await self._result(query, opened, answer, finish)
        self._observe(result)
        yield DoneEvent(result)

    async def _open(self, query: RagQuery) -> _Opened:
        """What the answer is generated from: what to search for, what was found, and the
        prompt prepared from it, each with its timing."""
        search, rewrite_ms = await self._retrieval_query(query)
        retrieval, retrieve_hop = await self._retrieve(query, search.text)
        prepared, prepare_hop = await self._prepare(query, retrieval)
        return _Opened(search, rewrite_ms, retrieval, retrieve_hop, prepared, prepare_hop)

    async def _streamed(
        self, query: RagQuery, opened: _Opened, answer: _AnswerSoFar
    ) -> AsyncGenerator[PipelineEvent, None]:
        """The answer's TokenEvents as the generator streams it, recorded in `answer` with the
        finish and, with n > 1, the other choices. A failure before the first token is
        raised; after it, the text the cleaner holds goes out and a FailedEvent ends it."""
        request = _generation_request(query, opened.prepared, opened.retrieval.collection)
        extras = [
            asyncio.create_task(self._extra_choice(query, opened.prepared, request, index))
            for index in range(1, query.n)
        ]
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
                            if (sent := answer.feed(event)) is not None:
                                yield sent
                        elif isinstance(event, FinishEvent):
                            answer.finish = event
                        elif isinstance(event, ErrorEvent):
                            if answer.first_token_at is None:
                                raise _refusal(event.error)
                            if rest := answer.cleaner.finish():  # held text goes out first
                                yield TokenEvent(rest)
                            yield FailedEvent(_public(event.error))
                            return
            answer.extra_choices = await _gathered(extras)
        except StageUnavailable as exc:
            if answer.first_token_at is None:
                raise
            if rest := answer.cleaner.finish():
                yield TokenEvent(rest)
            yield FailedEvent(_interrupted(exc))
        except RequestRefused as exc:
            if answer.first_token_at is None:
                raise
            yield FailedEvent(exc.error)
        finally:
            for task in extras:
                task.cancel()

    async def _result(
        self, query: RagQuery, opened: _Opened, answer: _AnswerSoFar, finish: FinishEvent
    ) -> RagResult:
        """The request's result once its answer is complete: its citations and timings."""
        generated_at = time.perf_counter()
        text = "".join(answer.pieces)
        citations, attribute_hop = None, None
        if not query.sampling.output.is_json:  # a JSON answer has no sentences to cite
            citations, attribute_hop = await self._attribute(query, text, opened.prepared)
        finished_at = time.perf_counter()
        return RagResult(
            request_id=query.request_id,
            requested_method=query.plan.method,
            answer=text,
            prepared=opened.prepared,
            finish_reason=finish.reason,
            usage=finish.usage,
            retrieve=opened.retrieve_hop,
            prepare=opened.prepare_hop,
            ttft_ms=_ms(query.received_at, answer.first_token_at or generated_at),
            generated_ms=_ms(query.received_at, generated_at),
            total_ms=_ms(query.received_at, finished_at),
            include_context=query.include_context,
            retrieval_query=opened.search,
            answer_style=query.answer_style,
            rewrite_ms=opened.rewrite_ms,
            citations=citations,
            attribute=attribute_hop,
            collection=opened.retrieval.collection,
            index_version=opened.retrieval.index_version,
            logprobs=tuple(answer.logprobs),
            extra_choices=answer.extra_choices,
        )

    def _observe(self, result: RagResult) -> None:
        """Record `result` in the metrics, if any; a failure there is logged, not raised."""
        if self._metrics is not None:
            try:
                self._metrics.observe(result)
            except Exception:  # a metrics failure must never cost the user the answer
                logger.exception("recording metrics failed (request %s)", result.request_id)

    async def _extra_choice(
        self, query: RagQuery, prepared: PreparedPrompt, first: GenerationRequest, index: int
    ) -> AnswerChoice:
        """One more answer to the same prompt: its own request id and, with a seed, its own
        seed (the same seed would draw the same answer)."""
        sampling = query.sampling
        if sampling.seed is not None:
            sampling = replace(sampling, seed=sampling.seed + index)
        request = replace(first, request_id=f"{query.request_id}-{index}", sampling=sampling)
        cleaner = _cleaner(query, prepared)
        pieces: list[str] = []
        logprobs: list[TokenLogprob] = []
        async with contextlib.aclosing(self._stages.generate(request)) as stream:
            async for batch in stream:
                for event in batch:
                    if isinstance(event, TokenEvent):
                        pieces.append(cleaner.feed(event.text))
                        logprobs += event.logprobs
                    elif isinstance(event, ErrorEvent):
                        raise _refusal(event.error)
                    elif isinstance(event, FinishEvent):
                        text = "".join(pieces) + cleaner.finish()
                        tokens = event.usage.completion_tokens
                        return AnswerChoice(index, text, event.reason, tokens, tuple(logprobs))
        raise RequestRefused(ENDED_EARLY)

    async def _retrieval_query(self, query: RagQuery) -> tuple[RetrievalQuery, float]:
        """What to search for, and the milliseconds a rewrite took (0 without one). A
        rewrite that fails, times out or comes back unusable falls back to the join."""
        if not query.history or query.retrieval_query == "last":
            return RetrievalQuery("last", query.question), 0.0
        settings = self._conversation
        joined = join_question(query.history, query.question, settings.join_user_turns)
        if query.retrieval_query == "join":
            return RetrievalQuery("join", joined), 0.0
        started = time.perf_counter()
        recent = recent_turns(query.history, settings.join_user_turns)
        request = GenerationRequest(
            rewrite_messages(
                settings.rewrite_system_prompt,
                [Turn(turn.role, self._cleaned(turn.content)) for turn in recent],
                self._cleaned(query.question),
            ),
            settings.rewrite_max_tokens,
            0.0,
            f"{query.request_id}-rewrite",
        )
        try:
            async with asyncio.timeout(settings.rewrite_timeout_s):
                reply = await self._generated_text(request)
        except (StageUnavailable, TimeoutError) as exc:
            logger.warning("rewrite failed (%s): joined turns (request %s)", exc, query.request_id)
            reply = None
        rewrite_ms = _ms(started, time.perf_counter())
        rewritten = read_rewrite(reply, query.question) if reply else None
        if rewritten is None:
            return RetrievalQuery("join", joined, rewrite_failed=True), rewrite_ms
        return RetrievalQuery("rewrite", rewritten), rewrite_ms

    def _cleaned(self, text: str) -> str:
        """`text` cleared of control strings, for a prompt no preparer builds (a rewrite's)."""
        return self._fallback.cleaned(text) if self._fallback is not None else text

    async def _generated_text(self, request: GenerationRequest) -> str | None:
        """The whole text of one generation, or None when the generator refused it."""
        pieces: list[str] = []
        async with contextlib.aclosing(self._stages.generate(request)) as stream:
            async for batch in stream:
                for event in batch:
                    if isinstance(event, TokenEvent):
                        pieces.append(event.text)
                    elif isinstance(event, ErrorEvent):
                        return None
        return "".join(pieces)

    async def _attribute(
        self, query: RagQuery, answer: str, prepared: PreparedPrompt
    ) -> tuple[tuple[Citation, ...] | None, HopTiming | None]:
        if not query.citations:
            return None, None
        if not answer.strip() or not prepared.sources:
            return (), None
        called_at_s, started = time.time(), time.perf_counter()
        try:
            async with asyncio.timeout(self._attribution_timeout_s):
                attribution = await self._stages.attribute(answer, prepared.sources)
        except (StageUnavailable, TimeoutError) as exc:
            logger.warning("no citations (%s) (request %s)", exc, query.request_id)
            return None, None
        except Exception:
            logger.exception("attribution failed (request %s)", query.request_id)
            return None, None
        if not isinstance(attribution, Attribution):
            logger.warning("no citations: %s (request %s)", attribution.message, query.request_id)
            return None, None
        hop = HopTiming.of(attribution.timing, called_at_s, _ms(started, time.perf_counter()))
        return attribution.citations, hop

    async def _retrieve(self, query: RagQuery, search_text: str) -> tuple[Retrieval, HopTiming]:
        called_at_s, started = time.time(), time.perf_counter()
        retrieval = _unwrap(await self._stages.retrieve(search_text, query.top_k, query.search))
        hop = HopTiming.of(retrieval.timing, called_at_s, _ms(started, time.perf_counter()))
        return retrieval, hop

    async def _prepare(
        self, query: RagQuery, retrieval: Retrieval
    ) -> tuple[PreparedPrompt, HopTiming]:
        called_at_s, started = time.time(), time.perf_counter()
        conversation = Conversation(query.question, query.history, query.answer_style)
        try:
            async with asyncio.timeout(self._compressor_timeout_s):
                answer = await self._stages.prepare(
                    conversation, retrieval, query.plan, query.max_tokens
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
                conversation,
                retrieval,
                replace(query.plan, method="none"),
                query.max_tokens,
                degraded,
            )
        except ValueError as exc:  # the question alone does not fit the context window
            raise RequestRefused(StageError(400, str(exc), param="question")) from None
        return prepared, HopTiming.local(prepared.timing.own_ms)


class _Unchanged:
    """The cleaner of a JSON answer: markers and tags are not cleaned out of JSON."""

    def feed(self, piece: str) -> str:
        return piece

    def finish(self) -> str:
        return ""


def _cleaner(query: RagQuery, prepared: PreparedPrompt) -> AnswerStreamCleaner | _Unchanged:
    if query.sampling.output.is_json:
        return _Unchanged()
    return AnswerStreamCleaner([source.chunk_id for source in prepared.sources])


@dataclass(frozen=True)
class _Opened:
    """What a request's answer is generated from (RagPipeline._open)."""

    search: RetrievalQuery
    rewrite_ms: float
    retrieval: Retrieval
    retrieve_hop: HopTiming
    prepared: PreparedPrompt
    prepare_hop: HopTiming


@dataclass
class _AnswerSoFar:
    """The first answer as it streams: the text sent and its tokens' logprobs, the logprobs
    of the tokens whose text the cleaner holds back, when the first text went out, and once
    they come, the finish and the other choices (n > 1)."""

    cleaner: AnswerStreamCleaner | _Unchanged
    pieces: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    pending: list[TokenLogprob] = field(default_factory=list)
    first_token_at: float | None = None
    finish: FinishEvent | None = None
    extra_choices: tuple[AnswerChoice, ...] = ()

    def feed(self, event: TokenEvent) -> TokenEvent | None:
        """What of `event` goes out now, with the logprobs of its tokens; None while the
        cleaner holds all of its text back."""
        self.pending += event.logprobs
        # What the cleaner holds back (a marker not yet complete) goes out with later text,
        # its tokens' logprobs with it; the first token is the first text sent.
        if not (text := self.cleaner.feed(event.text)):
            return None
        self.first_token_at = self.first_token_at or time.perf_counter()
        self.pieces.append(text)
        self.logprobs += self.pending
        sent = TokenEvent(text, tuple(self.pending))
        self.pending.clear()
        return sent

    def last(self) -> TokenEvent | None:
        """After the finish: the text the cleaner still holds and the logprobs held with it;
        None when there is neither."""
        if not (rest := self.cleaner.finish()) and not self.pending:
            return None
        self.first_token_at = self.first_token_at or time.perf_counter()
        self.pieces.append(rest)
        self.logprobs += self.pending
        return TokenEvent(rest, tuple(self.pending))


def _generation_request(
    query: RagQuery, prepared: PreparedPrompt, collection: str
) -> GenerationRequest:
    """The generator's request for the (first) answer to `prepared`."""
    return GenerationRequest(
        prepared.messages,
        query.max_tokens,
        query.temperature,
        query.request_id,
        routing_key(prepared, collection),
        query.sampling,
    )


async def _gathered(extras: list[asyncio.Task[AnswerChoice]]) -> tuple[AnswerChoice, ...]:
    return tuple(await asyncio.gather(*extras)) if extras else ()


def _merged(batch: Sequence[GenerationEvent]) -> list[GenerationEvent]:
    """`batch` with each run of consecutive TokenEvents joined into one."""
    merged: list[GenerationEvent] = []
    for event in batch:
        if isinstance(event, TokenEvent) and merged and isinstance(merged[-1], TokenEvent):
            previous = merged[-1]
            merged[-1] = TokenEvent(previous.text + event.text, previous.logprobs + event.logprobs)
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
    """A generation error before the first token: a dead engine is a retryable 503, an
    engine that stopped answering a 504; any other server-side failure a 502; the request's
    own fault keeps its status."""
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
    if error.status == 504:
        return StageError(504, "the generator did not answer in time", "timeout", code="timeout")
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


def routing_key(prepared: PreparedPrompt, collection: str) -> str:
    """What opens the prompt past the system prompt, for the generator's request router: its
    opening passage (the first source, or a continued follow-up's first turn's: the
    conversation's first question opened with it too), else the first earlier turn as text
    (a conversation's later turns share that prefix); with the system prompt itself, which
    differs by answer style. "" for a prompt without either."""
    if prepared.opening_passage:
        opening = f"{collection}\x00{prepared.opening_passage}"
    elif prepared.history_turns:
        opening = prepared.messages[1]["content"]
    else:
        return ""
    system = prepared.messages[0]["content"]
    return hashlib.blake2b(f"{system}\x00{opening}".encode(), digest_size=12).hexdigest()


def _ms(start: float, end: float) -> float:
    return (end - start) * 1000
