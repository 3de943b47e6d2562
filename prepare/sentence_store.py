"""The sentences of every indexed chunk and their embeddings, held where compression runs.

Sentence selection needs each retrieved chunk's sentence embeddings. They are computed once,
at index time, and stored beside the FAISS index; the compressor loads them from the same
folder, so a retrieval result carries only chunk rows and the question vector between stages.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from pipeline.messages import RetrievedChunk
from prepare.context import ContextChunk
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
        self._row_of = {stored.chunk.chunk_id: row for row, stored in enumerate(self._chunks)}

    @classmethod
    def load(cls, directory: Path) -> SentenceStore:
        """Read the chunks and sentence embeddings of the index in `directory`."""
        manifest = read_manifest(directory)
        embeddings = np.load(Path(directory) / SENTENCES_FILE)
        return cls(read_chunks(directory), embeddings, manifest_version(manifest))

    def __len__(self) -> int:
        return len(self._chunks)

    def embeddings_of(self, chunk_ids: Iterable[str]) -> dict[str, np.ndarray]:
        """Each stored sentence of the chunks `chunk_ids` -> its embedding (a row view).

        Ids this index does not hold are skipped. The keys are the sentences as stored (a
        sentence too long for one chunk is stored in pieces, which match no whole sentence).
        """
        known: dict[str, np.ndarray] = {}
        for chunk_id in chunk_ids:
            row = self._row_of.get(chunk_id)
            if row is None:
                continue
            stored = self._chunks[row]
            for sentence, embedding_row in zip(
                stored.chunk.sentences, stored.sentence_rows, strict=True
            ):
                known[sentence] = self._embeddings[embedding_row]
        return known

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
