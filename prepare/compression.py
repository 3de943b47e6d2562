"""Compress the retrieved context, chunk by chunk, so every kept chunk keeps its source id.

Methods:
- `none`: the context as retrieved.
- `sentences`: keep the sentences most similar to the question (embeddings computed once at
  index time, so a query costs dot products), greedily up to the token target, in their
  original order.
- `llmlingua`: LLMLingua's PromptCompressor (LongLLMLingua question-aware, or LLMLingua-2)
  on each chunk.
- `sentences+llmlingua`: sentence selection first, then LLMLingua on what it kept.
Only the context is compressed, never the system prompt or the question.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from pipeline.messages import CompressionPlan
from prepare.budget import TokenCounter
from prepare.context import ContextChunk


class ChunkCompressor(Protocol):
    """A token-level compressor such as LLMLingua, applied to one chunk's text."""

    def compress_chunk(self, question: str, text: str, rate: float) -> str: ...


def count_context_tokens(chunks: Sequence[ContextChunk], count_tokens: TokenCounter) -> int:
    """Tokens of the chunks' texts (the part compression acts on)."""
    return sum(count_tokens(chunk.text) for chunk in chunks)


def compress_chunks(
    plan: CompressionPlan,
    question: str,
    question_embedding: np.ndarray,
    chunks: Sequence[ContextChunk],
    count_tokens: TokenCounter,
    chunk_compressor: ChunkCompressor | None = None,
    sentence_prefilter_rate: float = 0.5,
) -> list[ContextChunk]:
    """Apply `plan` to `chunks`; raise ValueError when the method needs a missing compressor."""
    if plan.method == "none" or not chunks:
        return list(chunks)
    tokens_before = count_context_tokens(chunks, count_tokens)
    target = plan.target_for(tokens_before)
    if plan.method == "sentences":
        return select_sentences(question_embedding, chunks, count_tokens, target)
    if chunk_compressor is None:
        raise ValueError(f"compression method {plan.method!r} needs LLMLingua, which is not loaded")
    if plan.method == "sentences+llmlingua":
        prefilter_target = max(target, math.ceil(sentence_prefilter_rate * tokens_before))
        chunks = select_sentences(question_embedding, chunks, count_tokens, prefilter_target)
    return _compress_each(chunks, question, count_tokens, target, chunk_compressor)


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


def _compress_each(
    chunks: Sequence[ContextChunk],
    question: str,
    count_tokens: TokenCounter,
    target_tokens: int,
    chunk_compressor: ChunkCompressor,
) -> list[ContextChunk]:
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
