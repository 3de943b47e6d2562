"""Driving one vLLM engine in-process for the labs that compare engines, not services.

The prompts are the service's (a question, its retrieved chunks, the static system prompt,
the chat template), so a reader's speed and answers here are what the service would see
without its other stages. One engine per process: the labs alternate processes to keep
drift out of their comparisons.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from bench import stats


def service_messages(
    questions: Sequence[str], top_k: int, index: Path, system_prompt: str
) -> list[list[dict[str, str]]]:
    """Chat messages as the service builds them, the chunks retrieved from `index`."""
    from prepare.prompt import build_messages
    from retrieval.models import DEFAULT_EMBEDDING_MODEL, resolve_model_reference
    from retrieval.retriever import Retriever

    retriever = Retriever.load(index, resolve_model_reference(DEFAULT_EMBEDDING_MODEL))
    return [
        build_messages(system_prompt, retriever.retrieve(q, top_k).chunks, q) for q in questions
    ]


async def measure_point(
    engine: Any, prompts: Sequence[str], concurrency: int, max_tokens: int,
    ignore_eos: bool = False,
) -> tuple[list[dict[str, Any]], float]:  # fmt: skip
    """Every prompt once, at most `concurrency` at a time, greedy: per request its TTFT,
    E2E, TPOT, output token ids and text; and the point's wall time in seconds."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=ignore_eos)
    gate = asyncio.Semaphore(concurrency)

    async def one(prompt: str) -> dict[str, Any]:
        async with gate:
            start, first, ids, text = time.perf_counter(), None, [], ""
            async for out in engine.generate(prompt, params, str(uuid.uuid4())):
                first = first or time.perf_counter()
                ids, text = list(out.outputs[0].token_ids), out.outputs[0].text
            end = time.perf_counter()
        ttft_ms, e2e_ms = ((first or end) - start) * 1000, (end - start) * 1000
        return {"ttft_ms": ttft_ms, "e2e_ms": e2e_ms, "tokens": len(ids),
                "tpot_ms": stats.tpot(ttft_ms, e2e_ms, len(ids)), "token_ids": ids,
                "text": text}  # fmt: skip

    start = time.perf_counter()
    rows = await asyncio.gather(*(one(p) for p in prompts))
    return list(rows), time.perf_counter() - start


# The environment that decides how a CPU engine runs: its threads' cores, its KV cache, and
# an OpenMP runtime preloaded in place of the default one. Recorded with every run.
ENGINE_ENVIRONMENT = (
    "VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_INT4_W4A8", "LD_PRELOAD",
)  # fmt: skip


def engine_environment() -> dict[str, str | None]:
    """This process's ENGINE_ENVIRONMENT, as the engine it starts will see it."""
    return {key: os.environ.get(key) for key in ENGINE_ENVIRONMENT}


def every_cpu() -> str:
    """The cores this process may run on, as VLLM_CPU_OMP_THREADS_BIND writes them ("0,1")."""
    return ",".join(str(cpu) for cpu in sorted(os.sched_getaffinity(0)))


def engine_rss_bytes() -> int:
    """Resident memory of this process's children (vLLM's engine core and its worker)."""
    import psutil

    from harness.processes import descendants

    total = 0
    for child in descendants(os.getpid()):
        try:
            total += child.memory_info().rss
        except psutil.Error:
            continue
    return total


def make_run_engine_args() -> tuple[str, dict[str, Any]]:
    """The reader's folder and the engine arguments `make run` gives vLLM on this CPU (the
    weights and dtype `fastest` resolve to, its binding and environment), for an engine in
    this process."""
    from app.config import parse_config
    from bench.labs import cpu_info
    from generation.cpuinfo import omp_cores
    from generation.dtype import resolve_engine_kwargs
    from generation.weights import resolve_weights
    from pipeline.config_base import PROJECT_ROOT
    from retrieval.models import resolve_model_reference

    generator = parse_config({}).generator
    flags = cpu_info()[1]
    source = resolve_model_reference(generator.model_source, PROJECT_ROOT)
    source = resolve_weights(generator.weights, source, flags, False)
    kwargs = resolve_engine_kwargs(dict(generator.engine_kwargs), source, flags, False)
    for key, value in generator.env_vars.items():
        os.environ.setdefault(key, str(value))
    if generator.cpu_binding:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = omp_cores(generator.cpu_binding[0])
    # The service's API server reads some keys (enable_prompt_tokens_details); the engine not.
    from vllm import AsyncEngineArgs

    known = {f.name for f in fields(AsyncEngineArgs)}
    engine = {key: value for key, value in kwargs.items() if key in known}
    return source, {**engine, "model": source, "max_model_len": generator.max_model_len}
