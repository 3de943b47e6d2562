"""advisor.recommendations: each technique's gain against values worked out by hand.

Every expected number is computed in the comment beside it from datasheet figures and config
shapes, not by calling the code under test; the floors they start from are worked out in
test_advisor_floors.py.
"""

from __future__ import annotations

import pytest

from advisor.floors import EngineSettings, TechniqueSettings, Workload
from advisor.hardware import GPUS, MODELS, GpuSpec, ModelSpec
from advisor.recommendations import Recommendation, recommend

LLAMA_8B = MODELS["llama-3-8b"]
L4 = GPUS["l4"]
H100 = GPUS["h100-sxm"]
# A toy model and GPU with round numbers: 1e9 params, bf16 -> 2e9 weight bytes;
# KV per token 2 * 10 layers * 5 heads * 100 * 2 B = 20,000 B; ridge 1e14 / 1e12 = 100 FLOP/B.
TOY_MODEL = ModelSpec("toy", params=1e9, layers=10, kv_heads=5, head_dim=100)
TOY_GPU = GpuSpec(
    "toy", memory_bandwidth_bytes_per_s=1e12, peak_flops_per_s=1e14, memory_bytes=12e9
)


def close(expected: float):
    return pytest.approx(expected, rel=1e-9)


def recommendation(recommendations: list[Recommendation], prefix: str) -> Recommendation:
    return next(r for r in recommendations if r.technique.startswith(prefix))


def test_weight_quantization_gain_is_the_step_bytes_ratio():
    # Before: 16,204,179,200 B per step (see the L4 floors in test_advisor_floors.py).
    # AWQ: 5,591,009,728 + 144,179,200 = 5,735,188,928 B -> x2.82539.
    recs = recommend(LLAMA_8B, L4, Workload(1000, 200), EngineSettings(), TechniqueSettings())
    awq = recommendation(recs, "weight quantization to awq")
    assert awq.recommended
    assert awq.speedup == close(16_204_179_200 / 5_735_188_928)
    # fp8: 5,591,009,728 -> (8.03e9 - 1,050,673,152) * 1 + 2,101,346,304 = 9,080,673,152 B of
    # weights + 144,179,200 = 9,224,852,352 B.
    fp8 = recommendation(recs, "weight quantization to fp8")
    assert fp8.speedup == close(16_204_179_200 / 9_224_852_352)


def test_no_weight_quantization_when_already_4_bit():
    engine = EngineSettings(quantization="awq")
    recs = recommend(LLAMA_8B, L4, Workload(1000, 200), engine, TechniqueSettings())
    rec = recommendation(recs, "weight quantization")
    assert not rec.recommended
    assert rec.speedup == 1.0


def test_prefix_caching_gain_is_the_prefill_saved():
    # Uncached 1256 tokens: 2 * 8.03e9 * 1256 / 989e12 = 20.3957 ms; cached 256: 16.2386 ms.
    # Ratio 1256 / 1000 = 1.256 (both compute-bound, above 4.79 ms of weight reads).
    workload = Workload(1256, 10, cached_tokens=256)
    recs = recommend(LLAMA_8B, H100, workload, EngineSettings(), TechniqueSettings())
    rec = recommendation(recs, "prefix caching")
    assert rec.recommended
    assert rec.speedup == close(1.256)


def test_prompt_compression_gain_counts_prefill_and_decode():
    # Batch time = prefill + output decode (one request at concurrency 1).
    # H100, 2000 -> 1000 prompt tokens, 100 output:
    # before TTFT 32.47725 ms + 100 * (16.06e9 + 2050 * 131,072) / 3.35e12 = 487.42381 ms;
    # after  TTFT 16.23862 ms + 100 * (16.06e9 + 1050 * 131,072) / 3.35e12 = 483.51121 ms.
    before_ms = 2 * 8.03e9 * 2000 / 989e12 * 1e3 + 100 * (16.06e9 + 2050 * 131072) / 3.35e9
    after_ms = 2 * 8.03e9 * 1000 / 989e12 * 1e3 + 100 * (16.06e9 + 1050 * 131072) / 3.35e9
    recs = recommend(LLAMA_8B, H100, Workload(2000, 100), EngineSettings(), TechniqueSettings())
    rec = recommendation(recs, "prompt compression")
    assert rec.speedup == close(before_ms / after_ms)
    # ~x1.04: decode dominates this request, so compression is not what to do here.
    assert not rec.recommended


def test_more_replicas_when_concurrency_exceeds_what_fits():
    # 150 fit (the toy case in test_advisor_floors.py), 400 wanted -> ceil(400 / 150) = 3 replicas.
    engine = EngineSettings(gpu_memory_utilization=0.5, activation_reserve_bytes=1e9)
    workload = Workload(600, 400, concurrency=400)
    recs = recommend(TOY_MODEL, TOY_GPU, workload, engine, TechniqueSettings())
    rec = recommendation(recs, "more replicas")
    assert rec.recommended
    assert "3 replicas" in rec.detail
    assert rec.speedup > 2
