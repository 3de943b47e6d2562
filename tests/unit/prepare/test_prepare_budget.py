"""prepare.budget: how much context fits, and cutting it at chunk and sentence edges."""

from __future__ import annotations

import numpy as np

from prepare.budget import context_budget_tokens, fence_tokens, fit_to_budget
from prepare.context import ContextChunk


def words(text: str) -> int:
    return len(text.split())


def chunk(
    i: int, sentences: tuple[str, ...] = ("one two three four five.", "six seven eight nine ten.")
):
    return ContextChunk(
        chunk_id=f"d#{i}",
        doc_id="d",
        title="T",
        text=" ".join(sentences),
        score=1.0 - i / 10,
        sentences=sentences,
        sentence_embeddings=np.eye(len(sentences), 4, dtype=np.float32),
    )


def test_context_budget_is_what_remains_after_answer_fixed_prompt_and_margin():
    assert context_budget_tokens(2048, 128, 300) == 2048 - 128 - 300 - 16
    assert context_budget_tokens(2048, 128, 300, margin_tokens=0) == 1620
    assert context_budget_tokens(512, 400, 200, margin_tokens=16) == -104


def test_fence_tokens_counts_the_source_wrapper():
    # <source | id="d#0" | title="T"> | </source>
    assert fence_tokens(chunk(0), words) == 4


def test_everything_fits_unchanged_and_not_truncated():
    chunks = [chunk(0), chunk(1)]

    kept, truncated = fit_to_budget(chunks, words, budget_tokens=28)

    assert kept == chunks
    assert truncated is False


def test_whole_chunks_are_kept_in_order_and_the_first_overflowing_one_is_cut_at_a_sentence():
    chunks = [chunk(0), chunk(1), chunk(2), chunk(3)]
    # Each chunk costs 10 words + 4 fence tokens. Two fit in 28; 10 more leave room for the
    # fence (4) and one 5-word sentence plus its joining space (6).
    kept, truncated = fit_to_budget(chunks, words, budget_tokens=38)

    assert truncated is True
    assert [c.chunk_id for c in kept] == ["d#0", "d#1", "d#2"]
    assert kept[:2] == chunks[:2]
    cut = kept[2]
    assert cut.text == "one two three four five."
    assert cut.sentences == ("one two three four five.",)
    assert cut.sentence_embeddings is None
    assert (cut.doc_id, cut.title, cut.score) == ("d", "T", chunks[2].score)


def test_a_chunk_with_no_room_for_any_sentence_is_dropped():
    chunks = [chunk(0), chunk(1)]

    kept, truncated = fit_to_budget(chunks, words, budget_tokens=14 + 9)

    assert kept == [chunks[0]]
    assert truncated is True


def test_later_chunks_are_dropped_after_the_cut_even_if_they_would_fit():
    small = chunk(2, ("tiny.",))
    kept, truncated = fit_to_budget([chunk(0), chunk(1), small], words, budget_tokens=20)

    assert [c.chunk_id for c in kept] == ["d#0"]
    assert truncated is True


def test_chunk_without_sentences_is_treated_as_one_sentence():
    whole = ContextChunk("x#0", "x", "T", "a b c d e f g h", 0.3)

    assert fit_to_budget([whole], words, budget_tokens=8) == ([], True)
    kept, truncated = fit_to_budget([whole], words, budget_tokens=12)
    assert (kept, truncated) == ([whole], False)


def test_non_positive_budget_keeps_nothing():
    assert fit_to_budget([chunk(0)], words, 0) == ([], True)
    assert fit_to_budget([], words, 0) == ([], False)
