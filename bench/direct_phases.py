"""bench.direct's two measured phases, the same questions one at a time, streamed:

- pipeline: `serve run` the base config on a free port (bench.service, as bench.suite does,
  warm-up request included), then each question through /v1/rag/query;
- direct: `vllm serve` the generator's model folder with the generator's engine args from the
  same config (bench.vllm_server) on 127.0.0.1 and a free port, warmed up with the warm-up
  question's final prompt, then each question's final messages through /v1/chat/completions.

Both ask for temperature 0. Each phase's server is stopped before the phase returns.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from app.config import PROJECT_ROOT, GeneratorConfig
from bench.final_prompts import FinalPrompt
from bench.loadgen import RequestRecord, RequestSpec, make_client, run_load
from bench.service import free_port, running_service
from bench.suite import warm_up
from bench.variant import write_variant
from bench.vllm_server import running_vllm, vllm_environment, vllm_serve_argv, warm_up_vllm
from pipeline.messages import CompressionMethod
from retrieval.models import resolve_model_reference

logger = logging.getLogger(__name__)

HOST = "127.0.0.1"
# Both phases are greedy, whatever the config's default temperature.
TEMPERATURE = 0.0


@dataclass(frozen=True)
class PhaseSettings:
    """What both phases share: the requests' max_tokens, the folder for the servers' configs
    and logs, and the limits on a server's start and on one request."""

    max_tokens: int
    out: Path
    ready_timeout_s: float
    request_timeout_s: float


def pipeline_phase(
    base_config: Path,
    questions: Sequence[str],
    method: CompressionMethod,
    settings: PhaseSettings,
) -> list[RequestRecord]:
    """Serve the base config, changed only in its port, as bench.suite does; warm it up;
    send the questions one at a time."""
    port = free_port()
    config_path = write_variant(base_config, {}, settings.out / "pipeline.serve.yaml", port)
    specs = [
        RequestSpec(
            "rag", q, settings.max_tokens, compression_method=method, temperature=TEMPERATURE
        )
        for q in questions
    ]
    started = time.perf_counter()
    log_path = settings.out / "pipeline.serve.log"
    with running_service(
        config_path, port, log_path, ready_timeout_s=settings.ready_timeout_s
    ) as url:
        logger.info("pipeline ready in %.0f s", time.perf_counter() - started)
        warm_up(url)
        return asyncio.run(run_one_at_a_time(url, specs, settings.request_timeout_s))


def direct_phase(
    generator: GeneratorConfig,
    app_env_vars: Mapping[str, str],
    warm_prompt: FinalPrompt,
    prompts: Sequence[FinalPrompt],
    settings: PhaseSettings,
) -> tuple[list[str], list[RequestRecord]]:
    """Start vllm serve with the generator's engine args (and the application's runtime_env
    env_vars under the generator's own), warm it up with the warm-up question's final
    prompt, send the final prompts one at a time; (argv, records)."""
    port = free_port()
    argv = vllm_serve_argv(
        sys.executable,
        resolve_model_reference(generator.model_source, PROJECT_ROOT),
        generator,
        HOST,
        port,
    )
    env = vllm_environment(os.environ, app_env_vars, generator)
    specs = [
        RequestSpec(
            "chat",
            prompt.question,
            settings.max_tokens,
            model=generator.model_id,
            messages=prompt.messages,
            temperature=TEMPERATURE,
        )
        for prompt in prompts
    ]
    base_url = f"http://{HOST}:{port}"
    logger.info("direct phase: %s", " ".join(argv))
    started = time.perf_counter()
    log_path = settings.out / "direct.vllm.log"
    with running_vllm(argv, env, base_url, log_path, settings.ready_timeout_s):
        logger.info("vllm serve healthy in %.0f s", time.perf_counter() - started)
        # The pipeline's warm-up names no temperature: the config's default.
        warm_up_vllm(
            base_url, generator.model_id, warm_prompt.messages, generator.default_temperature
        )
        records = asyncio.run(run_one_at_a_time(base_url, specs, settings.request_timeout_s))
    return argv, records


async def run_one_at_a_time(
    base_url: str, specs: Sequence[RequestSpec], request_timeout_s: float
) -> list[RequestRecord]:
    """Send `specs` in order at concurrency 1, streaming; one record each."""
    async with make_client(base_url, request_timeout_s=request_timeout_s) as client:
        return await run_load(
            client,
            specs,
            rate_per_s=None,
            concurrency=1,
            seed=0,
            request_timeout_s=request_timeout_s,
        )
