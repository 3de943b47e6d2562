"""A retrieved chunk as compression works on it: its text split into sentences, with the
sentences' embeddings when the index provides them."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from pipeline.messages import PromptSource, RetrievedChunk
from retrieval.sentences import split_sentences


@dataclass(frozen=True)
class ContextChunk:
    """One chunk on its way into the prompt. `sentence_embeddings` rows match `sentences`;
    None when they are unknown (or once the text was rewritten)."""

    chunk_id: str
    doc_id: str
    title: str
    text: str
    score: float
    sentences: tuple[str, ...] = ()
    sentence_embeddings: np.ndarray | None = None

    @classmethod
    def without_embeddings(cls, chunk: RetrievedChunk) -> ContextChunk:
        """A retrieved chunk whose sentences are split here (no embeddings: no sentence
        selection, but the token budget can still cut it at a sentence)."""
        sentences = tuple(chunk.text[start:end] for start, end in split_sentences(chunk.text))
        return cls(chunk.chunk_id, chunk.doc_id, chunk.title, chunk.text, chunk.score, sentences)

    def with_text(self, text: str, sentences: tuple[str, ...] = ()) -> ContextChunk:
        """The same source with new (compressed or truncated) text."""
        return replace(self, text=text, sentences=sentences, sentence_embeddings=None)

    def as_source(self) -> PromptSource:
        return PromptSource(self.chunk_id, self.doc_id, self.title, self.text, self.score)
