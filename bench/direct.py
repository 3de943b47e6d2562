"""Latency-lab ablation: the same final prompts through the RAG pipeline and straight to vLLM.

    python -m bench.direct --num-requests 8 --compression sentences --max-tokens 32 \\
        --out DIR [--base-config serve_config.yaml] [--ready-timeout-s 420]

What the Ray Serve chain (HTTP proxy, ingress, retriever and compressor hops, the generator's
LLMServer wrapper) adds to TTFT and TPOT, measured on the client:

1. The final chat messages are built here (bench.final_prompts), with the project's own code
   and the base config's values: the retriever's embedder and FAISS index, the compressor
   deployment's own `prepare` (PromptPreparer) with the question's compression plan, as the
   ingress makes it.
2. Phase "pipeline" (bench.direct_phases): `serve run` the base config on a free port
   (bench.service, as bench.suite does, warm-up request included), then the first N of
   bench.latency's questions, one at a time, streamed through /v1/rag/query.
3. Phase "direct": `vllm serve` the generator's model folder (through vLLM's server module,
   see bench.vllm_server.VLLM_SERVER_MODULE) with the generator's engine args from the same
   config, on 127.0.0.1 and a free port; warm it up with the warm-up question's final prompt,
   then send the N final message lists, one at a time, streamed through
   /v1/chat/completions. Both phases ask for temperature 0.

Each question's prompt must be the same on both paths: the pipeline's `usage.prompt_tokens`
(its `done` event) must equal vLLM's for the same question; a difference is reported as
MISMATCH, on stderr and in the outputs, and the run exits 1. Writes DIR/direct.json (config,
prompts, both phases' records and summaries, the comparison: bench.direct_comparison) and
DIR/direct.md (bench.direct_report, also printed), besides the services' logs
(DIR/pipeline.serve.log, DIR/direct.vllm.log). Exits 1 on a mismatch or when a phase had no
successful request.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import logging
import signal
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx
import yaml

from app.config import RagAppConfig, parse_config
from bench import latency
from bench.direct_comparison import (
    PromptCheck,
    check_prompts,
    compare_p50,
    mismatch_warning,
    ttft_breakdown,
)
from bench.direct_phases import TEMPERATURE, PhaseSettings, direct_phase, pipeline_phase
from bench.direct_report import markdown_report
from bench.final_prompts import PromptJob, build_final_prompts, compression_plan
from bench.loadgen import DEFAULT_REQUEST_TIMEOUT_S
from bench.service import ROOT, ServiceError
from bench.stats import Summary, summarize
from bench.suite import WARM_UP_MAX_TOKENS, WARM_UP_QUESTION
from bench.variant import first_application
from pipeline.messages import COMPRESSION_METHODS, CompressionMethod

logger = logging.getLogger(__name__)


class DirectBenchError(RuntimeError):
    """The ablation cannot run as asked; the message says why."""


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

    settings = PhaseSettings(args.max_tokens, out, args.ready_timeout_s, args.request_timeout_s)
    pipeline_records = pipeline_phase(args.base_config, questions, method, settings)
    vllm_argv, direct_records = direct_phase(
        config.generator, serve_config.env_vars, warm_prompt, prompts, settings
    )

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
