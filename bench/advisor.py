"""Bottleneck advisor for LLM serving: roofline floors for one model, GPU and workload.

    python -m bench.advisor --model llama-3-8b --gpu l4 --quantization awq \\
        --prompt-tokens 2000 --output-tokens 200 --concurrency 16 [--cached-tokens 256] \\
        [--json] [--bench-result result.json]

From datasheet figures alone it gives the weight and KV-cache bytes, how many sequences fit,
the decode floor per step (bytes read / bandwidth, or FLOPs / peak when that is larger), the
TPOT floor and decode ceiling at the given concurrency, the prefill (TTFT) floor, the decode
arithmetic intensity against the GPU's ridge point, which of the bottlenecks the workload hits,
and what each of this project's techniques would gain by the same arithmetic. Floors are lower
bounds: real kernels reach 60-90% of bandwidth, and scheduling adds more on top.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from bench.hardware import (
    GB,
    GPUS,
    KV_BYTES_PER_ELEMENT,
    MODELS,
    TFLOPS,
    UNQUANTIZED_BYTES_PER_PARAM,
    WEIGHT_BYTES_PER_PARAM,
    GpuSpec,
    ModelSpec,
    gpu_preset,
    model_preset,
)

MEMORY_BOUND_DECODE = "memory-bandwidth-bound decode"
COMPUTE_BOUND_DECODE = "compute-bound decode"
COMPUTE_BOUND_PREFILL = "compute-bound prefill"
PROMPT_LENGTH_BOUND = "prompt-length-bound"
PREFILL_BOUND = (PROMPT_LENGTH_BOUND, COMPUTE_BOUND_PREFILL)
# A technique is recommended when the model says it gains at least this factor.
MIN_USEFUL_SPEEDUP = 1.1
BENCH_RESULT_KEYS = ("ttft_ms", "tpot_ms", "output_tokens_per_s")


@dataclass(frozen=True)
class Workload:
    """Requests in flight: each reads `prompt_tokens` (of which `cached_tokens` are a cached
    prefix) and writes `output_tokens`; `concurrency` of them run at once."""

    prompt_tokens: int
    output_tokens: int
    concurrency: int = 1
    cached_tokens: int = 0

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1 or self.output_tokens < 1 or self.concurrency < 1:
            raise ValueError("prompt_tokens, output_tokens and concurrency must be >= 1")
        if not 0 <= self.cached_tokens < self.prompt_tokens:
            # vLLM always recomputes at least the last prompt token.
            raise ValueError("cached_tokens must be >= 0 and below prompt_tokens")

    @property
    def new_prompt_tokens(self) -> int:
        """Prompt tokens that prefill has to compute."""
        return self.prompt_tokens - self.cached_tokens

    @property
    def sequence_tokens(self) -> int:
        """KV-cache tokens one finished sequence holds."""
        return self.prompt_tokens + self.output_tokens

    @property
    def mean_decode_context_tokens(self) -> float:
        """Context each decode step attends to, averaged over the output."""
        return self.prompt_tokens + self.output_tokens / 2


@dataclass(frozen=True)
class EngineSettings:
    """How the engine holds the model: weight format, KV dtype and the memory it may use."""

    quantization: str = "bf16"
    kv_dtype: str = "bf16"
    gpu_memory_utilization: float = 0.9
    activation_reserve_bytes: float = 1 * GB

    def __post_init__(self) -> None:
        if self.quantization not in WEIGHT_BYTES_PER_PARAM:
            raise ValueError(f"unknown quantization {self.quantization!r}")
        if self.kv_dtype not in KV_BYTES_PER_ELEMENT:
            raise ValueError(f"unknown KV cache dtype {self.kv_dtype!r}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")
        if self.activation_reserve_bytes < 0:
            raise ValueError("activation_reserve_bytes must be >= 0")


@dataclass(frozen=True)
class TechniqueSettings:
    """Assumptions behind the what-ifs: speculative decoding's acceptance rate, draft length
    and draft cost (one draft forward as a fraction of one target step; ~0 for n-gram
    lookup), and prompt compression's rate (fraction of the uncached prompt kept)."""

    acceptance_rate: float = 0.7
    draft_tokens: int = 4
    draft_cost_ratio: float = 0.0
    compression_rate: float = 0.5

    def __post_init__(self) -> None:
        if not 0 <= self.acceptance_rate <= 1:
            raise ValueError("acceptance_rate must be in [0, 1]")
        if self.draft_tokens < 1:
            raise ValueError("draft_tokens must be >= 1")
        if self.draft_cost_ratio < 0:
            raise ValueError("draft_cost_ratio must be >= 0")
        if not 0 < self.compression_rate <= 1:
            raise ValueError("compression_rate must be in (0, 1]")


@dataclass(frozen=True)
class DecodeStep:
    """One batched decode step: bytes it reads, FLOPs it does, and the time floors of each."""

    batch: int
    bytes_read: float
    flops: float
    memory_floor_s: float
    compute_floor_s: float
    arithmetic_intensity_flops_per_byte: float

    @property
    def floor_s(self) -> float:
        """The step cannot be faster than its slower resource."""
        return max(self.memory_floor_s, self.compute_floor_s)


@dataclass(frozen=True)
class Floors:
    """Every figure the advisor derives for one model, GPU, engine and workload."""

    weight_bytes: float
    kv_bytes_per_token: float
    kv_budget_bytes: float
    kv_bytes_per_sequence: float
    max_concurrent_sequences: int
    running_sequences: int
    decode_context_tokens: float
    decode_bytes_per_step: float
    decode_memory_floor_ms: float
    decode_compute_floor_ms: float
    tpot_floor_ms: float
    decode_tokens_per_s_ceiling: float
    decode_arithmetic_intensity_flops_per_byte: float
    ridge_flops_per_byte: float
    prefill_tokens: int
    prefill_compute_floor_ms: float
    prefill_memory_floor_ms: float
    ttft_floor_ms: float
    batch_prefill_ms: float
    output_decode_ms: float


@dataclass(frozen=True)
class Recommendation:
    """One technique: whether the model says it pays here, and by how much for which metric."""

    technique: str
    recommended: bool
    metric: str
    speedup: float
    detail: str


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


def weight_bytes(model: ModelSpec, quantization: str) -> float:
    """Bytes of weights in memory: quantized params at the format's width; with a quantized
    format, `embedding_params` at 16 bits."""
    width = WEIGHT_BYTES_PER_PARAM[quantization]
    if width >= UNQUANTIZED_BYTES_PER_PARAM:
        return model.params * width
    embedding = min(model.embedding_params, model.params)
    return (model.params - embedding) * width + embedding * UNQUANTIZED_BYTES_PER_PARAM


def kv_bytes_per_token(model: ModelSpec, kv_dtype: str) -> float:
    """2 (K and V) * layers * KV heads * head dim * bytes per element."""
    return 2 * model.layers * model.kv_heads * model.head_dim * KV_BYTES_PER_ELEMENT[kv_dtype]


def kv_budget_bytes(gpu: GpuSpec, weights_bytes: float, engine: EngineSettings) -> float:
    """Memory left for the KV cache: the engine's share of the GPU less weights and activations
    (may be negative when the weights do not fit)."""
    usable = gpu.memory_bytes * engine.gpu_memory_utilization
    return usable - weights_bytes - engine.activation_reserve_bytes


def max_concurrent_sequences(budget_bytes: float, per_token_bytes: float, tokens: int) -> int:
    """Whole sequences of `tokens` tokens whose KV cache fits in `budget_bytes` (0 if none)."""
    if budget_bytes <= 0:
        return 0
    return int(budget_bytes // (per_token_bytes * tokens))


def decode_step(
    model: ModelSpec,
    gpu: GpuSpec,
    weights_bytes: float,
    per_token_kv_bytes: float,
    batch: int,
    context_tokens: float,
    tokens_per_sequence: int = 1,
) -> DecodeStep:
    """Floors of one step that advances `batch` sequences of `context_tokens` context by
    `tokens_per_sequence` tokens each (more than 1 when verifying speculative drafts).

    Reads all weights once and every sequence's KV cache; does 2 FLOPs per parameter per token.
    """
    bytes_read = weights_bytes + batch * context_tokens * per_token_kv_bytes
    flops = 2 * model.params * batch * tokens_per_sequence
    return DecodeStep(
        batch=batch,
        bytes_read=bytes_read,
        flops=flops,
        memory_floor_s=bytes_read / gpu.memory_bandwidth_bytes_per_s,
        compute_floor_s=flops / gpu.peak_flops_per_s,
        arithmetic_intensity_flops_per_byte=flops / bytes_read,
    )


def prefill_floors_s(
    model: ModelSpec, gpu: GpuSpec, weights_bytes: float, new_tokens: int
) -> tuple[float, float]:
    """(compute floor, memory floor) in seconds to prefill `new_tokens`: 2 * params * tokens /
    peak FLOP/s, and one read of the weights / bandwidth. Prefill takes the larger."""
    compute_s = 2 * model.params * new_tokens / gpu.peak_flops_per_s
    memory_s = weights_bytes / gpu.memory_bandwidth_bytes_per_s
    return compute_s, memory_s


def speculative_expected_tokens(acceptance_rate: float, draft_tokens: int) -> float:
    """Tokens one verification step yields, (1 - a^(k+1)) / (1 - a), for per-token acceptance
    rate a and k drafted tokens (k + 1 when every draft is accepted)."""
    if acceptance_rate >= 1:
        return float(draft_tokens + 1)
    return (1 - acceptance_rate ** (draft_tokens + 1)) / (1 - acceptance_rate)


def speculative_speedup(
    model: ModelSpec,
    gpu: GpuSpec,
    weights_bytes: float,
    per_token_kv_bytes: float,
    batch: int,
    context_tokens: float,
    techniques: TechniqueSettings,
) -> float:
    """Decode speed-up from speculative decoding at `batch`: expected tokens per step times
    plain step time over (verification step + k draft forwards). Verifying k + 1 tokens costs
    the same bytes but k + 1 times the FLOPs, so the gain fades once the batch is compute-bound.
    """
    k = techniques.draft_tokens
    plain = decode_step(model, gpu, weights_bytes, per_token_kv_bytes, batch, context_tokens)
    verify = decode_step(
        model, gpu, weights_bytes, per_token_kv_bytes, batch, context_tokens, k + 1
    )
    step_s = verify.floor_s + k * techniques.draft_cost_ratio * plain.floor_s
    expected = speculative_expected_tokens(techniques.acceptance_rate, k)
    return expected * plain.floor_s / step_s


def compute_floors(
    model: ModelSpec, gpu: GpuSpec, workload: Workload, engine: EngineSettings
) -> Floors:
    """All floors for one configuration. When the concurrency exceeds what fits, only the
    sequences that fit run; the rest wait."""
    weights = weight_bytes(model, engine.quantization)
    per_token = kv_bytes_per_token(model, engine.kv_dtype)
    budget = kv_budget_bytes(gpu, weights, engine)
    fit = max_concurrent_sequences(budget, per_token, workload.sequence_tokens)
    running = min(workload.concurrency, fit) if fit > 0 else workload.concurrency
    context = workload.mean_decode_context_tokens
    step = decode_step(model, gpu, weights, per_token, running, context)
    prefill_compute_s, prefill_memory_s = prefill_floors_s(
        model, gpu, weights, workload.new_prompt_tokens
    )
    return Floors(
        weight_bytes=weights,
        kv_bytes_per_token=per_token,
        kv_budget_bytes=budget,
        kv_bytes_per_sequence=per_token * workload.sequence_tokens,
        max_concurrent_sequences=fit,
        running_sequences=running,
        decode_context_tokens=context,
        decode_bytes_per_step=step.bytes_read,
        decode_memory_floor_ms=step.memory_floor_s * 1e3,
        decode_compute_floor_ms=step.compute_floor_s * 1e3,
        tpot_floor_ms=step.floor_s * 1e3,
        decode_tokens_per_s_ceiling=running / step.floor_s,
        decode_arithmetic_intensity_flops_per_byte=step.arithmetic_intensity_flops_per_byte,
        ridge_flops_per_byte=gpu.ridge_flops_per_byte,
        prefill_tokens=workload.new_prompt_tokens,
        prefill_compute_floor_ms=prefill_compute_s * 1e3,
        prefill_memory_floor_ms=prefill_memory_s * 1e3,
        ttft_floor_ms=max(prefill_compute_s, prefill_memory_s) * 1e3,
        # Prefilling the running prompts together: their FLOPs add up, the weights are read once.
        batch_prefill_ms=max(running * prefill_compute_s, prefill_memory_s) * 1e3,
        output_decode_ms=workload.output_tokens * step.floor_s * 1e3,
    )


def classify(floors: Floors) -> tuple[str, str]:
    """(bottleneck, reason). In order: prompt-length-bound when one prompt's prefill outlasts
    its output's decode; compute-bound prefill when prefilling all running prompts (their
    FLOPs add up, unlike decode's weight reads) outlasts their batched decode; compute-bound
    decode when the decode batch is past the ridge point; otherwise memory-bandwidth-bound
    decode."""
    prefill_ms = floors.ttft_floor_ms
    decode_ms = floors.output_decode_ms
    all_prefill_ms = floors.batch_prefill_ms
    if prefill_ms > decode_ms:
        return PROMPT_LENGTH_BOUND, (
            f"prefill of one prompt ({prefill_ms:.1f} ms) exceeds the decode of its output "
            f"({decode_ms:.1f} ms)"
        )
    if all_prefill_ms > decode_ms:
        return COMPUTE_BOUND_PREFILL, (
            f"prefilling the {floors.running_sequences} running prompts ({all_prefill_ms:.1f} ms) "
            f"exceeds their batched decode ({decode_ms:.1f} ms)"
        )
    intensity = floors.decode_arithmetic_intensity_flops_per_byte
    if intensity >= floors.ridge_flops_per_byte:
        return COMPUTE_BOUND_DECODE, (
            f"decode at batch {floors.running_sequences} does {intensity:.0f} FLOP/B, past the "
            f"ridge point of {floors.ridge_flops_per_byte:.0f} FLOP/B"
        )
    return MEMORY_BOUND_DECODE, (
        f"decode at batch {floors.running_sequences} does {intensity:.1f} FLOP/B, below the "
        f"ridge point of {floors.ridge_flops_per_byte:.0f} FLOP/B; decoding the outputs takes "
        f"{decode_ms:.0f} ms against {all_prefill_ms:.0f} ms to prefill the prompts"
    )


def recommend(
    model: ModelSpec,
    gpu: GpuSpec,
    workload: Workload,
    engine: EngineSettings,
    techniques: TechniqueSettings,
) -> list[Recommendation]:
    """Each technique of this project with its gain, recomputed from the same floors."""
    floors = compute_floors(model, gpu, workload, engine)
    bottleneck, _ = classify(floors)
    return [
        *_weight_quantization(model, gpu, workload, engine, floors),
        _kv_quantization(model, gpu, workload, engine, floors),
        _speculative_decoding(model, gpu, workload, engine, techniques, floors, bottleneck),
        _prompt_compression(model, gpu, workload, engine, techniques, floors),
        _prefix_caching(model, gpu, workload, engine, floors, bottleneck),
        _replicas(model, gpu, workload, engine, floors),
    ]


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
        f"(2 x params x batch / {gpu.peak_flops_per_s / TFLOPS:g} TFLOP/s)",
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
    parser = argparse.ArgumentParser(
        prog="python -m bench.advisor", description=__doc__.splitlines()[0]
    )
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
        raise ValueError(f"give --model or all of {', '.join('--' + n for n in missing)}")
    return ModelSpec(name="custom", **overrides)


def _gpu_from_args(args: argparse.Namespace) -> GpuSpec:
    given = {
        "memory_bandwidth_bytes_per_s": _scaled(args.bandwidth_gb_per_s, GB),
        "peak_flops_per_s": _scaled(args.peak_tflops, TFLOPS),
        "memory_bytes": _scaled(args.memory_gb, GB),
    }
    overrides: dict[str, Any] = {name: value for name, value in given.items() if value is not None}
    if args.gpu:
        return replace(gpu_preset(args.gpu), **overrides)
    if len(overrides) < len(given):
        raise ValueError("give --gpu or all of --bandwidth-gb-per-s, --peak-tflops, --memory-gb")
    return GpuSpec(name="custom", **overrides)


def _scaled(value: float | None, unit: float) -> float | None:
    return None if value is None else value * unit


def _weight_quantization(
    model: ModelSpec, gpu: GpuSpec, workload: Workload, engine: EngineSettings, floors: Floors
) -> list[Recommendation]:
    now = WEIGHT_BYTES_PER_PARAM[engine.quantization]
    targets = [q for q in ("fp8", "awq") if WEIGHT_BYTES_PER_PARAM[q] < now]
    if not targets:
        return [
            Recommendation("weight quantization", False, "tpot", 1.0, "weights are already 4-bit")
        ]
    recs = []
    for target in targets:
        after = compute_floors(model, gpu, workload, replace(engine, quantization=target))
        speedup = floors.tpot_floor_ms / after.tpot_floor_ms
        recs.append(
            Recommendation(
                f"weight quantization to {target}",
                speedup >= MIN_USEFUL_SPEEDUP and after.max_concurrent_sequences > 0,
                "tpot",
                speedup,
                f"weights {floors.weight_bytes / GB:.2f} -> {after.weight_bytes / GB:.2f} GB "
                f"(x{floors.weight_bytes / after.weight_bytes:.2f} fewer bytes); TPOT floor "
                f"{floors.tpot_floor_ms:.1f} -> {after.tpot_floor_ms:.1f} ms; sequences that "
                f"fit {floors.max_concurrent_sequences} -> {after.max_concurrent_sequences}",
            )
        )
    return recs


def _kv_quantization(
    model: ModelSpec, gpu: GpuSpec, workload: Workload, engine: EngineSettings, floors: Floors
) -> Recommendation:
    if KV_BYTES_PER_ELEMENT[engine.kv_dtype] <= KV_BYTES_PER_ELEMENT["fp8"]:
        return Recommendation("KV cache fp8", False, "tpot", 1.0, "KV cache is already 8-bit")
    after = compute_floors(model, gpu, workload, replace(engine, kv_dtype="fp8"))
    speedup = floors.tpot_floor_ms / after.tpot_floor_ms
    more_fit = after.running_sequences > floors.running_sequences
    return Recommendation(
        "KV cache fp8",
        (speedup >= MIN_USEFUL_SPEEDUP or more_fit) and after.max_concurrent_sequences > 0,
        "tpot",
        speedup,
        f"KV per token {floors.kv_bytes_per_token:.0f} -> {after.kv_bytes_per_token:.0f} B; "
        f"TPOT floor {floors.tpot_floor_ms:.1f} -> {after.tpot_floor_ms:.1f} ms; sequences "
        f"that fit {floors.max_concurrent_sequences} -> {after.max_concurrent_sequences}",
    )


def _speculative_decoding(
    model: ModelSpec,
    gpu: GpuSpec,
    workload: Workload,
    engine: EngineSettings,
    techniques: TechniqueSettings,
    floors: Floors,
    bottleneck: str,
) -> Recommendation:
    a, k = techniques.acceptance_rate, techniques.draft_tokens
    context = workload.mean_decode_context_tokens
    weights, per_token = floors.weight_bytes, floors.kv_bytes_per_token

    def speedup_at(batch: int) -> float:
        return speculative_speedup(model, gpu, weights, per_token, batch, context, techniques)

    speedup = speedup_at(floors.running_sequences)
    batch_limit = max(floors.max_concurrent_sequences, workload.concurrency)
    largest = _largest_batch(lambda b: speedup_at(b) >= MIN_USEFUL_SPEEDUP, batch_limit)
    if largest == batch_limit == 1:
        pays_up_to = f"pays (x{MIN_USEFUL_SPEEDUP:g}+) at batch 1"
    elif largest == batch_limit:
        pays_up_to = f"pays (x{MIN_USEFUL_SPEEDUP:g}+) at every batch up to {batch_limit}"
    elif largest:
        pays_up_to = f"pays (x{MIN_USEFUL_SPEEDUP:g}+) up to batch {largest}, not beyond"
    else:
        pays_up_to = "does not pay at any batch"
    return Recommendation(
        "speculative decoding",
        speedup >= MIN_USEFUL_SPEEDUP and bottleneck not in PREFILL_BOUND,
        "tpot",
        speedup,
        f"a={a:g}, k={k}: {speculative_expected_tokens(a, k):.2f} tokens per verification "
        f"step, draft cost {techniques.draft_cost_ratio:g} of a step; verifying {k + 1} tokens "
        f"per sequence at batch {floors.running_sequences} costs "
        f"{floors.decode_compute_floor_ms * (k + 1):.1f} ms of compute against a "
        f"{floors.decode_memory_floor_ms:.1f} ms memory floor; {pays_up_to}",
    )


def _largest_batch(pays: Callable[[int], bool], limit: int) -> int:
    """Largest batch in 1..limit for which `pays` holds (0 if none); `pays` must only turn
    from true to false as the batch grows, as speculative decoding's gain does."""
    low, high = 0, limit
    while low < high:
        middle = (low + high + 1) // 2
        if pays(middle):
            low = middle
        else:
            high = middle - 1
    return low


def _prompt_compression(
    model: ModelSpec,
    gpu: GpuSpec,
    workload: Workload,
    engine: EngineSettings,
    techniques: TechniqueSettings,
    floors: Floors,
) -> Recommendation:
    kept = max(1, math.ceil(workload.new_prompt_tokens * techniques.compression_rate))
    shorter = replace(workload, prompt_tokens=workload.cached_tokens + kept)
    after = compute_floors(model, gpu, shorter, engine)
    # Time to prefill the running prompts and decode their outputs (one request's latency at
    # concurrency 1); a shorter prompt also leaves less KV cache to read on every decode step.
    batch_ms = floors.batch_prefill_ms + floors.output_decode_ms
    speedup = batch_ms / (after.batch_prefill_ms + after.output_decode_ms)
    return Recommendation(
        f"prompt compression (rate {techniques.compression_rate:g})",
        speedup >= MIN_USEFUL_SPEEDUP and after.max_concurrent_sequences > 0,
        "batch time",
        speedup,
        f"{workload.new_prompt_tokens} -> {kept} uncached prompt tokens: TTFT floor "
        f"{floors.ttft_floor_ms:.1f} -> {after.ttft_floor_ms:.1f} ms, TPOT floor "
        f"{floors.tpot_floor_ms:.1f} -> {after.tpot_floor_ms:.1f} ms, sequences that fit "
        f"{floors.max_concurrent_sequences} -> {after.max_concurrent_sequences}. An upper "
        "bound: only the retrieved context is compressed",
    )


def _prefix_caching(
    model: ModelSpec,
    gpu: GpuSpec,
    workload: Workload,
    engine: EngineSettings,
    floors: Floors,
    bottleneck: str,
) -> Recommendation:
    per_token_us = 2 * model.params / gpu.peak_flops_per_s * 1e6
    if workload.cached_tokens == 0:
        worth = "the workload is prefill-bound, so " if bottleneck in PREFILL_BOUND else ""
        return Recommendation(
            "prefix caching",
            False,
            "ttft",
            1.0,
            f"no cached prefix given; {worth}each cached token would save {per_token_us:.1f} us "
            "of prefill compute: give --cached-tokens (e.g. the system prompt's length)",
        )
    uncached = compute_floors(model, gpu, replace(workload, cached_tokens=0), engine)
    saved_ms = uncached.ttft_floor_ms - floors.ttft_floor_ms
    return Recommendation(
        "prefix caching",
        True,
        "ttft",
        uncached.ttft_floor_ms / floors.ttft_floor_ms,
        f"{workload.cached_tokens} cached tokens save {saved_ms:.1f} ms of prefill per request "
        f"(TTFT floor {uncached.ttft_floor_ms:.1f} -> {floors.ttft_floor_ms:.1f} ms, "
        "already counted above); keep the static prefix first and byte-identical",
    )


def _replicas(
    model: ModelSpec, gpu: GpuSpec, workload: Workload, engine: EngineSettings, floors: Floors
) -> Recommendation:
    fit = floors.max_concurrent_sequences
    if fit == 0:
        return Recommendation(
            "more replicas",
            False,
            "throughput",
            1.0,
            "not one sequence fits on this GPU: replicas of it do not help; quantize, shorten "
            "the sequences, or use more memory (a larger GPU or tensor parallelism)",
        )
    if workload.concurrency <= fit:
        return Recommendation(
            "more replicas",
            False,
            "throughput",
            1.0,
            f"all {workload.concurrency} sequences fit in one replica's KV cache ({fit} fit)",
        )
    replicas = math.ceil(workload.concurrency / fit)
    per_replica = replace(workload, concurrency=math.ceil(workload.concurrency / replicas))
    after = compute_floors(model, gpu, per_replica, engine)
    total_tokens_per_s = replicas * after.decode_tokens_per_s_ceiling
    return Recommendation(
        "more replicas",
        True,
        "throughput",
        total_tokens_per_s / floors.decode_tokens_per_s_ceiling,
        f"{workload.concurrency} sequences, {fit} fit per replica: {replicas} replicas run all "
        f"at once instead of queueing {workload.concurrency - fit}; decode ceiling "
        f"{floors.decode_tokens_per_s_ceiling:.0f} -> {total_tokens_per_s:.0f} tokens/s",
    )


if __name__ == "__main__":
    raise SystemExit(main())
