"""Generator deployment: Ray Serve LLM's `LLMServer` (vLLM), plus one typed `generate`.

`generate` takes a `GenerationRequest` and streams batches of typed events read straight
from vLLM's engine (`generation.vllm_engine`); LLMServer still brings the engine start,
placement groups, engine metrics (`ray_vllm_*`) and the health check that gets a replica
with a dead engine replaced. The ingress never imports vLLM (about 700 MB and 8 s per
process) to talk to it.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

from ray import serve
from ray.serve.llm import LLMConfig, LLMServer

from generation.batching import batch_events
from generation.vllm_engine import VllmEngine
from pipeline.log import get_logger
from pipeline.messages import GenerationEvent, GenerationRequest

logger = get_logger(__name__)


class GeneratorServer(LLMServer):
    async def __init__(  # type: ignore[misc]  # LLMServer's constructor is async
        self,
        llm_config: LLMConfig,
        *,
        stream_batching_interval_ms: float = 10.0,
        cpu_binding: list[str] | None = None,
    ) -> None:
        if cpu_binding:
            # Before the engine starts: its worker process inherits the binding.
            rank = _replica_rank()
            cores = cpu_binding[rank % len(cpu_binding)]
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = cores
            logger.info("generator replica %d binds vLLM's threads to cores %s", rank, cores)
        self._interval_ms = stream_batching_interval_ms
        await super().__init__(llm_config)
        client = getattr(self.engine, "_engine_client", None)
        if client is None:
            raise RuntimeError("this Ray Serve LLM engine exposes no vLLM engine client")
        self._vllm = VllmEngine.from_engine_client(client)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[list[GenerationEvent]]:
        """Stream one chat completion as batches of TokenEvent, then a FinishEvent (or one
        ErrorEvent): the first token at once, later ones at most every interval."""
        async for batch in batch_events(self._vllm.stream(request), self._interval_ms):
            yield batch


def _replica_rank() -> int:
    rank = serve.get_replica_context().rank
    return int(getattr(rank, "rank", rank))
