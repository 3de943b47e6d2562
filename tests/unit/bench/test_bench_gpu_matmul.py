"""bench.gpu_matmul without a GPU: the advisor's floors it sets beside each timing, and the
table it renders from stored timings (its CUDA side ran on an H200: docs/gpu-profile.md)."""

from __future__ import annotations

import pytest

from bench import gpu_matmul


def test_the_layer_is_llama_3_8b_s_seven_matmuls():
    # q 4096^2, k and v 4096 x 1024, o 4096^2, gate and up 4096 x 14336, down 14336 x 4096.
    assert gpu_matmul.LAYER_WEIGHTS == 218_103_808


def test_floors_follow_the_bytes_in_decode_and_the_tensor_core_rate_in_prefill():
    decode = {k: gpu_matmul.floor_ms(k, 1, "h200") for k in gpu_matmul.KIND_BYTES}
    prefill = {k: gpu_matmul.floor_ms(k, 4096, "h200") for k in gpu_matmul.KIND_BYTES}

    # Decode reads every weight once: 2, 1 and 0.5 bytes a weight over 4.8 TB/s.
    assert decode["bf16"]["floor_ms"] == pytest.approx(218_103_808 * 2 / 4.8e12 * 1e3)
    assert decode["fp8-w8a8"]["floor_ms"] == pytest.approx(decode["bf16"]["floor_ms"] / 2)
    assert decode["int4-w4a16"]["floor_ms"] == pytest.approx(decode["bf16"]["floor_ms"] / 4)
    # Prefill is compute: W8A8 on the 8-bit tensor cores, W4A16 at the bf16 rate.
    assert prefill["fp8-w8a8"]["floor_ms"] == pytest.approx(
        prefill["bf16"]["floor_ms"] / 2, rel=1e-3
    )
    assert prefill["int4-w4a16"]["floor_ms"] == prefill["bf16"]["floor_ms"]


def result(rows: list[dict]) -> dict:
    return {"gpu": "GPU", "torch": "t", "cuda": "c", "measured_at": "now", "iterations": 3,
            "layer_weights": gpu_matmul.LAYER_WEIGHTS, "gpu_preset": "h200", "command": "cmd",
            "cuda_graphs": True, "rows": rows}  # fmt: skip


def test_render_sets_each_kind_against_bf16_at_the_same_tokens():
    rows = [
        {"kind": "bf16", "tokens": 1, "timings_ms": [0.2, 0.2, 0.2]},
        {"kind": "fp8-w8a8", "tokens": 1, "timings_ms": [0.1, 0.1, 0.1]},
        {"kind": "int8-w8a8", "tokens": 1, "error": "RuntimeError: too small"},
    ]

    text = gpu_matmul.render(result(rows))

    assert "replayed from CUDA graphs" in text
    assert "| fp8-w8a8 | 1 | 0.1000 [0.1000, 0.1000] (n = 3) | 0.50x [0.50, 0.50] |" in text
    assert "| int8-w8a8 | 1 | not run: RuntimeError: too small | - |" in text
