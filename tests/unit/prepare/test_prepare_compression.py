"""prepare.compression and the methods of prepare.methods that combine it: plans, sentence
selection, and the LLMLingua hook per chunk."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.messages import CompressionPlan
from prepare.compression import count_context_tokens, select_sentences
from prepare.context import ContextChunk
from prepare.methods import compress_chunks, method_names

QUESTION = np.array([1.0, 0.0, 0.0, 0.0], dtype=np.float32)


def words(text: str) -> int:
    return len(text.split())


def embedding(similarity: float) -> list[float]:
    """A unit vector whose cosine with QUESTION is `similarity`."""
    return [similarity, math.sqrt(1 - similarity**2), 0.0, 0.0]


def chunk(chunk_id: str, scored: list[tuple[str, float]]) -> ContextChunk:
    sentences = tuple(s for s, _ in scored)
    return ContextChunk(
        chunk_id=chunk_id,
        doc_id=chunk_id.split("#")[0],
        title=chunk_id.upper(),
        text=" ".join(sentences),
        score=0.5,
        sentences=sentences,
        sentence_embeddings=np.array([embedding(s) for _, s in scored], dtype=np.float32),
    )


@pytest.fixture
def chunks() -> list[ContextChunk]:
    return [
        chunk("a#0", [("a0 a0 a0", 0.1), ("a1 a1", 0.5), ("a2 a2 a2 a2", 0.95)]),
        chunk("b#0", [("b0 b0", 0.8), ("b1", 0.2)]),
        chunk("c#0", [("c0 c0 c0", 0.05)]),
    ]


class RecordingCompressor:
    """Keeps the first half of the words; records every call."""

    def __init__(self, empty_for: str | None = None) -> None:
        self.calls: list[tuple[str, str, float]] = []
        self._empty_for = empty_for

    def compress_chunk(self, question: str, text: str, rate: float) -> str:
        self.calls.append((question, text, rate))
        if self._empty_for is not None and text.startswith(self._empty_for):
            return "   "
        kept = text.split()
        return " " + " ".join(kept[: max(1, len(kept) // 2)]) + " "


def test_the_registry_ships_the_four_documented_methods():
    assert method_names() == ("none", "sentences", "llmlingua", "sentences+llmlingua")


@pytest.mark.parametrize(
    ("plan", "before", "target"),
    [
        (CompressionPlan("sentences", rate=0.5), 101, 51),
        (CompressionPlan("sentences", rate=0.5), 100, 50),
        (CompressionPlan("sentences", rate=0.01), 10, 1),
        (CompressionPlan("sentences", rate=1.0), 80, 80),
        (CompressionPlan("sentences", rate=0.5), 0, 0),
        (CompressionPlan("sentences", rate=0.5, target_tokens=30), 100, 30),
        (CompressionPlan("sentences", rate=0.5, target_tokens=300), 100, 100),
    ],
)
def test_target_for_uses_rate_or_target_tokens_and_never_exceeds_the_input(plan, before, target):
    assert plan.target_for(before) == target


def test_select_sentences_keeps_the_most_similar_in_original_order(chunks):
    kept = select_sentences(QUESTION, chunks, words, target_tokens=8)

    # Best first: a2 (4) -> b0 (6) -> a1 (8); b1, a0 and c0 no longer fit.
    assert [c.chunk_id for c in kept] == ["a#0", "b#0"]
    assert kept[0].sentences == ("a1 a1", "a2 a2 a2 a2")  # a2 scored higher but comes later
    assert kept[0].text == "a1 a1 a2 a2 a2 a2"
    assert kept[1].sentences == ("b0 b0",)
    assert count_context_tokens(kept, words) <= 8
    assert all(c.sentence_embeddings is None for c in kept)
    assert [(c.doc_id, c.title, c.score) for c in kept] == [("a", "A#0", 0.5), ("b", "B#0", 0.5)]


def test_select_sentences_fills_leftover_room_with_smaller_sentences(chunks):
    kept = select_sentences(QUESTION, chunks, words, target_tokens=7)

    # a2 (4), b0 (6); a1 would make 8, but b1 (1 token) still fits.
    assert {c.chunk_id: c.sentences for c in kept} == {
        "a#0": ("a2 a2 a2 a2",),
        "b#0": ("b0 b0", "b1"),
    }


def test_select_sentences_always_keeps_the_best_sentence(chunks):
    kept = select_sentences(QUESTION, chunks, words, target_tokens=1)

    assert [(c.chunk_id, c.text) for c in kept] == [("a#0", "a2 a2 a2 a2")]


def test_select_sentences_needs_sentence_embeddings(chunks):
    stripped = chunks[0].with_text(chunks[0].text, chunks[0].sentences)

    with pytest.raises(ValueError, match="a#0 has no sentence embeddings"):
        select_sentences(QUESTION, [stripped], words, 5)


def test_method_none_returns_the_context_as_retrieved(chunks):
    assert (
        compress_chunks(CompressionPlan("none", rate=0.1), "q", QUESTION, chunks, words) == chunks
    )


def test_method_sentences_selects_up_to_the_plan_target(chunks):
    # 15 tokens before; rate 0.5 -> 8.
    kept = compress_chunks(CompressionPlan("sentences", rate=0.5), "q", QUESTION, chunks, words)

    assert {c.chunk_id: c.text for c in kept} == {"a#0": "a1 a1 a2 a2 a2 a2", "b#0": "b0 b0"}


@pytest.mark.parametrize("method", ["llmlingua", "sentences+llmlingua"])
def test_llmlingua_methods_without_a_compressor_raise(chunks, method):
    with pytest.raises(ValueError, match="needs LLMLingua"):
        compress_chunks(CompressionPlan(method), "q", QUESTION, chunks, words)


def test_llmlingua_is_called_once_per_chunk_with_the_overall_rate(chunks):
    compressor = RecordingCompressor()

    kept = compress_chunks(
        CompressionPlan("llmlingua", rate=0.5), "Which?", QUESTION, chunks, words, compressor
    )

    assert [(q, t) for q, t, _ in compressor.calls] == [("Which?", c.text) for c in chunks]
    rates = {rate for _, _, rate in compressor.calls}
    assert rates == {8 / 15}
    assert [c.chunk_id for c in kept] == ["a#0", "b#0", "c#0"]
    assert [c.text for c in kept] == ["a0 a0 a0 a1", "b0", "c0"]
    assert all(c.sentences == () and c.sentence_embeddings is None for c in kept)


def test_llmlingua_output_that_is_empty_drops_the_chunk(chunks):
    compressor = RecordingCompressor(empty_for="b0")

    kept = compress_chunks(
        CompressionPlan("llmlingua", rate=0.5), "q", QUESTION, chunks, words, compressor
    )

    assert [c.chunk_id for c in kept] == ["a#0", "c#0"]


def test_llmlingua_is_skipped_when_the_context_is_already_small_enough(chunks):
    compressor = RecordingCompressor()

    kept = compress_chunks(
        CompressionPlan("llmlingua", target_tokens=50), "q", QUESTION, chunks, words, compressor
    )

    assert kept == chunks
    assert compressor.calls == []


def test_sentences_plus_llmlingua_selects_sentences_before_compressing(chunks):
    compressor = RecordingCompressor()

    kept = compress_chunks(
        CompressionPlan("sentences+llmlingua", rate=0.25),
        "q",
        QUESTION,
        chunks,
        words,
        compressor,
        sentence_prefilter_rate=0.5,
    )

    # 15 tokens: target ceil(0.25 * 15) = 4; selection first keeps max(4, ceil(7.5)) = 8.
    assert [text for _, text, _ in compressor.calls] == ["a1 a1 a2 a2 a2 a2", "b0 b0"]
    assert {rate for _, _, rate in compressor.calls} == {4 / 8}
    assert [(c.chunk_id, c.text) for c in kept] == [("a#0", "a1 a1 a2"), ("b#0", "b0")]


def test_empty_context_is_returned_as_is_for_every_method():
    for method in method_names():
        assert compress_chunks(CompressionPlan(method), "q", QUESTION, [], words) == []
