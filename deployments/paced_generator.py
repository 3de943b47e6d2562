"""A generator deployment around the null engine (`generation.paced_engine`), with the same
`generate` as the vLLM one, so the overhead benchmark measures the same chain."""

from __future__ import annotations

from collections.abc import AsyncIterator

from app.config import PacedEngineConfig
from generation.batching import batch_events
from generation.paced_engine import PacedEngine
from pipeline.messages import GenerationEvent, GenerationRequest


class PacedGeneratorDeployment:
    def __init__(self, paced: PacedEngineConfig, stream_batching_interval_ms: float) -> None:
        self._engine = PacedEngine(paced.ttft_ms, paced.tpot_ms)
        self._interval_ms = stream_batching_interval_ms

    async def generate(self, request: GenerationRequest) -> AsyncIterator[list[GenerationEvent]]:
        async for batch in batch_events(self._engine.stream(request), self._interval_ms):
            yield batch

    async def check_health(self) -> None:
        await self._engine.check_health()
