"""What a local checkpoint's own config says about how it must be served.

vLLM reads a quantized checkpoint's format from its `config.json` (`quantization_config`), so
serving one is config alone: `generator.model_source` names the folder. What vLLM does not
check up front is the activation dtype a weight-only 4-bit checkpoint needs: on its CPU build
the WNA16 kernel has no float32 path and the engine dies at its first forward
(`"cpu_gemm_wna16" not implemented for 'Float'`), after it has started. This module lets the
config refuse that pairing when it is loaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# Activation dtypes the 4-bit weight-only kernels take (vLLM's CPU WNA16, AWQ, GPTQ, Marlin).
HALF_DTYPES = ("bfloat16", "float16", "half", "bf16", "fp16")
# This project's dtype that the generator replica resolves on its own CPU (generation.dtype);
# for a checkpoint of half_activation_bits it always means bfloat16.
FASTEST = "fastest"


def quantization_config(model_source: str) -> dict[str, Any] | None:
    """The `quantization_config` of a local model folder's config.json; None for a folder
    without one, a hub id or an unreadable file (vLLM reports those itself)."""
    path = Path(model_source) / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    found = config.get("quantization_config") if isinstance(config, dict) else None
    return found if isinstance(found, dict) else None


def weight_only_bits(quantization: dict[str, Any]) -> int | None:
    """The weight width of a weight-only checkpoint (W4A16, AWQ, GPTQ); None when its
    activations are quantized too (W8A8) or the format says no width."""
    if quantization.get("quant_method") in ("awq", "gptq"):
        bits = quantization.get("bits", quantization.get("w_bit"))
        return int(bits) if isinstance(bits, int) else None
    widths = set()
    for group in (quantization.get("config_groups") or {}).values():
        if not isinstance(group, dict) or group.get("input_activations"):
            return None
        weights = group.get("weights") or {}
        if isinstance(weights.get("num_bits"), int):
            widths.add(weights["num_bits"])
    return widths.pop() if len(widths) == 1 else None


def half_activation_bits(model_source: str) -> int | None:
    """The weight width of the checkpoint at `model_source` when it is weight-only at 8 bits
    or fewer, whose kernels take 16-bit activations only; None for any other model."""
    quantization = quantization_config(model_source)
    bits = None if quantization is None else weight_only_bits(quantization)
    return bits if bits is not None and bits <= 8 else None


def dtype_problem(model_source: str, dtype: Any) -> str | None:
    """Why `dtype` cannot serve the checkpoint at `model_source`, or None when it can (or
    when nothing is known about it)."""
    # auto (vLLM: the checkpoint's own 16-bit dtype) and fastest (16-bit for these
    # checkpoints) both choose a dtype the kernels take.
    if dtype is None or str(dtype) in (*HALF_DTYPES, "auto", FASTEST):
        return None
    bits = half_activation_bits(model_source)
    if bits is None:
        return None
    return (
        f"{model_source} holds {bits}-bit weights with 16-bit activations, whose kernels take "
        f"bfloat16 or float16 activations, not {dtype}: set generator.engine_kwargs.dtype to "
        "bfloat16 (vLLM's CPU build fails at the first request otherwise)"
    )
