"""Generator deployment for the engines that run outside Ray Serve LLM: an OpenAI-compatible
server elsewhere (`generation.openai_engine`), or the null engine (docs/retired.md, bench.overhead)
(`generation.paced_engine`). The same typed, batched `generate` as the vLLM generator, so the
ingress cannot tell them apart.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from app.settings import load_settings
from generation.batching import batch_events
from generation.config import GeneratorConfig
from generation.engine import TokenEngine
from generation.openai_engine import OpenAIEndpoint, OpenAIEngine
from generation.paced_engine import PacedEngine
from pipeline.config_base import PROJECT_ROOT
from pipeline.log import get_logger
from pipeline.messages import GenerationEvent, GenerationRequest
from prepare.tokens import ServingTokenizer
from retrieval.models import resolve_model_reference

logger = get_logger(__name__)


class EngineGeneratorDeployment:
    async def __init__(self, generator: GeneratorConfig) -> None:  # type: ignore[misc]
        self._engine = build_engine(generator)
        self._interval_ms = generator.stream_batching_interval_ms
        if isinstance(self._engine, OpenAIEngine):
            await _check_served_model(self._engine, generator.served_model_name())

    async def generate(self, request: GenerationRequest) -> AsyncIterator[list[GenerationEvent]]:
        """Batches of TokenEvent, then a FinishEvent (or one ErrorEvent): the first token
        at once, later ones at most every `stream_batching_interval_ms`."""
        async for batch in batch_events(self._engine.stream(request), self._interval_ms):
            yield batch

    async def check_health(self) -> None:
        await self._engine.check_health()


def build_engine(generator: GeneratorConfig) -> TokenEngine:
    """The engine `generator.engine` names (not vllm: that one is Ray Serve LLM's)."""
    if generator.engine == "paced":
        return PacedEngine()
    if generator.engine != "openai" or generator.openai is None:
        raise ValueError(f"no external engine for generator.engine {generator.engine!r}")
    import httpx

    external = generator.openai
    tokenizer = ServingTokenizer.load(
        resolve_model_reference(generator.tokenizer_source(), PROJECT_ROOT)
    )
    client = httpx.AsyncClient(
        timeout=httpx.Timeout(external.read_timeout_s, connect=external.connect_timeout_s),
        limits=httpx.Limits(
            max_connections=external.max_connections,
            max_keepalive_connections=external.max_connections,
        ),
        trust_env=False,  # the server is named in config; no proxy from the environment
    )
    endpoint = OpenAIEndpoint(
        external.base_url, generator.served_model_name(), load_settings().generator_api_key
    )
    logger.info("generator streams from %s (model %s)", endpoint.base_url, endpoint.model)
    return OpenAIEngine(endpoint, client, tokenizer.count_chat, generator.max_model_len)


async def _check_served_model(engine: OpenAIEngine, model: str) -> None:
    """Say at start-up whether the server is there and serves `model`. Only a warning: the
    server may come up after this replica, and each request is refused with a 503 until
    it does."""
    try:
        names = {str(entry.get("id")) for entry in await engine.served_models()}
    except Exception as exc:
        logger.warning("the generation server does not answer /models yet: %s", exc)
        return
    if model not in names:
        logger.warning(
            "the generation server does not list model %r (it serves %s)", model, sorted(names)
        )
