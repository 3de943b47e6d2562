"""What each of this project's techniques would gain, by the arithmetic of `advisor.floors`.

Holds `Recommendation` and `recommend`, which recomputes the floors with one setting changed
per technique (weight quantization, KV-cache fp8, speculative decoding, prompt compression,
prefix caching, more replicas) and says whether each pays here: mostly a gain of at least
`MIN_USEFUL_SPEEDUP` on its metric with at least one sequence still fitting.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from advisor.floors import (
    PREFILL_BOUND,
    EngineSettings,
    Floors,
    TechniqueSettings,
    Workload,
    classify,
    compute_floors,
    speculative_expected_tokens,
    speculative_speedup,
)
from advisor.hardware import GB, KV_BYTES_PER_ELEMENT, WEIGHT_BYTES_PER_PARAM, GpuSpec, ModelSpec

# A technique is recommended when the model says it gains at least this factor.
MIN_USEFUL_SPEEDUP = 1.1


@dataclass(frozen=True)
class Recommendation:
    """One technique: whether the model says it pays here, and by how much for which metric."""

    technique: str
    recommended: bool
    metric: str
    speedup: float
    detail: str


def recommend(
    model: ModelSpec,
    gpu: GpuSpec,
    workload: Workload,
    engine: EngineSettings,
    techniques: TechniqueSettings,
) -> list[Recommendation]:
    """Each technique of this project with its gain, recomputed from the same floors."""
    floors = compute_floors(model, gpu, workload, engine)
    # compute_floors takes the preset and picks the rate of each setting's weights; the two
    # that reason about compute themselves take the current weights' rate.
    at_rate = gpu.for_quantization(engine.quantization)
    bottleneck, _ = classify(floors)
    return [
        *_weight_quantization(model, gpu, workload, engine, floors),
        _kv_quantization(model, gpu, workload, engine, floors),
        _speculative_decoding(model, at_rate, workload, engine, techniques, floors, bottleneck),
        _prompt_compression(model, gpu, workload, engine, techniques, floors),
        _prefix_caching(model, at_rate, workload, engine, floors, bottleneck),
        _replicas(model, gpu, workload, engine, floors),
    ]


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
                f"{floors.tpot_floor_ms:.1f} -> {after.tpot_floor_ms:.1f} ms, TTFT floor "
                f"{floors.ttft_floor_ms:.1f} -> {after.ttft_floor_ms:.1f} ms; sequences that "
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
    weights, per_token = floors.streamed_weight_bytes, floors.kv_bytes_per_token

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
    per_token_us = 2 * model.matmul_params / gpu.peak_flops_per_s * 1e6
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
