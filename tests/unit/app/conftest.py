"""Fakes for the HTTP-layer tests: the stages are faked because those tests are about routes,
validation, streaming and error mapping, not retrieval or generation."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.api import ApiState, create_api
from app.config import RagAppConfig
from app.errors import StageError
from app.pipeline import RagPipeline
from app.readiness import Readiness
from app.settings import Settings
from retrieval.compression import CompressionPlan
from retrieval.context import ContextChunk, Retrieval
from retrieval.cost_model import CompressionDecision
from retrieval.preparation import PreparedPrompt
from retrieval.prompt import build_messages

TOKENS = ("Paged attention", " stores KV", " in blocks [kv#0].")
USAGE = {"type": "usage", "prompt_tokens": 321, "completion_tokens": 3, "cached_tokens": 256}
DEFAULT_EVENTS: tuple[Any, ...] = (
    {"type": "token", "text": TOKENS[0]},
    0.01,  # a number is a pause in seconds, so TPOT is measurable
    {"type": "token", "text": TOKENS[1]},
    0.01,
    {"type": "token", "text": TOKENS[2]},
    {"type": "finish", "reason": "stop"},
    USAGE,
)
CHUNKS = (
    ContextChunk("kv#0", "kv", "KV cache", "Keys and values are kept.", 0.91234),
    ContextChunk("batching#2", "batching", "Batching", "Requests share steps.", 0.5),
)


@dataclass
class FakeStages:
    """A `Stages` whose answers are set per test; records what the pipeline asked."""

    retrieve_result: Retrieval | StageError | Exception | None = None
    prepare_result: PreparedPrompt | StageError | Exception | None = None
    events: tuple[Any, ...] = DEFAULT_EVENTS
    decision: CompressionDecision | None = None
    calls: list[tuple[str, tuple]] = field(default_factory=list)

    async def retrieve(self, question: str, top_k: int) -> Retrieval | StageError:
        self.calls.append(("retrieve", (question, top_k)))
        if isinstance(self.retrieve_result, Exception):
            raise self.retrieve_result
        return self.retrieve_result or Retrieval(np.ones(4, dtype=np.float32), CHUNKS, 1.5)

    async def prepare(
        self, question: str, retrieval: Retrieval, plan: CompressionPlan, max_output_tokens: int
    ) -> PreparedPrompt | StageError:
        self.calls.append(("prepare", (question, plan, max_output_tokens)))
        if isinstance(self.prepare_result, Exception):
            raise self.prepare_result
        if self.prepare_result is not None:
            return self.prepare_result
        return PreparedPrompt(
            messages=build_messages("system", retrieval.chunks, question),
            chunks=retrieval.chunks,
            method=plan.method,
            context_tokens_before=40,
            context_tokens_after=22,
            compress_ms=0.3,
            truncated=False,
            decision=self.decision,
        )

    async def generate(
        self, messages: list[dict[str, str]], max_tokens: int, temperature: float
    ) -> AsyncIterator[dict[str, Any]]:
        self.calls.append(("generate", (messages, max_tokens, temperature)))
        for event in self.events:
            if isinstance(event, Exception):
                raise event
            if isinstance(event, int | float):
                await asyncio.sleep(event)
                continue
            yield event

    def called(self, stage: str) -> list[tuple]:
        return [args for name, args in self.calls if name == stage]


async def ready_probe() -> object:
    return {"ok": True}


def _make_state(
    stages: FakeStages | None = None,
    config: RagAppConfig | None = None,
    settings: Settings | None = None,
    probes: dict[str, Callable] | None = None,
    readiness_timeout_s: float = 0.5,
) -> ApiState:
    return ApiState(
        pipeline=RagPipeline(stages or FakeStages()),
        config=config or RagAppConfig(),
        settings=settings or Settings(environment="development", api_keys=()),
        readiness=Readiness(
            probes
            or {"retriever": ready_probe, "compressor": ready_probe, "generator": ready_probe},
            timeout_s=readiness_timeout_s,
        ),
        started_at=1_700_000_000,
    )


@pytest.fixture
def stages() -> FakeStages:
    return FakeStages()


@pytest.fixture
def client_for() -> Callable[..., TestClient]:
    """A TestClient around `_make_state(**kwargs)`; server errors come back as responses."""

    def build(**kwargs) -> TestClient:
        return TestClient(create_api(_make_state(**kwargs)), raise_server_exceptions=False)

    return build


@pytest.fixture
def client(client_for, stages) -> TestClient:
    return client_for(stages=stages)
