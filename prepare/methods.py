"""The registry of compression methods: one entry a method, saying what it needs, what it
costs and how it applies.

A method is a `CompressionMethodSpec`: its `apply` turns the retrieved chunks into the
chunks sent (every kept chunk keeps its source id), its `cost_ms` is its own predicted time
under the `auto` policy's cost model, and `needs_*` say what must be loaded for it to run.
Everything else reads this registry: the request schema and the config accept its names,
the playground lists them (through the OpenAPI document), the compressor refuses or degrades
a method by its needs. A new method is one module with its `apply` and one `register` call.

Only the context is compressed, never the system prompt or the question.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.messages import CompressionDecision, CompressionPlan
from prepare.budget import TokenCounter
from prepare.compression import (
    ChunkCompressor,
    compress_each,
    count_context_tokens,
    select_sentences,
)
from prepare.context import ContextChunk
from prepare.cost_model import CompressionCostModel

# The identity: the context as retrieved. Every plan can fall back to it.
NO_COMPRESSION = "none"


@dataclass(frozen=True)
class ContextSize:
    """What a method's cost depends on: the context's tokens and chunks, the tokens to keep."""

    tokens_before: int
    tokens_after: int
    chunks: int
    # What sentence selection keeps before a token-level compressor runs on the rest.
    sentence_prefilter_rate: float = 0.5

    @property
    def prefilter_tokens(self) -> int:
        return max(self.tokens_after, math.ceil(self.sentence_prefilter_rate * self.tokens_before))


@dataclass(frozen=True)
class CompressionInput:
    """What a method's `apply` receives for one request."""

    question: str
    question_embedding: np.ndarray
    chunks: Sequence[ContextChunk]
    count_tokens: TokenCounter
    size: ContextSize
    chunk_compressor: ChunkCompressor | None = None


@dataclass(frozen=True)
class CompressionMethodSpec:
    name: str
    description: str
    apply: Callable[[CompressionInput], list[ContextChunk]]
    # Predicted own time (ms) under a fitted cost model, for the `auto` policy.
    cost_ms: Callable[[CompressionCostModel, ContextSize], float]
    # Needs each chunk's sentences and their embeddings (the index's sentence store).
    needs_sentence_embeddings: bool = False
    # Needs the loaded token-level compressor (LLMLingua).
    needs_chunk_compressor: bool = False


_REGISTRY: dict[str, CompressionMethodSpec] = {}


def register(method: CompressionMethodSpec) -> CompressionMethodSpec:
    """Add `method` to the registry; a name is registered once."""
    if method.name in _REGISTRY:
        raise ValueError(f"compression method {method.name!r} is already registered")
    _REGISTRY[method.name] = method
    return method


def unregister(name: str) -> None:
    """Remove a method (tests that register their own)."""
    if name == NO_COMPRESSION:
        raise ValueError("the identity method cannot be removed")
    _REGISTRY.pop(name, None)


def method_names() -> tuple[str, ...]:
    """Every registered method's name, in registration order."""
    return tuple(_REGISTRY)


def get_method(name: str) -> CompressionMethodSpec:
    """The method called `name`; ValueError naming the known ones when there is none."""
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(_REGISTRY)
        raise ValueError(f"unknown compression method {name!r} (known: {known})") from None


def known_method(name: str) -> str:
    """`name` if it is registered (a pydantic validator for config and request fields)."""
    get_method(name)
    return name


def compress_chunks(
    plan: CompressionPlan,
    question: str,
    question_embedding: np.ndarray,
    chunks: Sequence[ContextChunk],
    count_tokens: TokenCounter,
    chunk_compressor: ChunkCompressor | None = None,
    sentence_prefilter_rate: float = 0.5,
) -> list[ContextChunk]:
    """Apply `plan`'s method to `chunks`; ValueError when it needs a missing compressor."""
    method = get_method(plan.method)
    if method.name == NO_COMPRESSION or not chunks:
        return list(chunks)
    if method.needs_chunk_compressor and chunk_compressor is None:
        raise ValueError(f"compression method {plan.method!r} needs LLMLingua, which is not loaded")
    tokens_before = count_context_tokens(chunks, count_tokens)
    size = ContextSize(
        tokens_before, plan.target_for(tokens_before), len(chunks), sentence_prefilter_rate
    )
    return method.apply(
        CompressionInput(question, question_embedding, chunks, count_tokens, size, chunk_compressor)
    )


def decide(
    cost_model: CompressionCostModel, method_name: str, size: ContextSize, other_uncached: int
) -> CompressionDecision:
    """The `auto` policy: compress only when the predicted prefill saving exceeds the
    method's own predicted cost. `other_uncached` is the prompt's uncached tokens outside the
    context (question, history, chat template)."""
    method = get_method(method_name)
    cost = method.cost_ms(cost_model, size)
    saving = cost_model.saving_ms(other_uncached, size.tokens_before, size.tokens_after)
    return CompressionDecision(
        compress=method.name != NO_COMPRESSION and saving > cost,
        predicted_saving_ms=round(saving, 1),
        predicted_cost_ms=round(cost, 1),
    )


def _as_retrieved(given: CompressionInput) -> list[ContextChunk]:
    return list(given.chunks)


def _sentences(given: CompressionInput) -> list[ContextChunk]:
    return select_sentences(
        given.question_embedding, given.chunks, given.count_tokens, given.size.tokens_after
    )


def _llmlingua(given: CompressionInput) -> list[ContextChunk]:
    assert given.chunk_compressor is not None  # compress_chunks checks the method's needs
    return compress_each(
        given.chunks,
        given.question,
        given.count_tokens,
        given.size.tokens_after,
        given.chunk_compressor,
    )


def _sentences_then_llmlingua(given: CompressionInput) -> list[ContextChunk]:
    assert given.chunk_compressor is not None
    selected = select_sentences(
        given.question_embedding, given.chunks, given.count_tokens, given.size.prefilter_tokens
    )
    return compress_each(
        selected,
        given.question,
        given.count_tokens,
        given.size.tokens_after,
        given.chunk_compressor,
    )


register(
    CompressionMethodSpec(
        NO_COMPRESSION,
        "The context as retrieved.",
        apply=_as_retrieved,
        cost_ms=lambda model, size: 0.0,
    )
)
register(
    CompressionMethodSpec(
        "sentences",
        "Keep the sentences most similar to the question (embeddings computed at index "
        "time, so a query costs dot products), best first up to the token target, in their "
        "original order.",
        apply=_sentences,
        cost_ms=lambda model, size: model.sentences.predict_ms(size.tokens_before, size.chunks),
        needs_sentence_embeddings=True,
    )
)
register(
    CompressionMethodSpec(
        "llmlingua",
        "LLMLingua's PromptCompressor (question-aware LongLLMLingua, or LLMLingua-2) on "
        "each chunk.",
        apply=_llmlingua,
        cost_ms=lambda model, size: model.llmlingua.predict_ms(size.tokens_before, size.chunks),
        needs_chunk_compressor=True,
    )
)
register(
    CompressionMethodSpec(
        "sentences+llmlingua",
        "Sentence selection first, then LLMLingua on what it kept.",
        apply=_sentences_then_llmlingua,
        cost_ms=lambda model, size: (
            model.sentences.predict_ms(size.tokens_before, size.chunks)
            + model.llmlingua.predict_ms(size.prefilter_tokens, size.chunks)
        ),
        needs_sentence_embeddings=True,
        needs_chunk_compressor=True,
    )
)
