"""How cheap can LLMLingua be? Time the compressor's knobs one at a time, in one process.

    python -m bench.llmlingua_speed --lengths 512 1024 2048 --repeats 2 \\
        --out bench-results/llmlingua-speed

Contexts are the first chunks of an index (default: indexes/default) up to each length in
serving-tokenizer tokens, compressed chunk by chunk to rate 0.5 exactly as the compressor
stage does (prepare.compression). Each variant changes one knob against the previous
shipped setting, so every gain is measured side by side on the same contexts:

- `condition-compare` (the setting shipped before this bench): two scorer passes per
  200-token segment.
- `one-pass`: condition_compare off, one pass conditioned on the question.
- `one-pass, segment 512`: a longer segment.
- `one-pass, chunk-sized segment` (the shipped default): the segment sized to each chunk.
  LLMLingua 0.2.2 leaves most of a context shorter than its segment uncompressed, so at
  200 or 512 the `kept` column shows ~75-85% at rate 0.5; sized to the chunk the rate holds.
  (Segments shorter than the chunk crash under transformers 5.)
- `one-pass, chunk-sized, 2 threads`: two torch threads (this machine has two cores).
- `one-pass, chunk-sized, bfloat16`: bf16 scorer weights (only at the shortest length: CPUs
  without AVX512-BF16/AMX emulate it).

Writes OUT/llmlingua-speed.json and .md (milliseconds per call and per context token).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.stats import percentile
from harness.service import ROOT
from pipeline.messages import CompressionPlan
from prepare.budget import TokenCounter
from prepare.compression import ChunkCompressor, count_context_tokens
from prepare.context import ContextChunk
from prepare.llmlingua_compressor import LLMLinguaCompressor, LLMLinguaOptions, ScorerDType
from prepare.methods import compress_chunks
from prepare.tokens import ServingTokenizer
from retrieval.index import FaissIndex

QUESTION = "Which technique lowers time to first token, and what does it cost?"
LLMLINGUA_HALF = CompressionPlan("llmlingua", rate=0.5)
NO_EMBEDDING = np.zeros(1, dtype=np.float32)  # LLMLingua does not use the question's embedding


@dataclass(frozen=True)
class SpeedVariant:
    name: str
    options: LLMLinguaOptions
    threads: int = 1
    dtype: ScorerDType = "float32"
    shortest_only: bool = False


VARIANTS: tuple[SpeedVariant, ...] = (
    SpeedVariant("condition-compare", LLMLinguaOptions(condition_compare=True, iterative_size=200)),
    SpeedVariant("one-pass", LLMLinguaOptions(condition_compare=False, iterative_size=200)),
    SpeedVariant(
        "one-pass, segment 512", LLMLinguaOptions(condition_compare=False, iterative_size=512)
    ),
    SpeedVariant("one-pass, chunk-sized segment", LLMLinguaOptions(condition_compare=False)),
    SpeedVariant(
        "one-pass, chunk-sized, 2 threads", LLMLinguaOptions(condition_compare=False), threads=2
    ),
    SpeedVariant(
        "one-pass, chunk-sized, bfloat16",
        LLMLinguaOptions(condition_compare=False),
        dtype="bfloat16",
        shortest_only=True,
    ),
)


@dataclass
class SpeedResult:
    variant: str
    context_tokens: int
    kept_tokens: int
    chunks: int
    times_ms: list[float] = field(default_factory=list)

    @property
    def median_ms(self) -> float:
        return percentile(self.times_ms, 50)

    @property
    def ms_per_token(self) -> float:
        return self.median_ms / self.context_tokens


def contexts_of_length(
    chunks: Sequence[ContextChunk], length: int, count: Any
) -> list[ContextChunk]:
    """The first chunks whose texts add up to at least `length` tokens (all when too few)."""
    taken: list[ContextChunk] = []
    total = 0
    for chunk in chunks:
        if total >= length:
            break
        taken.append(chunk)
        total += count(chunk.text)
    return taken


def load_chunks(index_dir: Path) -> list[ContextChunk]:
    index = FaissIndex.load(index_dir)
    return [
        ContextChunk(item.chunk.chunk_id, item.chunk.doc_id, item.chunk.title, item.chunk.text, 0)
        for item in index.chunks
    ]


def timed_compression(
    compressor: ChunkCompressor, question: str, chunks: Sequence[ContextChunk], count: TokenCounter
) -> tuple[float, list[ContextChunk]]:
    """One compression of `chunks` to rate 0.5, as the compressor stage does it: the
    milliseconds it took and the chunks it kept."""
    started = time.perf_counter()
    kept = compress_chunks(LLMLINGUA_HALF, question, NO_EMBEDDING, chunks, count, compressor)
    return (time.perf_counter() - started) * 1000, kept


def time_variant(
    variant: SpeedVariant,
    compressor: LLMLinguaCompressor,
    contexts: dict[int, list[ContextChunk]],
    tokenizer: ServingTokenizer,
    repeats: int,
) -> list[SpeedResult]:
    import torch

    torch.set_num_threads(variant.threads)
    results = []
    lengths = sorted(contexts)[:1] if variant.shortest_only else sorted(contexts)
    for length in lengths:
        chunks = contexts[length]
        result = SpeedResult(
            variant.name, count_context_tokens(chunks, tokenizer.count), 0, len(chunks)
        )
        for _ in range(repeats):
            ms, kept = timed_compression(compressor, QUESTION, chunks, tokenizer.count)
            result.times_ms.append(ms)
        result.kept_tokens = count_context_tokens(kept, tokenizer.count)
        print(
            f"{variant.name:24s} {result.context_tokens:5d} tok -> {result.kept_tokens:5d}: "
            f"{result.median_ms:8.0f} ms ({result.ms_per_token:.2f} ms/token)",
            flush=True,
        )
        results.append(result)
    return results


def render_markdown(results: Sequence[SpeedResult]) -> str:
    baseline = {r.context_tokens: r.median_ms for r in results if r.variant == VARIANTS[0].name}
    lines = [
        "| variant | context tokens | kept | chunks | median ms | ms/token | speed-up |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        base = baseline.get(r.context_tokens)
        speedup = f"{base / r.median_ms:.2f}x" if base else "–"
        lines.append(
            f"| {r.variant} | {r.context_tokens:,} | {r.kept_tokens:,} | {r.chunks} | "
            f"{r.median_ms:,.0f} | {r.ms_per_token:.2f} | {speedup} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index", type=Path, default=ROOT / "indexes/default")
    parser.add_argument("--scorer", default=str(ROOT / ".models/smollm2-135m-instruct"))
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--variants", nargs="*", help="names to run (default: all)")
    parser.add_argument("--out", type=Path, default=Path("bench-results/llmlingua-speed"))
    args = parser.parse_args(argv)

    tokenizer = ServingTokenizer.load(args.scorer)
    chunks = load_chunks(args.index)
    contexts = {n: contexts_of_length(chunks, n, tokenizer.count) for n in args.lengths}
    results: list[SpeedResult] = []
    loaded: dict[ScorerDType, LLMLinguaCompressor] = {}
    for variant in VARIANTS:
        if args.variants and variant.name not in args.variants:
            continue
        if variant.dtype not in loaded:
            loaded[variant.dtype] = LLMLinguaCompressor.load(
                args.scorer,
                dtype=variant.dtype,
                tiktoken_cache_dir=str(ROOT / ".cache/tiktoken"),
            )
        compressor = loaded[variant.dtype].with_options(variant.options)
        compressor.compress_chunk(QUESTION, chunks[0].text, 0.5)  # warm-up
        results.extend(time_variant(variant, compressor, contexts, tokenizer, args.repeats))

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "llmlingua-speed.json").write_text(
        json.dumps(
            [
                asdict(r) | {"median_ms": r.median_ms, "ms_per_token": r.ms_per_token}
                for r in results
            ],
            indent=2,
        )
    )
    table = render_markdown(results)
    (args.out / "llmlingua-speed.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
