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
    # Before: 15,153,506,048 B per step (see the L4 floors in test_advisor_floors.py).
    # AWQ: 4,540,336,576 B read of the weights (the 16-bit input table is not) + 144,179,200
    # = 4,684,515,776 B -> x3.23481.
    recs = recommend(LLAMA_8B, L4, Workload(1000, 200), EngineSettings(), TechniqueSettings())
    awq = recommendation(recs, "weight quantization to awq")
    assert awq.recommended
    assert awq.speedup == close(15_153_506_048 / 4_684_515_776)
    # fp8: (8.03e9 - 1,050,673,152) * 1 + 2,101,346,304 = 9,080,673,152 B held, less the
    # input table's 1,050,673,152 = 8,030,000,000 B read + 144,179,200 = 8,174,179,200 B.
    fp8 = recommendation(recs, "weight quantization to fp8")
    assert fp8.speedup == close(15_153_506_048 / 8_174_179_200)


def test_no_weight_quantization_when_already_4_bit():
    engine = EngineSettings(quantization="awq")
    recs = recommend(LLAMA_8B, L4, Workload(1000, 200), engine, TechniqueSettings())
    rec = recommendation(recs, "weight quantization")
    assert not rec.recommended
    assert rec.speedup == 1.0


def test_prefix_caching_gain_is_the_prefill_saved():
    # Uncached 1256 tokens: 2 * 7,504,663,424 * 1256 / 989e12 = 19.0614 ms; cached 256:
    # 15.1763 ms. Ratio 1256 / 1000 = 1.256 (both compute-bound, above 4.48 ms of weight reads).
    workload = Workload(1256, 10, cached_tokens=256)
    recs = recommend(LLAMA_8B, H100, workload, EngineSettings(), TechniqueSettings())
    rec = recommendation(recs, "prefix caching")
    assert rec.recommended
    assert rec.speedup == close(1.256)


def test_prompt_compression_gain_counts_prefill_and_decode():
    # Batch time = prefill + output decode (one request at concurrency 1).
    # H100, 2000 -> 1000 prompt tokens, 100 output:
    # before TTFT 30.35253 ms + 100 * (15,009,326,848 + 2050 * 131,072) / 3.35e12 = 486.41 ms;
    # after  TTFT 15.17627 ms + 100 * (15,009,326,848 + 1050 * 131,072) / 3.35e12 = 467.32 ms.
    streamed, matmul = 15_009_326_848, 7_504_663_424
    before_ms = 2 * matmul * 2000 / 989e12 * 1e3 + 100 * (streamed + 2050 * 131072) / 3.35e9
    after_ms = 2 * matmul * 1000 / 989e12 * 1e3 + 100 * (streamed + 1050 * 131072) / 3.35e9
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
