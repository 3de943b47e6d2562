"""`dtype: fastest`: the activation dtype chosen on the generator replica's own CPU.

vLLM's CPU build runs bfloat16 fast or slowly depending on the CPU, and its `auto` takes the
checkpoint's dtype (bfloat16 for the Qwens) whatever the CPU. Measured here (docs/design.md,
docs/quantization.md): on AVX2 CPUs bf16 prefilled 6-9x slower than fp32; on an AVX-512
CPU with native bf16 (AVX512-BF16) it took 0.51x fp32's TTFT and 0.50x its TPOT. So
`fastest` is bfloat16 where the CPU has native bf16 instructions (AVX512-BF16 or AMX-BF16)
and float32 elsewhere, with two exceptions: a weight-only 4-bit checkpoint always gets
bfloat16 (its CPU kernel has no float32 path; generation.checkpoints), and on a GPU vLLM's
own `auto` decides. It is resolved in the replica (GeneratorServer), on the node whose CPU
runs the engine, not where the config was read.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from generation.checkpoints import FASTEST, half_activation_bits
from generation.cpuinfo import CPUINFO, read_cpuinfo

NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def cpu_flags(cpuinfo: Path = CPUINFO) -> frozenset[str]:
    """The instruction-set flags of this machine's first CPU (Linux); empty elsewhere."""
    return read_cpuinfo(cpuinfo).flags


def fastest_dtype(model_source: str, flags: Iterable[str], has_gpu: bool) -> str:
    """What `fastest` means for `model_source` on a machine with these CPU `flags`."""
    if has_gpu:
        return "auto"
    if half_activation_bits(model_source) is not None:
        return "bfloat16"
    return "bfloat16" if NATIVE_BF16_FLAGS & set(flags) else "float32"


def resolve_engine_kwargs(
    engine_kwargs: dict[str, Any], model_source: str, flags: Iterable[str], has_gpu: bool
) -> dict[str, Any]:
    """`engine_kwargs` with `dtype: fastest` replaced by the dtype it means here; any
    other value is vLLM's and passes unchanged."""
    if engine_kwargs.get("dtype") != FASTEST:
        return engine_kwargs
    return {**engine_kwargs, "dtype": fastest_dtype(model_source, flags, has_gpu)}
