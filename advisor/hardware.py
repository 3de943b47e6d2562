"""GPU and model presets for the bottleneck advisor: datasheet figures and config shapes.

Plain data, no arithmetic beyond lookups: `advisor.floors` turns these into floors. Memory sizes
are the datasheet's decimal gigabytes (24 GB -> 24e9 bytes); the device usually reports a bit
more (an "80 GB" H100 shows ~85e9 bytes), so fits computed from these are slightly conservative.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TypeVar

GB = 1e9
TFLOPS = 1e12

# Bytes per weight for each `--quantization`. AWQ and GPTQ are 4-bit weight formats; their
# group scales (~0.02 byte/param at group size 128) are ignored.
WEIGHT_BYTES_PER_PARAM: dict[str, float] = {
    "fp32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5,
    "awq": 0.5,
    "gptq": 0.5,
}
KV_BYTES_PER_ELEMENT: dict[str, float] = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0}
# Quantized checkpoints (fp8, int8, int4, AWQ, GPTQ) keep the embedding and LM head in 16 bits.
UNQUANTIZED_BYTES_PER_PARAM = 2.0

_Spec = TypeVar("_Spec")


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator: what bounds decode (bandwidth), prefill (FLOP/s) and the KV cache (memory).

    `peak_flops_per_s` is the dense (no 2:4 sparsity) bf16/fp16 tensor-core rate; the 8-bit
    rates are the dense FP8 and INT8 tensor-core rates where the GPU has them (None: it has
    none, and W8A8 matmuls of that kind run at the 16-bit rate at best). A CPU is described
    the same way from a probe of the machine (advisor.cpu_probe): its bf16, int8 and fp32
    matrix rates and the bandwidth one read of the weights gets.
    """

    name: str
    memory_bandwidth_bytes_per_s: float
    peak_flops_per_s: float
    memory_bytes: float
    peak_fp8_flops_per_s: float | None = None
    peak_int8_ops_per_s: float | None = None
    # The fp32 rate, where fp32 weights are served (a CPU); None: the 16-bit rate.
    peak_fp32_flops_per_s: float | None = None

    def compute_peak(self, quantization: str) -> float:
        """The tensor-core rate the matmuls of `quantization` run at. fp8 and int8 are W8A8
        (vLLM quantizes the activations too), so they run on the 8-bit tensor cores where
        there are some: on an H200, FP8 took 0.51x the bf16 time on a 4,096-token layer
        (docs/retired.md, the retired bench.gpu_matmul). The 4-bit formats (AWQ, GPTQ,
        int4) are W4A16: their kernels dequantize to bf16 and run at the 16-bit rate."""
        rates = {
            "fp8": self.peak_fp8_flops_per_s,
            "int8": self.peak_int8_ops_per_s,
            "fp32": self.peak_fp32_flops_per_s,
        }
        return rates.get(quantization) or self.peak_flops_per_s

    def for_quantization(self, quantization: str) -> GpuSpec:
        """This GPU with `peak_flops_per_s` the rate `quantization`'s matmuls run at."""
        return replace(self, peak_flops_per_s=self.compute_peak(quantization))

    @property
    def ridge_flops_per_byte(self) -> float:
        """Arithmetic intensity above which a kernel is compute-bound on this GPU."""
        return self.peak_flops_per_s / self.memory_bandwidth_bytes_per_s


@dataclass(frozen=True)
class ModelSpec:
    """The shape of a decoder-only transformer, as far as the floors need it.

    `params` counts every weight. `embedding_params` are those in the input embedding and LM
    head (one matrix when tied), which quantized checkpoints keep in 16 bits; 0 treats every
    weight as quantized. With untied embeddings (`tied_embeddings` False) half of them are
    the input table, of which a step reads only its tokens' rows: held in memory, not
    streamed. `hidden_size` is informational: the floors count 2 FLOPs per parameter per
    token and leave out attention's FLOPs (about 2% at 1,000 tokens on Llama-3-8B).
    """

    name: str
    params: float
    layers: int
    kv_heads: int
    head_dim: int
    hidden_size: int | None = None
    embedding_params: float = 0.0
    tied_embeddings: bool = True

    @property
    def input_table_params(self) -> float:
        """Params of an input embedding table of its own (0 when tied to the LM head)."""
        return 0.0 if self.tied_embeddings else min(self.embedding_params, self.params) / 2

    @property
    def matmul_params(self) -> float:
        """Params a token multiplies through: all but an input table of its own (a gather)."""
        return self.params - self.input_table_params


GPUS: dict[str, GpuSpec] = {
    # No public NVIDIA datasheet for this AWS-only part; figures as AWS/NVIDIA publish them in
    # spec comparisons (the A10 has the same memory but 125 dense bf16 TFLOPS).
    "a10g": GpuSpec("A10G", 600 * GB, 70 * TFLOPS, 24 * GB),
    # Vendor datasheet (NVIDIA L4): 242 bf16 TFLOPS with sparsity -> 121 dense, 300 GB/s GDDR6;
    # FP8 485 TFLOPS and INT8 485 TOPS with sparsity -> 242.5 dense.
    "l4": GpuSpec("L4", 300 * GB, 121 * TFLOPS, 24 * GB, 242.5 * TFLOPS, 242.5 * TFLOPS),
    # Vendor datasheet (NVIDIA A100, SXM): 312 dense bf16 TFLOPS; 1,555 GB/s HBM2; INT8 624
    # dense TOPS; no FP8 tensor cores.
    "a100-40gb": GpuSpec("A100-40GB", 1555 * GB, 312 * TFLOPS, 40 * GB, None, 624 * TFLOPS),
    # Vendor datasheet (NVIDIA A100, SXM): 312 dense bf16 TFLOPS; 2,039 GB/s HBM2e.
    "a100-80gb": GpuSpec("A100-80GB", 2039 * GB, 312 * TFLOPS, 80 * GB, None, 624 * TFLOPS),
    # Vendor datasheet (NVIDIA H100 SXM5): 1,979 bf16 TFLOPS with sparsity -> 989 dense; FP8
    # 3,958 TFLOPS and INT8 3,958 TOPS with sparsity -> 1,979 dense.
    "h100-sxm": GpuSpec("H100-SXM", 3350 * GB, 989 * TFLOPS, 80 * GB, 1979 * TFLOPS, 1979 * TFLOPS),
    # Vendor datasheet (NVIDIA H200 SXM): H100's compute, 4.8 TB/s HBM3e, 141 GB.
    "h200": GpuSpec("H200", 4800 * GB, 989 * TFLOPS, 141 * GB, 1979 * TFLOPS, 1979 * TFLOPS),
}

MODELS: dict[str, ModelSpec] = {
    # config.json: 32 layers, 8 KV heads of 128, hidden 4096, vocab 128,256, untied embeddings
    # (2 * 128256 * 4096 embedding + LM head params).
    "llama-3-8b": ModelSpec("Llama-3-8B", 8.03e9, 32, 8, 128, 4096, 2 * 128256 * 4096, False),
    # config.json: 80 layers, 8 KV heads of 128, hidden 8192, vocab 128,256, untied.
    "llama-3-70b": ModelSpec("Llama-3-70B", 70.6e9, 80, 8, 128, 8192, 2 * 128256 * 8192, False),
    # As prepared here (make models-qwen15, from the GGUF): 28 layers, 2 KV heads of 128,
    # hidden 1536, vocab 151,936, the LM head its own matrix; 1,777,088,000 params counted
    # from its safetensors.
    "qwen2.5-coder-1.5b": ModelSpec(
        "Qwen2.5-Coder-1.5B", 1777088000, 28, 2, 128, 1536, 2 * 151936 * 1536, False
    ),
    # config.json: 24 layers, 2 KV heads of 64, hidden 896, vocab 151,936, tied embeddings.
    "qwen2.5-0.5b": ModelSpec("Qwen2.5-0.5B", 494e6, 24, 2, 64, 896, 151936 * 896),
    # config.json: 30 layers, 3 KV heads of 64, hidden 576, vocab 49,152, tied embeddings.
    "smollm2-135m": ModelSpec("SmolLM2-135M", 134.5e6, 30, 3, 64, 576, 49152 * 576),
}


def gpu_preset(name: str) -> GpuSpec:
    """The preset GPU called `name` (case-insensitive); ValueError naming the choices if none."""
    return _lookup(GPUS, name, "GPU")


def model_preset(name: str) -> ModelSpec:
    """The preset model called `name` (case-insensitive); ValueError naming the choices if none."""
    return _lookup(MODELS, name, "model")


def _lookup(table: dict[str, _Spec], name: str, kind: str) -> _Spec:
    try:
        return table[name.lower()]
    except KeyError:
        raise ValueError(f"unknown {kind} {name!r}; presets: {', '.join(table)}") from None


def device_from_probe(probe: dict[str, object]) -> GpuSpec:
    """The machine a probe measured (advisor.cpu_probe's JSON) as the advisor's device."""

    def rate(key: str, unit: float) -> float | None:
        value = probe.get(key)
        return None if value is None else float(value) * unit  # type: ignore[arg-type]

    bandwidth, bf16, memory = (
        rate("memory_bandwidth_gb_per_s", GB),
        rate("bf16_tflops", TFLOPS),
        rate("memory_gb", GB),
    )
    if bandwidth is None or bf16 is None or memory is None:
        raise ValueError("a probe needs memory_bandwidth_gb_per_s, bf16_tflops and memory_gb")
    return GpuSpec(
        str(probe.get("name", "probed device")),
        bandwidth,
        bf16,
        memory,
        peak_int8_ops_per_s=rate("int8_tops", TFLOPS),
        peak_fp32_flops_per_s=rate("fp32_tflops", TFLOPS),
    )
