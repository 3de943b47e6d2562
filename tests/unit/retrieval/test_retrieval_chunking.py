"""retrieval.chunking: token-bounded, sentence-aligned, overlapping chunks."""

from __future__ import annotations

import itertools
import re

import pytest

from retrieval.chunking import ChunkingParams, chunk_document, chunk_documents
from retrieval.documents import Document


def word_offsets(text: str) -> list[tuple[int, int]]:
    """Whitespace tokens: one token per run of non-space characters."""
    return [match.span() for match in re.finditer(r"\S+", text)]


def n_tokens(text: str) -> int:
    return len(word_offsets(text))


def _sentence(index: int, words: int) -> str:
    return " ".join([f"S{index}"] + [f"w{index}x{j}" for j in range(words - 2)] + ["end."])


def _document(sentence_words: list[int], doc_id: str = "doc") -> Document:
    text = " ".join(_sentence(i, n) for i, n in enumerate(sentence_words))
    return Document(doc_id=doc_id, title="Title", text=text)


def test_every_chunk_fits_and_the_chunks_cover_every_sentence_in_order():
    document = _document([3, 5, 4, 6, 2, 7, 3, 5, 4, 3])
    params = ChunkingParams(chunk_tokens=12, overlap_tokens=4)

    chunks = chunk_document(document, word_offsets, params)

    assert len(chunks) > 1
    assert all(n_tokens(c.text) <= params.chunk_tokens for c in chunks)
    assert all(c.text in document.text for c in chunks)
    seen = [s for c in chunks for s in c.sentences]
    expected = [_sentence(i, n) for i, n in enumerate([3, 5, 4, 6, 2, 7, 3, 5, 4, 3])]
    assert list(dict.fromkeys(seen)) == expected


def test_chunk_ids_number_chunks_per_document_and_keep_doc_fields():
    chunks = chunk_documents(
        [_document([4] * 6, "a/b"), _document([4] * 3, "c")],
        word_offsets,
        ChunkingParams(chunk_tokens=8, overlap_tokens=0),
    )

    assert [c.chunk_id for c in chunks] == ["a/b#0", "a/b#1", "a/b#2", "c#0", "c#1"]
    assert {(c.doc_id, c.title) for c in chunks[:3]} == {("a/b", "Title")}


def test_sentence_spans_index_into_the_chunk_text():
    document = _document([3, 5, 4, 6, 2, 7])

    for chunk in chunk_document(document, word_offsets, ChunkingParams(10, 3)):
        assert chunk.sentence_spans[0][0] == 0
        assert chunk.sentence_spans[-1][1] == len(chunk.text)
        for start, end in chunk.sentence_spans:
            sentence = chunk.text[start:end]
            assert sentence == sentence.strip() and sentence.endswith("end.")


def test_overlap_carries_the_trailing_sentences_that_fit():
    # Sentences of 3 tokens, chunks of 9: three sentences each; 6 overlap tokens carry two.
    document = _document([3] * 7)

    chunks = chunk_document(
        document, word_offsets, ChunkingParams(chunk_tokens=9, overlap_tokens=6)
    )

    assert chunks[0].sentences[-2:] == chunks[1].sentences[:2]
    assert [len(c.sentences) for c in chunks] == [3] * 5
    assert chunks[-1].sentences[-1] == _sentence(6, 3)


def test_overlap_never_carries_more_than_overlap_tokens():
    document = _document([3] * 7)

    chunks = chunk_document(
        document, word_offsets, ChunkingParams(chunk_tokens=9, overlap_tokens=5)
    )

    # Only one 3-token sentence fits in 5 overlap tokens.
    for previous, current in itertools.pairwise(chunks):
        assert previous.sentences[-1:] == current.sentences[:1]
        assert previous.sentences[-2] not in current.sentences


def test_every_chunk_adds_a_sentence_the_previous_chunk_does_not_have():
    document = Document("d", "D", "A1 a a a a. B1 b b b b. C1 c c c c c.")

    chunks = chunk_document(
        document, word_offsets, ChunkingParams(chunk_tokens=10, overlap_tokens=5)
    )

    for previous, current in itertools.pairwise(chunks):
        assert set(current.sentences) - set(previous.sentences), current.chunk_id


def test_no_overlap_when_overlap_is_zero():
    chunks = chunk_document(_document([3] * 6), word_offsets, ChunkingParams(9, 0))

    assert [len(c.sentences) for c in chunks] == [3, 3]
    assert not set(chunks[0].sentences) & set(chunks[1].sentences)


def test_sentence_longer_than_a_chunk_is_cut_into_token_windows():
    long_sentence = "Long " + " ".join(f"t{i}" for i in range(24)) + "."
    document = Document("long", "Long", f"Short one. {long_sentence} Tail here.")

    chunks = chunk_document(
        document, word_offsets, ChunkingParams(chunk_tokens=10, overlap_tokens=2)
    )

    assert all(n_tokens(c.text) <= 10 for c in chunks)
    pieces = [s for c in chunks for s in c.sentences]
    windows = [s for s in dict.fromkeys(pieces) if s not in ("Short one.", "Tail here.")]
    assert [n_tokens(w) for w in windows] == [10, 10, 5]
    assert " ".join(windows) == long_sentence
    assert pieces[0] == "Short one." and pieces[-1] == "Tail here."


@pytest.mark.parametrize("overlap", [7, 8, 9])
def test_large_overlap_still_makes_progress(overlap):
    document = _document([5] * 40)

    chunks = chunk_document(
        document, word_offsets, ChunkingParams(chunk_tokens=10, overlap_tokens=overlap)
    )

    # Each chunk starts at a later sentence than the one before, so chunking terminates.
    starts = [document.text.index(c.text) for c in chunks]
    assert starts == sorted(set(starts))
    assert len(chunks) <= 40
    assert chunks[-1].sentences[-1] == _sentence(39, 5)


def test_empty_document_has_no_chunks():
    assert chunk_document(Document("e", "E", "  \n "), word_offsets, ChunkingParams()) == []


@pytest.mark.parametrize(
    ("chunk_tokens", "overlap_tokens"),
    [(7, 0), (0, 0), (16, 16), (16, 20), (16, -1)],
)
def test_chunking_params_are_validated(chunk_tokens, overlap_tokens):
    with pytest.raises(ValueError):
        ChunkingParams(chunk_tokens=chunk_tokens, overlap_tokens=overlap_tokens)


def test_chunking_params_defaults_and_smallest_valid_values():
    assert ChunkingParams() == ChunkingParams(200, 40)
    assert ChunkingParams(8, 7).overlap_tokens == 7


def test_no_chunk_of_the_shipped_corpus_has_a_heading_as_a_sentence_of_its_own():
    from pathlib import Path

    from retrieval.documents import load_documents

    corpus = Path(__file__).resolve().parents[3] / "data" / "corpus"
    heading = re.compile(r"#{1,6}(\s|$)")
    chunks = chunk_documents(load_documents(corpus), word_offsets, ChunkingParams())

    assert len(chunks) > 50
    alone = [
        (chunk.chunk_id, sentence)
        for chunk in chunks
        for sentence in chunk.sentences
        if all(heading.match(line) or not line.strip() for line in sentence.splitlines())
    ]
    assert alone == []
    # The headings are still there, opening the sentences they head.
    assert any(heading.match(sentence) for chunk in chunks for sentence in chunk.sentences)
