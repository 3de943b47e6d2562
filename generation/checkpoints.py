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


def dtype_problem(model_source: str, dtype: Any) -> str | None:
    """Why `dtype` cannot serve the checkpoint at `model_source`, or None when it can (or
    when nothing is known about it)."""
    quantization = quantization_config(model_source)
    # auto (vLLM: the checkpoint's own 16-bit dtype) and fastest (generation.dtype: 16-bit
    # for these checkpoints) both choose a dtype the kernels take.
    if quantization is None or dtype is None or str(dtype) in (*HALF_DTYPES, "auto", "fastest"):
        return None
    bits = weight_only_bits(quantization)
    if bits is None or bits > 8:
        return None
    return (
        f"{model_source} holds {bits}-bit weights with 16-bit activations, whose kernels take "
        f"bfloat16 or float16 activations, not {dtype}: set generator.engine_kwargs.dtype to "
        "bfloat16 (vLLM's CPU build fails at the first request otherwise)"
    )
