"""The compression algorithms, chunk by chunk, so every kept chunk keeps its source id:
sentence selection by embedding similarity, and a token-level compressor (LLMLingua) applied
to each chunk at one rate. `prepare.methods` names their combinations as methods.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from prepare.budget import TokenCounter
from prepare.context import ContextChunk


class ChunkCompressor(Protocol):
    """A token-level compressor such as LLMLingua, applied to one chunk's text."""

    def compress_chunk(self, question: str, text: str, rate: float) -> str: ...


def count_context_tokens(chunks: Sequence[ContextChunk], count_tokens: TokenCounter) -> int:
    """Tokens of the chunks' texts (the part compression acts on)."""
    return sum(count_tokens(chunk.text) for chunk in chunks)


def select_sentences(
    question_embedding: np.ndarray,
    chunks: Sequence[ContextChunk],
    count_tokens: TokenCounter,
    target_tokens: int,
) -> list[ContextChunk]:
    """Keep the sentences closest to the question until `target_tokens` is reached.

    Sentences are scored by cosine similarity (unit vectors, so a dot product), added best
    first while they fit, and put back in their original order inside their own chunk.
    Chunks left with no sentence are dropped. The single best sentence is always kept.
    """
    candidates: list[tuple[float, int, int]] = []
    for chunk_index, chunk in enumerate(chunks):
        if chunk.sentence_embeddings is None or len(chunk.sentences) == 0:
            raise ValueError(f"chunk {chunk.chunk_id} has no sentence embeddings")
        scores = chunk.sentence_embeddings @ question_embedding
        candidates.extend((float(score), chunk_index, i) for i, score in enumerate(scores.tolist()))
    candidates.sort(key=lambda item: -item[0])
    kept: set[tuple[int, int]] = set()
    used = 0
    for _, chunk_index, sentence_index in candidates:
        cost = count_tokens(chunks[chunk_index].sentences[sentence_index])
        if used + cost <= target_tokens or not kept:
            kept.add((chunk_index, sentence_index))
            used += cost
    return [
        chunk.with_text(" ".join(sentences), sentences)
        for chunk_index, chunk in enumerate(chunks)
        if (
            sentences := tuple(s for i, s in enumerate(chunk.sentences) if (chunk_index, i) in kept)
        )
    ]


def compress_each(
    chunks: Sequence[ContextChunk],
    question: str,
    count_tokens: TokenCounter,
    target_tokens: int,
    chunk_compressor: ChunkCompressor,
) -> list[ContextChunk]:
    """Run the token-level compressor on each chunk at one rate, so the context comes to
    `target_tokens`; a chunk it empties is dropped, and a context already small enough is
    returned as is."""
    tokens_now = count_context_tokens(chunks, count_tokens)
    if tokens_now <= target_tokens:
        return list(chunks)
    rate = target_tokens / tokens_now
    compressed = []
    for chunk in chunks:
        text = chunk_compressor.compress_chunk(question, chunk.text, rate).strip()
        if text:
            compressed.append(chunk.with_text(text))
    return compressed
