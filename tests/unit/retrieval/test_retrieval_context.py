"""retrieval.context: chunks keep their identity when their text is rewritten."""

from __future__ import annotations

import numpy as np

from retrieval.context import ContextChunk


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
