"""LLMLingua's shipped setting against the one before it, paired on real retrieved contexts.

    python -m bench.llmlingua_paired --n 40 --out bench-results/llmlingua-paired

bench.llmlingua_speed times each knob on one context per length; this asks how much cheaper
the shipped setting is on the contexts the service actually compresses: `n` SQuAD dev
questions drawn with a fixed seed (the quality headline's sample), each with its top-k
chunks from indexes/squad-dev, compressed to rate 0.5 by both variants in a per-question
random order (so drift hits both sides alike). The speed-up is the median of the
per-question ratios old / new with a paired bootstrap 95% interval.

Needs `python -m bench.quality prepare`. Writes OUT/llmlingua-paired.json and .md.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from bench.intervals import fmt_ratio, paired_ratio
from bench.llmlingua_speed import VARIANTS, SpeedVariant, timed_compression
from bench.squad import DEFAULT_CACHE_DIR, SQUAD_DEV_FILENAME, load_squad, sample_questions
from harness.service import ROOT
from prepare.budget import TokenCounter
from prepare.compression import ChunkCompressor, count_context_tokens
from prepare.context import ContextChunk
from prepare.llmlingua_compressor import LLMLinguaCompressor
from prepare.tokens import ServingTokenizer

OLD, NEW = "condition-compare", "one-pass, chunk-sized segment"


@dataclass(frozen=True)
class PairedTiming:
    question: str
    context_tokens: int
    chunks: int
    order: list[str]
    ms: dict[str, float]
    kept_tokens: dict[str, int]


def variant(name: str) -> SpeedVariant:
    [found] = [v for v in VARIANTS if v.name == name]
    return found


def squad_contexts(
    n: int, seed: int, top_k: int, index: Path
) -> list[tuple[str, list[ContextChunk]]]:
    """The first `n` questions of the seeded SQuAD dev sample with their top-k chunks."""
    from retrieval.models import DEFAULT_EMBEDDING_MODEL, resolve_model_reference
    from retrieval.retriever import Retriever

    squad = load_squad(DEFAULT_CACHE_DIR / SQUAD_DEV_FILENAME)
    retriever = Retriever.load(index, resolve_model_reference(DEFAULT_EMBEDDING_MODEL))
    contexts = []
    for q in sample_questions(squad, n, seed):
        hits = retriever.retrieve(q.question, top_k).chunks
        chunks = [ContextChunk(h.chunk_id, h.doc_id, h.title, h.text, h.score) for h in hits]
        contexts.append((q.question, chunks))
    return contexts


def time_pairs(
    contexts: Sequence[tuple[str, list[ContextChunk]]],
    compressors: Mapping[str, ChunkCompressor],
    count: TokenCounter,
    seed: int,
) -> list[PairedTiming]:
    """Each context compressed by every compressor, in a seeded random order per context."""
    rng = random.Random(seed)
    timings = []
    for question, chunks in contexts:
        order = list(compressors)
        rng.shuffle(order)
        ms: dict[str, float] = {}
        kept: dict[str, int] = {}
        for name in order:
            ms[name], out = timed_compression(compressors[name], question, chunks, count)
            kept[name] = count_context_tokens(out, count)
        timing = PairedTiming(
            question, count_context_tokens(chunks, count), len(chunks), order, ms, kept
        )
        print(
            f"{timing.context_tokens:5d} tok, {OLD}: {ms[OLD]:7.0f} ms, {NEW}: {ms[NEW]:7.0f} ms "
            f"({ms[OLD] / ms[NEW]:.2f}x)",
            flush=True,
        )
        timings.append(timing)
    return timings


def render_markdown(timings: Sequence[PairedTiming]) -> str:
    speedup = paired_ratio((t.ms[OLD], t.ms[NEW]) for t in timings)
    kept = {name: sum(t.kept_tokens[name] for t in timings) for name in (OLD, NEW)}
    total = sum(t.context_tokens for t in timings)
    per_token = {
        name: float(np.median([t.ms[name] / t.context_tokens for t in timings]))
        for name in (OLD, NEW)
    }
    n = len(timings)
    return (
        f"n = {n} questions, context {min(t.context_tokens for t in timings)}–"
        f"{max(t.context_tokens for t in timings)} tokens (median "
        f"{int(np.median([t.context_tokens for t in timings]))}), each compressed by both\n\n"
        "| variant | median ms per context token | kept of the context |\n|---|---|---|\n"
        + "".join(
            f"| {name} | {per_token[name]:.2f} | {kept[name] / total:.0%} |\n"
            for name in (OLD, NEW)
        )
        + f"\nSpeed-up {OLD} / {NEW}, median per question: {fmt_ratio(speedup, n)}\n"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--top-k", type=int, default=5)
    parser.add_argument("--index", type=Path, default=ROOT / "indexes/squad-dev")
    parser.add_argument("--scorer", default=str(ROOT / ".models/smollm2-135m-instruct"))
    parser.add_argument("--out", type=Path, default=Path("bench-results/llmlingua-paired"))
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(1)  # both variants as bench.llmlingua_speed times them
    tokenizer = ServingTokenizer.load(args.scorer)
    contexts = squad_contexts(args.n, args.seed, args.top_k, args.index)
    loaded = LLMLinguaCompressor.load(args.scorer, tiktoken_cache_dir=str(ROOT / ".cache/tiktoken"))
    compressors = {name: loaded.with_options(variant(name).options) for name in (OLD, NEW)}
    for compressor in compressors.values():
        compressor.compress_chunk(contexts[0][0], contexts[0][1][0].text, 0.5)  # warm-up
    timings = time_pairs(contexts, compressors, tokenizer.count, args.seed)

    args.out.mkdir(parents=True, exist_ok=True)
    doc = {"config": vars(args) | {"index": str(args.index), "out": str(args.out)},
           "timings": [asdict(t) for t in timings]}  # fmt: skip
    (args.out / "llmlingua-paired.json").write_text(json.dumps(doc, indent=2) + "\n")
    table = render_markdown(timings)
    (args.out / "llmlingua-paired.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
