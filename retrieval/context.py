"""The retrieved context as it travels from the retriever through compression into the prompt."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np


@dataclass(frozen=True)
class ContextChunk:
    """One retrieved chunk. `sentence_embeddings` rows match `sentences` (None once rewritten)."""

    chunk_id: str
    doc_id: str
    title: str
    text: str
    score: float
    sentences: tuple[str, ...] = ()
    sentence_embeddings: np.ndarray | None = None

    def with_text(self, text: str, sentences: tuple[str, ...] = ()) -> ContextChunk:
        """The same source with new (compressed or truncated) text."""
        return replace(self, text=text, sentences=sentences, sentence_embeddings=None)


@dataclass(frozen=True)
class Retrieval:
    """What the retriever returns for one question."""

    question_embedding: np.ndarray
    chunks: tuple[ContextChunk, ...]
    retrieve_ms: float
