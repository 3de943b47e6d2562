"""prepare.context: chunks keep their identity when their text is rewritten, split their
sentences when no embeddings are stored, and become the sources the prompt reports."""

from __future__ import annotations

import numpy as np

from pipeline.messages import PromptSource, RetrievedChunk
from prepare.context import ContextChunk


def test_with_text_keeps_the_source_and_drops_stale_sentence_embeddings():
    original = ContextChunk(
        chunk_id="d#1",
        doc_id="d",
        title="Doc",
        text="A. B.",
        score=0.75,
        sentences=("A.", "B."),
        sentence_embeddings=np.ones((2, 3), dtype=np.float32),
    )

    rewritten = original.with_text("B.", ("B.",))

    assert (rewritten.chunk_id, rewritten.doc_id, rewritten.title, rewritten.score) == (
        "d#1",
        "d",
        "Doc",
        0.75,
    )
    assert (rewritten.text, rewritten.sentences) == ("B.", ("B.",))
    assert rewritten.sentence_embeddings is None
    assert original.text == "A. B." and original.sentence_embeddings is not None


def test_without_embeddings_splits_the_retrieved_text_into_sentences():
    retrieved = RetrievedChunk(
        chunk_id="kv#3",
        doc_id="kv",
        title="KV cache",
        text="Keys are kept. Values too!\n# Blocks\n  Pages hold 16 tokens.  ",
        score=0.625,
        row=41,
    )

    chunk = ContextChunk.without_embeddings(retrieved)

    assert (chunk.chunk_id, chunk.doc_id, chunk.title, chunk.text, chunk.score) == (
        "kv#3",
        "kv",
        "KV cache",
        retrieved.text,
        0.625,
    )
    # The heading travels with the sentence after it (retrieval.sentences).
    assert chunk.sentences == (
        "Keys are kept.",
        "Values too!",
        "# Blocks\n  Pages hold 16 tokens.",
    )
    assert chunk.sentence_embeddings is None


def test_without_embeddings_keeps_a_text_without_boundaries_as_one_sentence():
    retrieved = RetrievedChunk("d#0", "d", "D", "no full stop here", 0.1, row=0)

    assert ContextChunk.without_embeddings(retrieved).sentences == ("no full stop here",)


def test_as_source_is_the_identity_and_the_current_text():
    chunk = ContextChunk(
        chunk_id="d#1",
        doc_id="d",
        title="Doc",
        text="A. B.",
        score=0.75,
        sentences=("A.", "B."),
        sentence_embeddings=np.ones((2, 3), dtype=np.float32),
    )

    source = chunk.with_text("B.", ("B.",)).as_source()

    assert source == PromptSource(chunk_id="d#1", doc_id="d", title="Doc", text="B.", score=0.75)
