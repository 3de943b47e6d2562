"""Generator deployment: Ray Serve LLM's `LLMServer` (vLLM), plus one typed `generate`.

`generate` takes a `GenerationRequest` and streams batches of typed events read straight
from vLLM's engine (`generation.vllm_engine`); LLMServer still brings the engine start,
placement groups, engine metrics (`ray_vllm_*`) and the health check that gets a replica
with a dead engine replaced. The ingress never imports vLLM (about 700 MB and 8 s per
process) to talk to it.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

from ray import serve
from ray.serve.llm import LLMConfig, LLMServer

from generation.batching import batch_events
from generation.cpuinfo import omp_cores
from generation.dtype import FASTEST, NATIVE_BF16_FLAGS, cpu_flags, fastest_dtype
from generation.vllm_engine import VllmEngine
from generation.weights import AMX_INT8_FLAG, Weights, resolve_weights
from pipeline.log import get_logger
from pipeline.messages import GenerationEvent, GenerationRequest

logger = get_logger(__name__)


class GeneratorServer(LLMServer):
    async def __init__(  # type: ignore[misc]  # LLMServer's constructor is async
        self,
        llm_config: LLMConfig,
        *,
        stream_batching_interval_ms: float = 50.0,
        cpu_binding: list[str] | None = None,
        weights: Weights = "given",
    ) -> None:
        if cpu_binding:
            # Before the engine starts: its worker process inherits the binding.
            rank = _replica_rank()
            cores = omp_cores(cpu_binding[rank % len(cpu_binding)])
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = cores
            logger.info("generator replica %d binds vLLM's threads to cores %s", rank, cores)
        _resolve_weights(llm_config, weights)
        _resolve_dtype(llm_config)
        self._interval_ms = stream_batching_interval_ms
        await super().__init__(llm_config)
        client = getattr(self.engine, "_engine_client", None)
        if client is None:
            raise RuntimeError("this Ray Serve LLM engine exposes no vLLM engine client")
        self._vllm = VllmEngine.from_engine_client(client, on_dead=_exit_soon)

    async def check_health(self) -> None:
        """A dead engine fails the check and ends the replica (see `_exit_soon`)."""
        await self._vllm.check_health()

    async def generate(self, request: GenerationRequest) -> AsyncIterator[list[GenerationEvent]]:
        """Stream one chat completion as batches of TokenEvent, then a FinishEvent (or one
        ErrorEvent): the first token at once, later ones at most every interval."""
        async for batch in batch_events(self._vllm.stream(request), self._interval_ms):
            yield batch


def _resolve_weights(llm_config: LLMConfig, weights: Weights) -> None:
    """`weights: fastest` becomes the checkpoint this node's CPU serves fastest
    (generation.weights): the model keeps its id, vLLM loads the other folder."""
    import torch

    loading = llm_config.model_loading_config
    asked = loading.model_source
    resolved = resolve_weights(weights, asked, cpu_flags(), torch.cuda.is_available())
    if resolved == asked:
        return
    loading.model_source = resolved
    # The engine config is cached on the LLMConfig (the builder already made it, and it
    # travelled here with it): the folder vLLM loads is its hf_model_id, which Ray's own
    # node initialization sets the same way.
    llm_config.get_engine_config().hf_model_id = resolved
    logger.info("generator weights %s: %s on this CPU (%s)", weights, resolved, AMX_INT8_FLAG)


def _resolve_dtype(llm_config: LLMConfig) -> None:
    """`dtype: fastest` becomes the dtype this node's CPU runs fastest (generation.dtype)."""
    asked = llm_config.engine_kwargs.get("dtype")
    if asked != FASTEST:
        return
    import torch

    flags = cpu_flags()
    source = llm_config.model_loading_config.model_source
    resolved = fastest_dtype(source, flags, torch.cuda.is_available())
    llm_config.update_engine_kwargs(dtype=resolved)
    native = sorted(NATIVE_BF16_FLAGS & flags) or ["no native bf16"]
    logger.info("generator dtype %s: %s on this CPU (%s)", asked, resolved, ", ".join(native))


def _replica_rank() -> int:
    rank = serve.get_replica_context().rank
    return int(getattr(rank, "rank", rank))


def _exit_soon(delay_s: float = 0.5) -> None:
    """End this replica's process shortly after its engine died, as vLLM's own server does:
    Serve sees the actor die and replaces it at once, instead of after three failed health
    checks, during which the router keeps sending requests to a replica that can only
    refuse them. The delay lets the refusals already made reach their callers."""
    logger.error("the vLLM engine died: this generator replica exits to be replaced")
    asyncio.get_running_loop().call_later(delay_s, os._exit, 1)
