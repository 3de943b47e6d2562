"""Roofline arithmetic for LLM serving: the floors of one model, GPU, engine and workload.

Holds the inputs (`Workload`, `EngineSettings`, `TechniqueSettings`), the derived figures
(`DecodeStep`, `Floors`), the functions that compute them from datasheet figures alone (weight
and KV-cache bytes, the KV budget and how many sequences fit, the decode and prefill floors,
speculative decoding's expected tokens and speed-up, `compute_floors`) and `classify`, which
names the bottleneck with one of the bound-name constants. Pure arithmetic: no I/O, no
recommendations. Floors are lower bounds: real kernels reach 60-90% of bandwidth, and
scheduling adds more on top.
"""

from __future__ import annotations

from dataclasses import dataclass

from advisor.hardware import (
    GB,
    KV_BYTES_PER_ELEMENT,
    UNQUANTIZED_BYTES_PER_PARAM,
    WEIGHT_BYTES_PER_PARAM,
    GpuSpec,
    ModelSpec,
)

MEMORY_BOUND_DECODE = "memory-bandwidth-bound decode"
COMPUTE_BOUND_DECODE = "compute-bound decode"
COMPUTE_BOUND_PREFILL = "compute-bound prefill"
PROMPT_LENGTH_BOUND = "prompt-length-bound"
PREFILL_BOUND = (PROMPT_LENGTH_BOUND, COMPUTE_BOUND_PREFILL)


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
    streamed_weight_bytes: float  # what one forward pass reads of them
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


def weight_bytes(model: ModelSpec, quantization: str) -> float:
    """Bytes of weights in memory: quantized params at the format's width; with a quantized
    format, `embedding_params` at 16 bits."""
    width = WEIGHT_BYTES_PER_PARAM[quantization]
    if width >= UNQUANTIZED_BYTES_PER_PARAM:
        return model.params * width
    embedding = min(model.embedding_params, model.params)
    return (model.params - embedding) * width + embedding * UNQUANTIZED_BYTES_PER_PARAM


def streamed_weight_bytes(model: ModelSpec, quantization: str) -> float:
    """Bytes of weights a forward pass reads: all of them but an input table of its own, of
    which it gathers only its tokens' rows (kept in 16 bits by quantized checkpoints)."""
    width = max(WEIGHT_BYTES_PER_PARAM[quantization], UNQUANTIZED_BYTES_PER_PARAM)
    return weight_bytes(model, quantization) - model.input_table_params * width


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

    Reads the streamed weights (streamed_weight_bytes) once and every sequence's KV cache;
    does 2 FLOPs per multiplied parameter (ModelSpec.matmul_params) per token.
    """
    bytes_read = weights_bytes + batch * context_tokens * per_token_kv_bytes
    flops = 2 * model.matmul_params * batch * tokens_per_sequence
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
    """(compute floor, memory floor) in seconds to prefill `new_tokens`: 2 * multiplied params
    * tokens / peak FLOP/s, and one read of `weights_bytes` / bandwidth. Prefill takes the
    larger."""
    compute_s = 2 * model.matmul_params * new_tokens / gpu.peak_flops_per_s
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
    sequences that fit run; the rest wait. The matmuls run at the rate of the weights'
    kind (GpuSpec.compute_peak: W8A8 on the 8-bit tensor cores)."""
    gpu = gpu.for_quantization(engine.quantization)
    weights = weight_bytes(model, engine.quantization)
    streamed = streamed_weight_bytes(model, engine.quantization)
    per_token = kv_bytes_per_token(model, engine.kv_dtype)
    budget = kv_budget_bytes(gpu, weights, engine)
    fit = max_concurrent_sequences(budget, per_token, workload.sequence_tokens)
    running = min(workload.concurrency, fit) if fit > 0 else workload.concurrency
    context = workload.mean_decode_context_tokens
    step = decode_step(model, gpu, streamed, per_token, running, context)
    prefill_compute_s, prefill_memory_s = prefill_floors_s(
        model, gpu, streamed, workload.new_prompt_tokens
    )
    return Floors(
        weight_bytes=weights,
        streamed_weight_bytes=streamed,
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
