"""deployments.engine_generator: the engines outside Ray Serve LLM behind the same batched
`generate` as the vLLM generator (the deployment class itself, called in-process without
Serve). The external server is tested for real in tests/integration."""

from __future__ import annotations

import asyncio

import pytest

from deployments.engine_generator import EngineGeneratorDeployment, build_engine
from generation.config import GeneratorConfig
from generation.paced_engine import PacedEngine
from pipeline.messages import FinishEvent, GenerationRequest, TokenEvent

REQUEST = GenerationRequest([{"role": "user", "content": "two words"}], 6, 0.0, "req-1")


def paced(interval_ms: float) -> EngineGeneratorDeployment:
    """The generator around the paced engine (0.3 s to the first token, then 30 ms each)."""
    config = GeneratorConfig(engine="paced", stream_batching_interval_ms=interval_ms)
    return asyncio.run(_constructed(config))


async def _constructed(config: GeneratorConfig) -> EngineGeneratorDeployment:
    deployment = EngineGeneratorDeployment.__new__(EngineGeneratorDeployment)
    await deployment.__init__(config)  # type: ignore[misc]  # Serve awaits the constructor
    return deployment


async def batches_of(deployment: EngineGeneratorDeployment) -> list[list]:
    return [batch async for batch in deployment.generate(REQUEST)]


def test_generate_streams_max_tokens_tokens_then_the_finish_in_batches():
    deployment = paced(interval_ms=1000)

    batches = asyncio.run(batches_of(deployment))

    events = [event for batch in batches for event in batch]
    assert all(isinstance(event, TokenEvent) for event in events[:-1])
    assert len(events) == 7
    assert isinstance(events[-1], FinishEvent)
    assert events[-1].usage.completion_tokens == 6
    # The first token at once, the rest together once the stream ends (0.15 s later): two
    # batches, not seven. (On a busy machine the batcher may wake after more than the first
    # token arrived and send what it holds; never more batches than that.)
    assert len(batches) <= 2


def test_no_batching_interval_sends_each_event_on_its_own():
    deployment = paced(interval_ms=0)

    batches = asyncio.run(batches_of(deployment))

    assert [len(batch) for batch in batches] == [1] * 7


def test_the_paced_generator_is_healthy():
    deployment = paced(interval_ms=10)

    assert asyncio.run(deployment.check_health()) is None


def test_build_engine_gives_the_paced_engine_vllms_pace():
    engine = build_engine(GeneratorConfig(engine="paced"))

    assert isinstance(engine, PacedEngine)
    assert (engine.ttft_s, engine.tpot_s) == (0.3, 0.03)


def test_build_engine_refuses_vllm_which_ray_serve_llm_hosts():
    with pytest.raises(ValueError, match="no external engine"):
        build_engine(GeneratorConfig(engine="vllm"))
