"""advisor.floors and the advisor.hardware presets it reads: the floors against values worked out
by hand.

Every expected number is computed in the comment beside it from datasheet figures and config
shapes, not by calling the code under test.
"""

from __future__ import annotations

import pytest

from advisor.floors import (
    COMPUTE_BOUND_DECODE,
    COMPUTE_BOUND_PREFILL,
    MEMORY_BOUND_DECODE,
    PROMPT_LENGTH_BOUND,
    EngineSettings,
    TechniqueSettings,
    Workload,
    classify,
    compute_floors,
    decode_step,
    kv_bytes_per_token,
    max_concurrent_sequences,
    prefill_floors_s,
    speculative_expected_tokens,
    speculative_speedup,
    streamed_weight_bytes,
    weight_bytes,
)
from advisor.hardware import (
    GPUS,
    MODELS,
    GpuSpec,
    ModelSpec,
    device_from_probe,
    gpu_preset,
    model_preset,
)

LLAMA_8B = MODELS["llama-3-8b"]
L4 = GPUS["l4"]
H100 = GPUS["h100-sxm"]
# Llama-3-8B's embedding + LM head: 2 * 128256 * 4096 = 1,050,673,152 params. Untied: the
# input table (525,336,576) is gathered, not multiplied or streamed, so a token multiplies
# through 8.03e9 - 525,336,576 = 7,504,663,424 params and a bf16 forward pass reads
# 16.06e9 - 2 * 525,336,576 = 15,009,326,848 B.
LLAMA_8B_EMBEDDING_PARAMS = 1_050_673_152
LLAMA_8B_MATMUL_PARAMS = 7_504_663_424
LLAMA_8B_STREAMED_BF16 = 15_009_326_848
# A toy model and GPU with round numbers: 1e9 params, bf16 -> 2e9 weight bytes;
# KV per token 2 * 10 layers * 5 heads * 100 * 2 B = 20,000 B; ridge 1e14 / 1e12 = 100 FLOP/B.
TOY_MODEL = ModelSpec("toy", params=1e9, layers=10, kv_heads=5, head_dim=100)
TOY_GPU = GpuSpec(
    "toy", memory_bandwidth_bytes_per_s=1e12, peak_flops_per_s=1e14, memory_bytes=12e9
)


def close(expected: float):
    return pytest.approx(expected, rel=1e-9)


def test_presets_carry_the_datasheet_and_config_figures():
    assert (L4.memory_bandwidth_bytes_per_s, L4.peak_flops_per_s, L4.memory_bytes) == (
        300e9,
        121e12,
        24e9,
    )
    assert H100.peak_flops_per_s == 989e12
    assert H100.memory_bandwidth_bytes_per_s == 3.35e12
    assert set(GPUS) == {"a10g", "l4", "a100-40gb", "a100-80gb", "h100-sxm", "h200"}
    assert (LLAMA_8B.params, LLAMA_8B.layers, LLAMA_8B.kv_heads, LLAMA_8B.head_dim) == (
        8.03e9,
        32,
        8,
        128,
    )
    llama_70b = MODELS["llama-3-70b"]
    assert (llama_70b.params, llama_70b.layers, llama_70b.kv_heads) == (70.6e9, 80, 8)
    assert LLAMA_8B.embedding_params == LLAMA_8B_EMBEDDING_PARAMS
    # L4 ridge point: 121e12 / 300e9 = 403.33 FLOP/B.
    assert L4.ridge_flops_per_byte == close(403.3333333333333)


def test_preset_lookup_is_case_insensitive_and_names_the_choices():
    assert gpu_preset("H100-SXM") is H100
    assert model_preset("SmolLM2-135M").layers == 30
    with pytest.raises(ValueError, match="l4"):
        gpu_preset("tpu")


def test_kv_bytes_per_token_llama_3_8b_bf16_and_fp8():
    # 2 * 32 layers * 8 KV heads * 128 head dim * 2 B = 131,072 B; fp8 halves it.
    assert kv_bytes_per_token(LLAMA_8B, "bf16") == 131072
    assert kv_bytes_per_token(LLAMA_8B, "fp8") == 65536


def test_kv_bytes_per_token_small_models():
    # SmolLM2-135M: 2 * 30 * 3 * 64 * 2 = 23,040 B; Qwen2.5-0.5B: 2 * 24 * 2 * 64 * 2 = 12,288 B.
    assert kv_bytes_per_token(MODELS["smollm2-135m"], "bf16") == 23040
    assert kv_bytes_per_token(MODELS["qwen2.5-0.5b"], "bf16") == 12288


def test_weight_bytes_bf16_is_two_bytes_per_param():
    # 8.03e9 * 2 = 16.06e9 B.
    assert weight_bytes(LLAMA_8B, "bf16") == close(16.06e9)
    assert weight_bytes(LLAMA_8B, "fp32") == close(32.12e9)


@pytest.mark.parametrize("quantization", ["int4", "awq", "gptq"])
def test_int4_weight_bytes_are_half_a_byte_per_param(quantization):
    # 1e9 params * 0.5 B = 0.5e9 B (toy model: no 16-bit embedding).
    assert weight_bytes(TOY_MODEL, quantization) == close(0.5e9)


def test_int8_and_fp8_weight_bytes_are_one_byte_per_param():
    assert weight_bytes(TOY_MODEL, "int8") == close(1e9)
    assert weight_bytes(TOY_MODEL, "fp8") == close(1e9)


def test_quantized_llama_keeps_embedding_and_lm_head_in_16_bits():
    # (8.03e9 - 1,050,673,152) * 0.5 + 1,050,673,152 * 2
    # = 3,489,663,424 + 2,101,346,304 = 5,591,009,728 B (the AWQ checkpoint is ~5.7 GB).
    assert weight_bytes(LLAMA_8B, "awq") == close(5_591_009_728)


def test_l4_decode_floor_at_batch_1_is_weights_over_bandwidth():
    # No context: 15,009,326,848 B / 300e9 B/s = 0.0500311 s; FLOPs 2 * 7,504,663,424 / 121e12
    # = 1.2404e-4 s.
    step = decode_step(LLAMA_8B, L4, LLAMA_8B_STREAMED_BF16, 131072, batch=1, context_tokens=0)
    assert step.memory_floor_s == close(LLAMA_8B_STREAMED_BF16 / 300e9)
    assert step.compute_floor_s == close(2 * LLAMA_8B_MATMUL_PARAMS / 121e12)
    assert step.floor_s == step.memory_floor_s


def test_l4_floors_for_one_llama_request():
    floors = compute_floors(LLAMA_8B, L4, Workload(1000, 200), EngineSettings())
    # Mean context 1000 + 200 / 2 = 1100 tokens: KV read 1100 * 131,072 = 144,179,200 B.
    # Step: (15,009,326,848 + 144,179,200) / 300e9 = 15,153,506,048 / 300e9 = 50.511687 ms.
    assert floors.weight_bytes == close(16.06e9)  # held in memory, all of it
    assert floors.streamed_weight_bytes == close(LLAMA_8B_STREAMED_BF16)
    assert floors.decode_context_tokens == 1100
    assert floors.decode_bytes_per_step == close(15_153_506_048)
    assert floors.tpot_floor_ms == close(50.51168682666667)
    # One sequence: 1 / 0.050511687 s = 19.7974 tokens/s.
    assert floors.decode_tokens_per_s_ceiling == close(1 / 0.05051168682666667)
    # 200 steps * 50.5117 ms = 10,102.337 ms.
    assert floors.output_decode_ms == close(10102.337365333333)
    # Intensity: 2 * 7,504,663,424 FLOPs / 15,153,506,048 B = 0.99047 FLOP/B.
    assert floors.decode_arithmetic_intensity_flops_per_byte == close(
        2 * LLAMA_8B_MATMUL_PARAMS / 15_153_506_048
    )


def test_prefill_floor_1000_tokens_on_h100():
    # Compute: 2 * 7,504,663,424 * 1000 / 989e12 = 15.1763 ms; memory: 15,009,326,848 /
    # 3.35e12 = 4.480 ms.
    compute_s, memory_s = prefill_floors_s(LLAMA_8B, H100, LLAMA_8B_STREAMED_BF16, 1000)
    assert compute_s == close(2 * LLAMA_8B_MATMUL_PARAMS * 1000 / 989e12)
    assert memory_s == close(LLAMA_8B_STREAMED_BF16 / 3.35e12)
    floors = compute_floors(LLAMA_8B, H100, Workload(1000, 10), EngineSettings())
    assert floors.ttft_floor_ms == close(15.17626577148635)


def test_cached_prefix_is_not_prefilled():
    # 1256 prompt tokens, 256 cached -> the same 1000 new tokens: 15.1763 ms.
    floors = compute_floors(LLAMA_8B, H100, Workload(1256, 10, cached_tokens=256), EngineSettings())
    assert floors.prefill_tokens == 1000
    assert floors.ttft_floor_ms == close(15.17626577148635)


def test_short_prefill_is_bound_by_reading_the_weights():
    # 10 tokens: compute 2 * 7,504,663,424 * 10 / 121e12 = 1.240 ms < memory 15,009,326,848 /
    # 300e9 = 50.031 ms.
    floors = compute_floors(LLAMA_8B, L4, Workload(10, 10), EngineSettings())
    assert floors.ttft_floor_ms == close(50.03108949333333)


def test_batched_prefill_adds_flops_but_reads_the_weights_once():
    # 16 prompts of 10 tokens: 16 * 2 * 7,504,663,424 * 10 / 121e12 = 19.847 ms of compute,
    # below one read of the weights, 15,009,326,848 / 300e9 = 50.031 ms; 16 prompts of 1000
    # tokens: 1,984.7 ms.
    short = compute_floors(LLAMA_8B, L4, Workload(10, 10, concurrency=16), EngineSettings())
    assert short.batch_prefill_ms == close(50.03108949333333)
    long = compute_floors(LLAMA_8B, L4, Workload(1000, 10, concurrency=16), EngineSettings())
    assert long.batch_prefill_ms == close(16 * 2 * LLAMA_8B_MATMUL_PARAMS * 1000 / 121e12 * 1e3)


def test_concurrency_that_fits_toy():
    # KV budget: 12e9 * 0.5 - 2e9 weights - 1e9 reserve = 3e9 B.
    # One sequence of 600 + 400 = 1000 tokens * 20,000 B = 20e6 B -> 3e9 / 20e6 = 150 fit.
    engine = EngineSettings(gpu_memory_utilization=0.5, activation_reserve_bytes=1e9)
    floors = compute_floors(TOY_MODEL, TOY_GPU, Workload(600, 400, concurrency=400), engine)
    assert floors.kv_budget_bytes == close(3e9)
    assert floors.kv_bytes_per_sequence == close(20e6)
    assert floors.max_concurrent_sequences == 150
    # Only the 150 that fit run at once.
    assert floors.running_sequences == 150


def test_concurrency_that_fits_llama_awq_on_l4():
    # Budget: 24e9 * 0.9 - 5,591,009,728 - 1e9 = 15,008,990,272 B.
    # Per sequence (2000 + 200) * 131,072 = 288,358,400 B -> 52.05 -> 52 fit.
    floors = compute_floors(
        LLAMA_8B, L4, Workload(2000, 200, concurrency=16), EngineSettings(quantization="awq")
    )
    assert floors.kv_budget_bytes == close(15_008_990_272)
    assert floors.max_concurrent_sequences == 52
    assert floors.running_sequences == 16


def test_nothing_fits_when_weights_exceed_memory():
    # Llama-3-70B bf16: 141.2e9 B of weights > 24e9 * 0.9.
    assert max_concurrent_sequences(-1.0, 131072, 100) == 0
    floors = compute_floors(MODELS["llama-3-70b"], L4, Workload(100, 10), EngineSettings())
    assert floors.max_concurrent_sequences == 0


def test_classify_memory_bandwidth_bound_decode():
    # Prefill max(2 * 7.50e9 * 100 / 121e12 = 12.4 ms, 50.0 ms) = 50.0 ms; decode 500 steps of
    # ~50.1 ms = 25.0 s; intensity ~1 FLOP/B << ridge 403.
    floors = compute_floors(LLAMA_8B, L4, Workload(100, 500), EngineSettings())
    assert classify(floors)[0] == MEMORY_BOUND_DECODE


def test_classify_prompt_length_bound():
    # Prefill 2 * 7,504,663,424 * 8000 / 121e12 = 992.4 ms; decode 10 steps of
    # (15,009,326,848 + 8005 * 131,072) / 300e9 = 53.53 ms -> 535.3 ms < 992.4 ms.
    floors = compute_floors(LLAMA_8B, L4, Workload(8000, 10), EngineSettings())
    assert classify(floors)[0] == PROMPT_LENGTH_BOUND


def test_classify_compute_bound_prefill():
    # H100, 32 running: one prefill 2 * 7,504,663,424 * 2000 / 989e12 = 30.35 ms < decode of
    # 100 steps of (15,009,326,848 + 32 * 2050 * 131,072 = 23,607,650,048 B) / 3.35e12 =
    # 7.0471 ms = 704.7 ms; but 32 prefills = 971.3 ms of compute > 704.7 ms.
    floors = compute_floors(LLAMA_8B, H100, Workload(2000, 100, concurrency=32), EngineSettings())
    assert floors.running_sequences == 32
    assert floors.output_decode_ms == close(100 * 23_607_650_048 / 3.35e12 * 1e3)
    assert classify(floors)[0] == COMPUTE_BOUND_PREFILL


def test_classify_compute_bound_decode():
    # Toy model with 4 B of KV per token (1 layer, 1 head, dim 1) on a ridge-100 GPU with room:
    # batch 256 reads ~2.0005e9 B for 2 * 1e9 * 256 = 5.12e11 FLOPs -> ~256 FLOP/B > 100.
    # Step max(2.0005 ms, 5.12 ms) * 1000 = 5,120 ms >> 256 prefills of 2 ms = 512 ms.
    model = ModelSpec("tiny-kv", params=1e9, layers=1, kv_heads=1, head_dim=1)
    gpu = GpuSpec("big", 1e12, 1e14, 1e12)
    floors = compute_floors(model, gpu, Workload(1, 1000, concurrency=256), EngineSettings())
    assert floors.tpot_floor_ms == close(5.12)
    assert classify(floors)[0] == COMPUTE_BOUND_DECODE


def test_speculative_expected_tokens():
    # (1 - 0.8^5) / (1 - 0.8) = (1 - 0.32768) / 0.2 = 3.3616.
    assert speculative_expected_tokens(0.8, 4) == close(3.3616)
    # Every draft accepted: k + 1; none: 1.
    assert speculative_expected_tokens(1.0, 4) == 5
    assert speculative_expected_tokens(0.0, 4) == 1


def test_speculative_decoding_pays_at_batch_1_when_memory_bound():
    # Verifying 5 tokens: 5 * 2 * 7.50e9 / 121e12 = 0.62 ms << 53.5 ms of weight reads, so the
    # step costs the same and the gain is the 3.3616 expected tokens.
    techniques = TechniqueSettings(acceptance_rate=0.8, draft_tokens=4)
    speedup = speculative_speedup(LLAMA_8B, L4, 16.06e9, 131072, 1, 0, techniques)
    assert speedup == close(3.3616)
    # A draft forward costing 0.1 of a step: 3.3616 / (1 + 4 * 0.1) = 2.4011.
    costly = TechniqueSettings(acceptance_rate=0.8, draft_tokens=4, draft_cost_ratio=0.1)
    assert speculative_speedup(LLAMA_8B, L4, 16.06e9, 131072, 1, 0, costly) == close(2.4011428571)


def test_speculative_decoding_loses_at_high_concurrency_when_compute_bound():
    # Toy GPU, batch 256, no context: plain step max(2 ms, 2 * 1e9 * 256 / 1e14 = 5.12 ms);
    # verifying 5 tokens: 25.6 ms. Speed-up 3.3616 * 5.12 / 25.6 = 0.67232 < 1.
    techniques = TechniqueSettings(acceptance_rate=0.8, draft_tokens=4)
    speedup = speculative_speedup(TOY_MODEL, TOY_GPU, 2e9, 20000, 256, 0, techniques)
    assert speedup == close(0.67232)


def test_workload_rejects_a_fully_cached_prompt():
    with pytest.raises(ValueError, match="cached_tokens"):
        Workload(100, 10, cached_tokens=100)


# --- the rate each kind of weights runs at -----------------------------------------------------


def test_w8a8_runs_on_the_8_bit_tensor_cores_and_w4a16_at_the_16_bit_rate():
    h200 = GPUS["h200"]

    assert h200.compute_peak("bf16") == 989e12
    assert h200.compute_peak("fp8") == h200.compute_peak("int8") == 1979e12
    assert h200.compute_peak("awq") == h200.compute_peak("gptq") == 989e12
    # No FP8 tensor cores on an A100 (INT8 yes); none given for the A10G.
    assert GPUS["a100-80gb"].compute_peak("fp8") == 312e12
    assert GPUS["a100-80gb"].compute_peak("int8") == 624e12
    assert GPUS["a10g"].compute_peak("int8") == GPUS["a10g"].peak_flops_per_s


def test_fp8_halves_the_prefill_compute_floor_where_awq_does_not():
    workload = Workload(prompt_tokens=4000, output_tokens=100, concurrency=1)
    floors = {
        q: compute_floors(LLAMA_8B, GPUS["h200"], workload, EngineSettings(quantization=q))
        for q in ("bf16", "fp8", "awq")
    }

    # 1,979 against 989 dense TFLOPS: half, to the datasheet's rounding.
    assert floors["fp8"].prefill_compute_floor_ms == pytest.approx(
        floors["bf16"].prefill_compute_floor_ms / 2, rel=1e-3
    )
    assert floors["awq"].prefill_compute_floor_ms == close(floors["bf16"].prefill_compute_floor_ms)
    # And decode, bound by the bytes, gains from both.
    assert floors["fp8"].tpot_floor_ms < floors["bf16"].tpot_floor_ms
    assert floors["awq"].tpot_floor_ms < floors["fp8"].tpot_floor_ms


def test_a_gpu_without_8_bit_rates_keeps_its_16_bit_rate():
    assert TOY_GPU.for_quantization("fp8") == TOY_GPU


# --- what a forward pass reads, and a probed CPU ------------------------------------------------


def test_an_untied_input_table_is_held_but_neither_streamed_nor_multiplied():
    # AWQ: 5,591,009,728 B held (above); less the 16-bit input table, 2 * 525,336,576 B:
    # 4,540,336,576 B read a step.
    assert LLAMA_8B.matmul_params == LLAMA_8B_MATMUL_PARAMS
    assert streamed_weight_bytes(LLAMA_8B, "bf16") == close(LLAMA_8B_STREAMED_BF16)
    assert streamed_weight_bytes(LLAMA_8B, "awq") == close(4_540_336_576)
    # fp32 holds the table at 4 bytes a param: 32.12e9 - 4 * 525,336,576 = 30,018,653,696 B.
    assert streamed_weight_bytes(LLAMA_8B, "fp32") == close(30_018_653_696)
    # Tied (one matrix, the LM head's): all of it is multiplied and read.
    qwen = MODELS["qwen2.5-0.5b"]
    assert qwen.matmul_params == qwen.params
    assert streamed_weight_bytes(qwen, "int8") == weight_bytes(qwen, "int8")


def test_the_prepared_qwen_coder_1_5b_reads_0_58x_the_bytes_in_int8():
    # 1,777,088,000 params, 2 * 151,936 * 1,536 = 466,747,392 of them embedding and LM head.
    # bf16 read: (1,777,088,000 - 233,373,696) * 2 = 3,087,428,608 B; int8: the body at 1 B,
    # (1,777,088,000 - 466,747,392) = 1,310,340,608 B, plus the 16-bit LM head 466,747,392 B
    # = 1,777,088,000 B; 1,777,088,000 / 3,087,428,608 = 0.57558.
    qwen = MODELS["qwen2.5-coder-1.5b"]
    assert streamed_weight_bytes(qwen, "bf16") == close(3_087_428_608)
    assert streamed_weight_bytes(qwen, "int8") == close(1_777_088_000)


def test_a_probed_cpu_runs_each_kind_at_its_measured_rate():
    cpu = device_from_probe(
        {
            "name": "a CPU",
            "memory_bandwidth_gb_per_s": 20.0,
            "bf16_tflops": 2.0,
            "int8_tops": 4.0,
            "fp32_tflops": 0.5,
            "memory_gb": 24.0,
        }
    )

    assert (cpu.name, cpu.memory_bandwidth_bytes_per_s, cpu.memory_bytes) == ("a CPU", 20e9, 24e9)
    assert cpu.compute_peak("bf16") == cpu.compute_peak("awq") == 2e12
    assert (cpu.compute_peak("int8"), cpu.compute_peak("fp32")) == (4e12, 0.5e12)
    # No int8 or fp32 product measured: the bf16 rate, as for a GPU without 8-bit units.
    bare = device_from_probe({"memory_bandwidth_gb_per_s": 20, "bf16_tflops": 2, "memory_gb": 8})
    assert bare.compute_peak("int8") == bare.compute_peak("fp32") == 2e12
    with pytest.raises(ValueError, match="bf16_tflops"):
        device_from_probe({"memory_bandwidth_gb_per_s": 20.0, "memory_gb": 24.0})
