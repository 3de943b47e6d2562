"""Bottleneck advisor for LLM serving: roofline floors for one model, GPU and workload.

    python -m advisor --model llama-3-8b --gpu l4 --quantization awq \\
        --prompt-tokens 2000 --output-tokens 200 --concurrency 16 [--cached-tokens 256] \\
        [--json] [--bench-result result.json]

The installed console script `rag-advisor` takes the same arguments; `make advise` runs the
GPU profile's case (1,500 prompt tokens, 256 of them cached; docs/benchmarks.md).

From datasheet figures alone it gives the weight and KV-cache bytes, how many sequences fit,
the decode floor per step (bytes read / bandwidth, or FLOPs / peak when that is larger), the
TPOT floor and decode ceiling at the given concurrency, the prefill (TTFT) floor, the decode
arithmetic intensity against the GPU's ridge point, which of the bottlenecks the workload hits,
and what each of this project's techniques would gain by the same arithmetic. Floors are lower
bounds: real kernels reach 60-90% of bandwidth, and scheduling adds more on top.

The arithmetic lives in `advisor.floors` and the per-technique gains in
`advisor.recommendations`; this module joins them into a `Report` (`advise`), sets measured
figures from a bench result beside their floors, formats the report as text, and is the CLI
(`main`, run by `python -m advisor` and the `rag-advisor` console script).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from advisor.floors import (
    EngineSettings,
    Floors,
    TechniqueSettings,
    Workload,
    classify,
    compute_floors,
)
from advisor.hardware import (
    GB,
    GPUS,
    KV_BYTES_PER_ELEMENT,
    MODELS,
    TFLOPS,
    WEIGHT_BYTES_PER_PARAM,
    GpuSpec,
    ModelSpec,
    device_from_probe,
    gpu_preset,
    model_preset,
)
from advisor.recommendations import Recommendation, recommend

BENCH_RESULT_KEYS = ("ttft_ms", "tpot_ms", "output_tokens_per_s")


@dataclass(frozen=True)
class MeasuredVsBound:
    """A measured figure beside its floor (latencies) or ceiling (throughput)."""

    metric: str
    measured: float
    bound: float
    bound_kind: str
    ratio: float


@dataclass(frozen=True)
class Report:
    """The advisor's answer: inputs, floors, bottleneck, recommendations, measured figures."""

    model: ModelSpec
    gpu: GpuSpec
    workload: Workload
    engine: EngineSettings
    floors: Floors
    bottleneck: str
    reason: str
    recommendations: list[Recommendation]
    measured: list[MeasuredVsBound] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data."""
        return asdict(self)


def advise(
    model: ModelSpec,
    gpu: GpuSpec,
    workload: Workload,
    engine: EngineSettings | None = None,
    techniques: TechniqueSettings | None = None,
    measured: dict[str, float] | None = None,
) -> Report:
    """The full report for one configuration, with measured figures joined when given."""
    engine = engine or EngineSettings()
    techniques = techniques or TechniqueSettings()
    floors = compute_floors(model, gpu, workload, engine)
    bottleneck, reason = classify(floors)
    return Report(
        model=model,
        gpu=gpu,
        workload=workload,
        engine=engine,
        floors=floors,
        bottleneck=bottleneck,
        reason=reason,
        recommendations=recommend(model, gpu, workload, engine, techniques),
        measured=compare_measured(floors, measured or {}),
    )


def load_bench_result(path: Path) -> dict[str, float]:
    """Measured figures from a JSON object holding any of ttft_ms, tpot_ms and
    output_tokens_per_s; ValueError on other keys, non-numbers, or none of them."""
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    unknown = sorted(set(data) - set(BENCH_RESULT_KEYS))
    if unknown:
        raise ValueError(f"{path}: unknown keys {unknown}; allowed: {list(BENCH_RESULT_KEYS)}")
    if not data:
        raise ValueError(f"{path}: none of {list(BENCH_RESULT_KEYS)} given")
    measured: dict[str, float] = {}
    for key, value in data.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ValueError(f"{path}: {key} must be a positive number, got {value!r}")
        measured[key] = float(value)
    return measured


def compare_measured(floors: Floors, measured: dict[str, float]) -> list[MeasuredVsBound]:
    """Each measured figure beside its bound; ratio = measured / bound (>= 1 for latency
    floors, <= 1 for the throughput ceiling when the floors hold)."""
    bounds = {
        "ttft_ms": (floors.ttft_floor_ms, "floor"),
        "tpot_ms": (floors.tpot_floor_ms, "floor"),
        "output_tokens_per_s": (floors.decode_tokens_per_s_ceiling, "ceiling"),
    }
    return [
        MeasuredVsBound(key, measured[key], bound, kind, measured[key] / bound)
        for key, (bound, kind) in bounds.items()
        if key in measured
    ]


def format_report(report: Report) -> str:
    """The report as aligned text lines."""
    f, w, e = report.floors, report.workload, report.engine
    model, gpu = report.model, report.gpu
    fit = f.max_concurrent_sequences
    lines = [
        f"{model.name} ({e.quantization} weights, {e.kv_dtype} KV) on {gpu.name}: "
        f"{w.prompt_tokens} prompt ({w.cached_tokens} cached) / {w.output_tokens} output "
        f"tokens, concurrency {w.concurrency}",
        "",
        "memory",
        f"  weights                  {f.weight_bytes / GB:10.2f} GB",
        f"  read per forward pass    {f.streamed_weight_bytes / GB:10.2f} GB  (all but an "
        "input table of its own)",
        f"  KV cache per token       {f.kv_bytes_per_token:10.0f} B   (2 x {model.layers} layers "
        f"x {model.kv_heads} KV heads x {model.head_dim} x "
        f"{KV_BYTES_PER_ELEMENT[e.kv_dtype]:g} B)",
        f"  KV budget                {f.kv_budget_bytes / GB:10.2f} GB  "
        f"({gpu.memory_bytes / GB:g} GB x {e.gpu_memory_utilization:g} - weights - "
        f"{e.activation_reserve_bytes / GB:g} GB activations)",
        f"  KV per sequence          {f.kv_bytes_per_sequence / GB:10.3f} GB  "
        f"({w.sequence_tokens} tokens)",
        f"  sequences that fit       {fit:10d}     (running {f.running_sequences} of "
        f"{w.concurrency})",
        "",
        f"decode (batch {f.running_sequences}, mean context {f.decode_context_tokens:g} tokens)",
        f"  bytes per step           {f.decode_bytes_per_step / GB:10.2f} GB",
        f"  memory floor             {f.decode_memory_floor_ms:10.2f} ms  "
        f"(bytes / {gpu.memory_bandwidth_bytes_per_s / GB:g} GB/s)",
        f"  compute floor            {f.decode_compute_floor_ms:10.2f} ms  "
        f"(2 x multiplied params x batch / {gpu.peak_flops_per_s / TFLOPS:g} TFLOP/s)",
        f"  TPOT floor               {f.tpot_floor_ms:10.2f} ms",
        f"  decode ceiling           {f.decode_tokens_per_s_ceiling:10.0f} tokens/s",
        f"  arithmetic intensity     {f.decode_arithmetic_intensity_flops_per_byte:10.1f} FLOP/B"
        f" (ridge {f.ridge_flops_per_byte:.0f} FLOP/B)",
        f"  output decode            {f.output_decode_ms:10.0f} ms  ({w.output_tokens} steps)",
        "",
        f"prefill ({f.prefill_tokens} uncached tokens)",
        f"  compute floor            {f.prefill_compute_floor_ms:10.2f} ms",
        f"  memory floor             {f.prefill_memory_floor_ms:10.2f} ms",
        f"  TTFT floor               {f.ttft_floor_ms:10.2f} ms",
        "",
        f"bottleneck: {report.bottleneck}",
        f"  {report.reason}",
    ]
    if fit == 0:
        lines.append("  WARNING: not one sequence fits; the floors assume it did")
    lines += ["", "recommendations ([x] = pays here by this model)"]
    for rec in report.recommendations:
        mark = "x" if rec.recommended else " "
        lines.append(f"  [{mark}] {rec.technique}: {rec.metric} x{rec.speedup:.2f}")
        lines.append(f"        {rec.detail}")
    if report.measured:
        lines += ["", "measured vs bound"]
        for m in report.measured:
            lines.append(
                f"  {m.metric:<22} {m.measured:10.1f} vs {m.bound_kind} {m.bound:10.1f}  "
                f"= x{m.ratio:.2f}"
            )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The CLI's arguments; a preset plus any overrides, or a model and GPU given by numbers."""
    parser = argparse.ArgumentParser(prog="python -m advisor", description=__doc__.splitlines()[0])
    parser.add_argument("--model", help=f"preset: {', '.join(MODELS)}")
    parser.add_argument("--params", type=float, help="parameter count, e.g. 8.03e9")
    parser.add_argument("--layers", type=int)
    parser.add_argument("--kv-heads", type=int)
    parser.add_argument("--head-dim", type=int)
    parser.add_argument("--hidden-size", type=int)
    parser.add_argument(
        "--embedding-params", type=float, help="params kept in 16 bits when quantized"
    )
    parser.add_argument("--gpu", help=f"preset: {', '.join(GPUS)}")
    parser.add_argument(
        "--device",
        type=Path,
        help="a machine measured by `python -m advisor.cpu_probe` (its JSON), instead of --gpu",
    )
    parser.add_argument("--bandwidth-gb-per-s", type=float, help="memory bandwidth, GB/s")
    parser.add_argument("--peak-tflops", type=float, help="dense peak for the compute dtype")
    parser.add_argument("--memory-gb", type=float, help="GPU memory, GB")
    parser.add_argument("--quantization", default="bf16", choices=list(WEIGHT_BYTES_PER_PARAM))
    parser.add_argument("--kv-dtype", default="bf16", choices=list(KV_BYTES_PER_ELEMENT))
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--activation-reserve-gb", type=float, default=1.0)
    parser.add_argument("--prompt-tokens", type=int, required=True)
    parser.add_argument("--output-tokens", type=int, required=True)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--cached-tokens", type=int, default=0)
    parser.add_argument("--acceptance-rate", type=float, default=0.7)
    parser.add_argument("--draft-tokens", type=int, default=4)
    parser.add_argument(
        "--draft-cost-ratio", type=float, default=0.0, help="draft forward / target step"
    )
    parser.add_argument(
        "--compression-rate", type=float, default=0.5, help="fraction of prompt kept"
    )
    parser.add_argument("--bench-result", type=Path, help="JSON with measured figures")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI on `argv` (sys.argv when None); 0 on success. Bad input exits with
    status 2 through argparse, with the message on stderr."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        report = advise(
            _model_from_args(args),
            _gpu_from_args(args),
            Workload(args.prompt_tokens, args.output_tokens, args.concurrency, args.cached_tokens),
            EngineSettings(
                args.quantization,
                args.kv_dtype,
                args.gpu_memory_utilization,
                args.activation_reserve_gb * GB,
            ),
            TechniqueSettings(
                args.acceptance_rate,
                args.draft_tokens,
                args.draft_cost_ratio,
                args.compression_rate,
            ),
            load_bench_result(args.bench_result) if args.bench_result else None,
        )
    except (ValueError, OSError) as error:
        parser.error(str(error))
    print(json.dumps(report.to_dict(), indent=2) if args.json else format_report(report))
    return 0


def _model_from_args(args: argparse.Namespace) -> ModelSpec:
    overrides = {
        name: value
        for name in ("params", "layers", "kv_heads", "head_dim", "hidden_size", "embedding_params")
        if (value := getattr(args, name)) is not None
    }
    if args.model:
        return replace(model_preset(args.model), **overrides)
    missing = [n for n in ("params", "layers", "kv_heads", "head_dim") if n not in overrides]
    if missing:
        flags = ", ".join("--" + n.replace("_", "-") for n in missing)
        raise ValueError(f"give --model, or a custom model's missing {flags}")
    return ModelSpec(name="custom", **overrides)


def _gpu_from_args(args: argparse.Namespace) -> GpuSpec:
    given = {
        "memory_bandwidth_bytes_per_s": _scaled(args.bandwidth_gb_per_s, GB),
        "peak_flops_per_s": _scaled(args.peak_tflops, TFLOPS),
        "memory_bytes": _scaled(args.memory_gb, GB),
    }
    overrides: dict[str, Any] = {name: value for name, value in given.items() if value is not None}
    if args.gpu and args.device:
        raise ValueError("give --gpu or --device, not both")
    if args.gpu:
        return replace(gpu_preset(args.gpu), **overrides)
    if args.device:
        return replace(device_from_probe(json.loads(args.device.read_text())), **overrides)
    if len(overrides) < len(given):
        raise ValueError(
            "give --gpu, --device or all of --bandwidth-gb-per-s, --peak-tflops, --memory-gb"
        )
    return GpuSpec(name="custom", **overrides)


def _scaled(value: float | None, unit: float) -> float | None:
    return None if value is None else value * unit
