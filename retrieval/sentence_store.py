"""The sentences of every indexed chunk and their embeddings, held where compression runs.

Sentence selection needs each retrieved chunk's sentence embeddings. They are computed once,
at index time, and stored beside the FAISS index; the compressor loads them from the same
folder, so a retrieval result carries only chunk rows and the question vector between stages.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from pipeline.messages import RetrievedChunk
from retrieval.context import ContextChunk
from retrieval.index import (
    SENTENCES_FILE,
    IndexedChunk,
    manifest_version,
    read_chunks,
    read_manifest,
)


class SentenceStore:
    def __init__(
        self, chunks: Sequence[IndexedChunk], sentence_embeddings: np.ndarray, version: str
    ) -> None:
        self._chunks = list(chunks)
        self._embeddings = sentence_embeddings
        self.version = version

    @classmethod
    def load(cls, directory: Path) -> SentenceStore:
        """Read the chunks and sentence embeddings of the index in `directory`."""
        manifest = read_manifest(directory)
        embeddings = np.load(Path(directory) / SENTENCES_FILE)
        return cls(read_chunks(directory), embeddings, manifest_version(manifest))

    def __len__(self) -> int:
        return len(self._chunks)

    def context_chunk(self, chunk: RetrievedChunk) -> ContextChunk:
        """`chunk` with its stored sentences and their embeddings.

        Raises KeyError when the row does not hold that chunk (another build of the index).
        """
        if not 0 <= chunk.row < len(self._chunks):
            raise KeyError(f"row {chunk.row} is not in this index")
        stored = self._chunks[chunk.row]
        if stored.chunk.chunk_id != chunk.chunk_id:
            raise KeyError(f"row {chunk.row} holds {stored.chunk.chunk_id}, not {chunk.chunk_id}")
        return ContextChunk(
            chunk_id=chunk.chunk_id,
            doc_id=chunk.doc_id,
            title=chunk.title,
            text=chunk.text,
            score=chunk.score,
            sentences=tuple(stored.chunk.sentences),
            sentence_embeddings=self._embeddings[list(stored.sentence_rows)],
        )
