"""The compression cost model of a GPU profile, predicted before any GPU has run it.

    python -m advisor.compression_costs --model llama-3-8b --gpu l4 --quantization awq \\
        --scorer xlm-roberta-large --scorer-dtype float32 --rate 0.5
    python -m advisor.compression_costs --measure-host [--repeats 20]

The first prints the `policy` and `cost_model` of serve_config's `compression` section, as
YAML, with the arithmetic in comments; the second measures the host-side figures it uses.
`python -m bench.context_sweep` fits the same coefficients from measurements; this is its
prediction, to start from until a GPU machine runs the sweep. Predicted, not measured:

- generator prefill per uncached token: the advisor's prefill compute floor (advisor.floors:
  2 x params / peak FLOP/s), and per token squared the attention FLOPs that floor leaves out
  (causal QK^T and AV over half the n x n scores: 2 x layers x hidden x n^2 / peak);
- LLMLingua-2 per chunk: one forward of the scorer over a 512-token window (llmlingua 0.2.2
  pads every piece of a context to 512 tokens, so a chunk costs a window whatever its
  length), the larger of its FLOPs over the GPU's peak for the scorer's dtype and its weight
  bytes over the bandwidth; plus the host's own work per call;
- LLMLingua-2 per context token and sentence selection: host work only (tokenising, merging
  tokens to words, tiktoken per word; dot products and token counts), measured on the CPU.

Floors are lower bounds for both sides of the comparison: real prefill and real scorer
passes are slower, by a similar factor, so the verdict (which requests pay) moves less than
the figures.
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from advisor.floors import prefill_floors_s, weight_bytes
from advisor.hardware import (
    GB,
    GPUS,
    MODELS,
    TFLOPS,
    WEIGHT_BYTES_PER_PARAM,
    GpuSpec,
    ModelSpec,
    gpu_preset,
    model_preset,
)
from prepare.cost_model import CompressionCostModel, CompressorCost, PrefillCost

ROOT = Path(__file__).resolve().parent.parent
COMMAND = "python -m advisor.compression_costs"
SCORER_DTYPE_BYTES: dict[str, float] = {"float32": 4.0, "bfloat16": 2.0}
# Dense FP32 peaks (CUDA cores) from the vendor datasheets: torch runs float32 matmuls at
# full precision unless told otherwise (float32_matmul_precision "highest", no TF32). The
# bf16 peaks are the GpuSpec's own.
FP32_TFLOPS: dict[str, float] = {
    "l4": 30.3,  # NVIDIA L4 datasheet: FP32 30.3 TFLOPS
    "a100-40gb": 19.5,  # NVIDIA A100 datasheet: FP32 19.5 TFLOPS
    "a100-80gb": 19.5,
    "h100-sxm": 67.0,  # NVIDIA H100 datasheet (SXM): FP32 67 TFLOPS
    "h200": 67.0,  # NVIDIA H200 datasheet (SXM): FP32 67 TFLOPS
}

# Host work of one LLMLingua-2 call with the scorer's forward pass taken out, measured with
# the stand-in scorer (scripts.llmlingua2_standin) on the 2-core CPU this project is
# developed on: `python -m advisor.compression_costs --measure-host --repeats 20`, three runs
# (each 20 calls at each of 6 chunk lengths, 52-404 cl100k tokens) fitted 4.8, 6.0 and
# 5.8 ms per call and 0.0125, 0.0089 and 0.0141 ms per token; these are the medians. A GPU
# server's CPU is usually faster.
HOST_MS_PER_CALL = 5.8
HOST_MS_PER_TOKEN = 0.0125
# Sentence selection is host work too: the CPU profile's fitted figure, from
# `python -m bench.context_sweep --lengths 512 1024 2048 4096 --repeats 3 --method sentences
# --paired` (n = 4 context lengths; docs/benchmarks.md), as serve_config.yaml ships it and
# docs/results/context-sentences/cost_model.json stores it (the unit tests hold it there).
SENTENCES_MS_PER_TOKEN = 0.0058
# Chunk lengths the host work is measured at (cl100k tokens): the index's chunks are up to
# 200 embedder tokens, so up to about 250 here; longer ones show the per-token slope.
HOST_TOKEN_LENGTHS = (50, 100, 150, 200, 300, 400)


@dataclass(frozen=True)
class ScorerSpec:
    """A token-classification scorer: what one forward over a window reads and computes.

    `encoder_params` are the weights every token passes through (the embedding table is
    only indexed, so neither read whole nor multiplied).
    """

    name: str
    encoder_params: float
    layers: int
    hidden_size: int
    window_tokens: int = 512


SCORERS: dict[str, ScorerSpec] = {
    # config.json: 24 layers of hidden 1024, FFN 4096: 24 x 12,596,224 encoder params (of 560M
    # in all; the 250,002 x 1024 embedding table is the rest).
    "xlm-roberta-large": ScorerSpec("XLM-RoBERTa-large", 302.3e6, 24, 1024),
    # config.json: 12 layers of hidden 768, FFN 3072: 12 x 7,087,872 (of 178M in all).
    "bert-base-multilingual-cased": ScorerSpec("BERT-base-multilingual-cased", 85.05e6, 12, 768),
}


@dataclass(frozen=True)
class HostCosts:
    """What runs on the compressor's CPU, GPU or not (milliseconds)."""

    llmlingua_ms_per_call: float = HOST_MS_PER_CALL
    llmlingua_ms_per_token: float = HOST_MS_PER_TOKEN
    sentences_ms_per_token: float = SENTENCES_MS_PER_TOKEN


@dataclass(frozen=True)
class Inputs:
    """What a prediction is for, as the command line names it: presets of advisor.hardware
    (model, GPU, weight format) and SCORERS, the scorer's dtype, the profile's rate (which
    decides the policy, not the coefficients) and the host's figures."""

    model: str = "llama-3-8b"
    gpu: str = "l4"
    quantization: str = "awq"
    scorer: str = "xlm-roberta-large"
    scorer_dtype: str = "float32"
    scorer_peak_tflops: float | None = None
    rate: float = 0.5
    host: HostCosts = HostCosts()

    def command(self) -> tuple[str, str]:
        """The command that predicts for these inputs, every input spelt out, in two lines."""
        first = (
            f"{COMMAND} --model {self.model} --gpu {self.gpu} --quantization {self.quantization}"
        )
        second = f"--scorer {self.scorer} --scorer-dtype {self.scorer_dtype} --rate {self.rate:g}"
        if self.scorer_peak_tflops is not None:
            second += f" --scorer-peak-tflops {self.scorer_peak_tflops:g}"
        shipped = HostCosts()
        for flag, value, default in (
            ("--host-ms-per-call", self.host.llmlingua_ms_per_call, shipped.llmlingua_ms_per_call),
            (
                "--host-ms-per-token",
                self.host.llmlingua_ms_per_token,
                shipped.llmlingua_ms_per_token,
            ),
            (
                "--sentences-ms-per-token",
                self.host.sentences_ms_per_token,
                shipped.sentences_ms_per_token,
            ),
        ):
            if value != default:
                second += f" {flag} {value:g}"
        return first, second


@dataclass(frozen=True)
class ScorerWindow:
    """Floors of one scorer forward over a padded window."""

    flops: float
    weight_bytes: float
    compute_ms: float
    memory_ms: float

    @property
    def floor_ms(self) -> float:
        return max(self.compute_ms, self.memory_ms)


@dataclass(frozen=True)
class PredictedCosts:
    """The predicted cost model and the figures it came from."""

    inputs: Inputs
    model: ModelSpec
    gpu: GpuSpec
    scorer: ScorerSpec
    scorer_peak_flops_per_s: float
    window: ScorerWindow
    cost_model: CompressionCostModel

    def overrides(self) -> dict[str, Any]:
        """The `compression.cost_model` block, rounded as serve_config holds it."""
        model = self.cost_model
        return {
            "prefill_ms_per_token": _significant(model.prefill.ms_per_token),
            "prefill_ms_per_token_squared": _significant(model.prefill.ms_per_token_squared),
            "sentences": {"ms_per_token": round(model.sentences.ms_per_token, 4)},
            "llmlingua": {
                "ms_per_token": round(model.llmlingua.ms_per_token, 4),
                "ms_per_chunk": round(model.llmlingua.ms_per_chunk, 2),
            },
        }

    def rounded_cost_model(self) -> CompressionCostModel:
        """The cost model as the rounded block gives it (what a deployment would use)."""
        block = self.overrides()
        return CompressionCostModel(
            prefill=PrefillCost(
                block["prefill_ms_per_token"], block["prefill_ms_per_token_squared"]
            ),
            sentences=CompressorCost(block["sentences"]["ms_per_token"]),
            llmlingua=CompressorCost(**block["llmlingua"]),
        )

    def verdict(self) -> Verdict:
        """The break-evens and the policy at the inputs' rate, from the rounded block."""
        return verdict(self.rounded_cost_model(), self.inputs.rate)


@dataclass(frozen=True)
class Verdict:
    """Where each method starts to pay at `rate`, and the policy that follows."""

    rate: float
    sentences_pays_below_rate: float
    llmlingua_pays_from_chunk_tokens: float
    policy: str
    reasons: list[str] = field(default_factory=list)


def prefill_cost(model: ModelSpec, gpu: GpuSpec, quantization: str) -> PrefillCost:
    """Prefill ms per uncached prompt token (the advisor's compute floor for one token) and
    per token squared (attention, 2 x layers x hidden FLOPs per token pair, causal)."""
    if model.hidden_size is None:
        raise ValueError(f"{model.name}: the attention term needs hidden_size")
    compute_s, _ = prefill_floors_s(model, gpu, weight_bytes(model, quantization), 1)
    attention_flops = 2 * model.layers * model.hidden_size
    return PrefillCost(compute_s * 1e3, attention_flops / gpu.peak_flops_per_s * 1e3)


def scorer_peak_flops(gpu_key: str, gpu: GpuSpec, dtype: str, peak_tflops: float | None) -> float:
    """The FLOP/s the scorer's matmuls can reach: given, the GPU's bf16 peak, or its FP32 one."""
    if peak_tflops is not None:
        return peak_tflops * TFLOPS
    if dtype == "bfloat16":
        return gpu.peak_flops_per_s
    if gpu_key.lower() not in FP32_TFLOPS:
        raise ValueError(
            f"no FP32 peak on record for GPU {gpu_key!r} ({', '.join(FP32_TFLOPS)} known); "
            "give --scorer-peak-tflops"
        )
    return FP32_TFLOPS[gpu_key.lower()] * TFLOPS


def scorer_window(
    scorer: ScorerSpec, gpu: GpuSpec, dtype: str, peak_flops_per_s: float
) -> ScorerWindow:
    """One forward over a padded window: 2 FLOPs per encoder parameter per position plus
    bidirectional attention (QK^T and AV, 4 x layers x hidden x window^2), and one read of the
    encoder's weights."""
    window = scorer.window_tokens
    flops = 2 * scorer.encoder_params * window + 4 * scorer.layers * scorer.hidden_size * window**2
    weights = scorer.encoder_params * SCORER_DTYPE_BYTES[dtype]
    return ScorerWindow(
        flops=flops,
        weight_bytes=weights,
        compute_ms=flops / peak_flops_per_s * 1e3,
        memory_ms=weights / gpu.memory_bandwidth_bytes_per_s * 1e3,
    )


def predict(inputs: Inputs) -> PredictedCosts:
    """The cost model for a generator and scorer on one GPU, from the presets' datasheet
    figures and the host's measured ones; ValueError naming an unknown preset or dtype."""
    model, gpu = model_preset(inputs.model), gpu_preset(inputs.gpu)
    if inputs.quantization not in WEIGHT_BYTES_PER_PARAM:
        raise ValueError(f"unknown quantization {inputs.quantization!r}")
    if inputs.scorer.lower() not in SCORERS:
        raise ValueError(f"unknown scorer {inputs.scorer!r}; presets: {', '.join(SCORERS)}")
    if inputs.scorer_dtype not in SCORER_DTYPE_BYTES:
        raise ValueError(f"unknown scorer dtype {inputs.scorer_dtype!r}")
    scorer = SCORERS[inputs.scorer.lower()]
    peak = scorer_peak_flops(inputs.gpu, gpu, inputs.scorer_dtype, inputs.scorer_peak_tflops)
    window = scorer_window(scorer, gpu, inputs.scorer_dtype, peak)
    host = inputs.host
    cost_model = CompressionCostModel(
        prefill=prefill_cost(model, gpu, inputs.quantization),
        sentences=CompressorCost(host.sentences_ms_per_token),
        llmlingua=CompressorCost(
            ms_per_token=host.llmlingua_ms_per_token,
            ms_per_chunk=window.floor_ms + host.llmlingua_ms_per_call,
        ),
    )
    return PredictedCosts(inputs, model, gpu, scorer, peak, window, cost_model)


def verdict(cost_model: CompressionCostModel, rate: float) -> Verdict:
    """Break-evens at `rate` (the linear prefill term alone, so conservative): sentence
    selection pays when the rate is below 1 - its ms per token / prefill ms per token;
    LLMLingua-2 pays on chunks of at least per-chunk ms / (prefill ms per token x (1 - rate) -
    its ms per token) tokens. `always` only when both pay at every chunk size, else `auto`."""
    if not 0 < rate <= 1:
        raise ValueError(f"rate must be in (0, 1], got {rate}")
    prefill = cost_model.prefill.ms_per_token
    sentences_rate = 1 - cost_model.sentences.ms_per_token / prefill if prefill > 0 else 0.0
    margin = prefill * (1 - rate) - cost_model.llmlingua.ms_per_token
    chunk_tokens = cost_model.llmlingua.ms_per_chunk / margin if margin > 0 else math.inf
    reasons = []
    if rate >= sentences_rate:
        reasons.append(f"sentence selection costs more than it saves at rate {rate:g}")
    if chunk_tokens > 1:
        reasons.append(
            f"LLMLingua-2 costs more than it saves on chunks under {chunk_tokens:.0f} tokens"
        )
    return Verdict(rate, sentences_rate, chunk_tokens, "auto" if reasons else "always", reasons)


def render_yaml(predicted: PredictedCosts) -> str:
    """`policy` and `cost_model` as YAML; the command, the arithmetic and the verdict in
    comments."""
    inputs, m, g, s, w = (
        predicted.inputs,
        predicted.model,
        predicted.gpu,
        predicted.scorer,
        predicted.window,
    )
    h = inputs.host
    block = predicted.overrides()
    judged = predicted.verdict()
    chunks = judged.llmlingua_pays_from_chunk_tokens
    first, second = inputs.command()
    pays_from = "no chunk size" if math.isinf(chunks) else f"{chunks:.0f} tokens per chunk"
    below = judged.sentences_pays_below_rate
    sentences_pays = f"below rate {below:.2f}" if below > 0 else "at no rate"
    lines = [
        "# Predicted, not measured (datasheet floors for the GPU, host figures from a CPU):",
        f"#   {first} \\",
        f"#       {second}",
        f"# prefill: 2 x {m.matmul_params / 1e9:.2f}e9 multiplied params / "
        f"{g.peak_flops_per_s / TFLOPS:g} TFLOP/s "
        f"= {block['prefill_ms_per_token']:g} ms per uncached token",
        f"#   ({m.name}, {inputs.quantization}, {g.name}), plus attention's "
        f"2 x {m.layers} layers x {m.hidden_size} x n^2 FLOPs.",
        f"# LLMLingua-2 ({s.name}, {inputs.scorer_dtype}): one {s.window_tokens}-token window "
        "per chunk, the larger of",
        f"#   {w.flops / 1e9:.0f} GFLOP / {predicted.scorer_peak_flops_per_s / TFLOPS:g} TFLOP/s "
        f"= {w.compute_ms:.2f} ms and {w.weight_bytes / GB:.2f} GB / "
        f"{g.memory_bandwidth_bytes_per_s / GB:g} GB/s = {w.memory_ms:.2f} ms,",
        f"#   + {h.llmlingua_ms_per_call:g} ms host per call and {h.llmlingua_ms_per_token:g} ms "
        "host per token.",
        f"# Sentence selection: {h.sentences_ms_per_token:g} ms per token (host).",
        f"# At rate {inputs.rate:g} sentence selection pays {sentences_pays} and LLMLingua-2 "
        f"from {pays_from}:",
        f"#   policy {judged.policy}.",
    ]
    body = yaml.safe_dump(
        {"policy": judged.policy, "cost_model": block}, default_flow_style=None, sort_keys=False
    )
    return "\n".join(lines) + "\n" + body


# --- the host's share, measured with the stand-in scorer ------------------------------------


@dataclass(frozen=True)
class HostMeasurement:
    """LLMLingua-2's host work per call, forward pass excluded, fitted over chunk lengths."""

    ms_per_call: float
    ms_per_token: float
    forward_ms: float
    repeats: int
    rows: list[tuple[int, float]]  # (tiktoken tokens, median host ms)


def fit_host(rows: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """Least squares of host ms on (1, tokens): (ms per call, ms per token), clamped at 0."""
    if len(rows) < 2:
        raise ValueError(f"at least 2 lengths are needed to fit, got {len(rows)}")
    tokens = np.array([r[0] for r in rows], dtype=float)
    ms = np.array([r[1] for r in rows], dtype=float)
    design = np.stack([np.ones_like(tokens), tokens], axis=1)
    (per_call, per_token), *_ = np.linalg.lstsq(design, ms, rcond=None)
    return max(0.0, float(per_call)), max(0.0, float(per_token))


def measure_host(
    tiktoken_cache_dir: Path,
    words: Sequence[str],
    token_lengths: Sequence[int],
    repeats: int,
    question: str = "What does the prefix cache hold?",
) -> HostMeasurement:
    """Time LLMLingua-2 with the stand-in scorer (one torch thread, the compressor's default)
    on prefixes of `words` of about each of `token_lengths` cl100k tokens, less the stand-in's
    own forward over the same padded window."""
    import torch

    from prepare.llmlingua_compressor import LLMLinguaCompressor, LLMLinguaOptions
    from scripts.llmlingua2_standin import STANDIN_DIRNAME, build_standin

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        path = build_standin(Path(folder) / STANDIN_DIRNAME)
        compressor = LLMLinguaCompressor.load(
            str(path),
            LLMLinguaOptions(use_llmlingua2=True),
            tiktoken_cache_dir=str(tiktoken_cache_dir),
        )
    prompt_compressor: Any = compressor._compressor  # the scorer, to time its forward alone
    window = torch.full((1, prompt_compressor.max_seq_len), 5, dtype=torch.long)
    with torch.no_grad():
        forward_ms = _median_ms(
            lambda: prompt_compressor.model(input_ids=window, attention_mask=window > 0), repeats
        )
    texts = [
        _prefix_of(words, length, prompt_compressor.get_token_length) for length in token_lengths
    ]
    compressor.compress_chunk(question, texts[0], 0.5)  # the first call warms caches up
    rows = []
    for text in texts:
        total_ms = _median_ms(
            lambda text=text: compressor.compress_chunk(question, text, 0.5), repeats
        )
        rows.append((int(prompt_compressor.get_token_length(text)), total_ms - forward_ms))
    per_call, per_token = fit_host(rows)
    return HostMeasurement(per_call, per_token, forward_ms, repeats, rows)


def corpus_words(corpus: Path) -> list[str]:
    """The words of every file in `corpus`, in name order."""
    return " ".join(p.read_text() for p in sorted(corpus.glob("*")) if p.is_file()).split()


def _prefix_of(words: Sequence[str], tokens: int, count: Callable[[str], int]) -> str:
    """The shortest prefix of `words` (in steps of 5) that counts at least `tokens`."""
    end = 5
    while end < len(words) and count(" ".join(words[:end])) < tokens:
        end += 5
    return " ".join(words[:end])


def _median_ms(call: Any, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def _significant(value: float, digits: int = 5) -> float:
    return float(f"{value:.{digits}g}")


# --- CLI ---------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3-8b", help=f"preset: {', '.join(MODELS)}")
    parser.add_argument("--gpu", default="l4", help=f"preset: {', '.join(GPUS)}")
    parser.add_argument(
        "--quantization", default="awq", choices=list(WEIGHT_BYTES_PER_PARAM), help="generator"
    )
    parser.add_argument(
        "--scorer", default="xlm-roberta-large", help=f"preset: {', '.join(SCORERS)}"
    )
    parser.add_argument("--scorer-dtype", default="float32", choices=list(SCORER_DTYPE_BYTES))
    parser.add_argument(
        "--scorer-peak-tflops", type=float, help="the scorer's matmul peak, if not on record"
    )
    parser.add_argument(
        "--rate", type=float, default=0.5, help="the profile's compression rate (the verdict)"
    )
    parser.add_argument("--host-ms-per-call", type=float, default=HOST_MS_PER_CALL)
    parser.add_argument("--host-ms-per-token", type=float, default=HOST_MS_PER_TOKEN)
    parser.add_argument("--sentences-ms-per-token", type=float, default=SENTENCES_MS_PER_TOKEN)
    parser.add_argument(
        "--measure-host",
        action="store_true",
        help="measure the host figures with the stand-in scorer instead (needs make models)",
    )
    parser.add_argument("--repeats", type=int, default=20, help="--measure-host: calls per length")
    parser.add_argument("--tiktoken-cache", type=Path, default=ROOT / ".cache" / "tiktoken")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Print the predicted block (or, with --measure-host, the host figures); 0 on success."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.measure_host:
        measured = measure_host(
            args.tiktoken_cache,
            corpus_words(ROOT / "data" / "corpus"),
            HOST_TOKEN_LENGTHS,
            args.repeats,
        )
        print(f"stand-in forward over one 512-token window: {measured.forward_ms:.2f} ms")
        for tokens, ms in measured.rows:
            print(f"  {tokens:5d} tokens: {ms:7.2f} ms host (median of {measured.repeats})")
        print(f"--host-ms-per-call {measured.ms_per_call:.1f} --host-ms-per-token "
              f"{measured.ms_per_token:.4f}")  # fmt: skip
        return 0
    inputs = Inputs(
        model=args.model,
        gpu=args.gpu,
        quantization=args.quantization,
        scorer=args.scorer,
        scorer_dtype=args.scorer_dtype,
        scorer_peak_tflops=args.scorer_peak_tflops,
        rate=args.rate,
        host=HostCosts(args.host_ms_per_call, args.host_ms_per_token, args.sentences_ms_per_token),
    )
    try:
        text = render_yaml(predict(inputs))
    except ValueError as error:
        parser.error(str(error))
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
