"""deployments.paced_generator: the null engine behind the same batched `generate` as the
vLLM generator (the deployment class itself, called in-process without Serve)."""

from __future__ import annotations

import asyncio

from app.config import PacedEngineConfig
from deployments.paced_generator import PacedGeneratorDeployment
from pipeline.messages import FinishEvent, GenerationRequest, TokenEvent

REQUEST = GenerationRequest([{"role": "user", "content": "two words"}], 6, 0.0, "req-1")


async def batches_of(deployment: PacedGeneratorDeployment) -> list[list]:
    return [batch async for batch in deployment.generate(REQUEST)]


def test_generate_streams_max_tokens_tokens_then_the_finish_in_batches():
    deployment = PacedGeneratorDeployment(PacedEngineConfig(ttft_ms=0, tpot_ms=2), 1000)

    batches = asyncio.run(batches_of(deployment))

    events = [event for batch in batches for event in batch]
    assert all(isinstance(event, TokenEvent) for event in events[:-1])
    assert len(events) == 7
    assert isinstance(events[-1], FinishEvent)
    assert events[-1].usage.completion_tokens == 6
    # The first token on its own, the rest together once the stream ends (within 1 s).
    assert len(batches[0]) == 1
    assert len(batches) == 2


def test_no_batching_interval_sends_each_event_on_its_own():
    deployment = PacedGeneratorDeployment(PacedEngineConfig(ttft_ms=0, tpot_ms=0), 0)

    batches = asyncio.run(batches_of(deployment))

    assert [len(batch) for batch in batches] == [1] * 7


def test_the_paced_generator_is_healthy():
    deployment = PacedGeneratorDeployment(PacedEngineConfig(), 10)

    assert asyncio.run(deployment.check_health()) is None
