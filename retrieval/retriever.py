"""The retriever stage without Ray: embed questions, search FAISS, return chunk hits.

The deployment wraps it (batching the embeddings across requests, threads, health); tests
and benchmarks construct it directly.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from pipeline.messages import Retrieval, StageTiming
from retrieval.embedding import Embedder
from retrieval.index import FaissIndex


class Retriever:
    def __init__(self, embedder: Embedder, index: FaissIndex) -> None:
        if index.manifest.dimension != embedder.dimension:
            raise ValueError(
                f"index was built with {index.manifest.embedding_model} "
                f"({index.manifest.dimension} dims), not the configured embedder "
                f"({embedder.dimension} dims)"
            )
        self.embedder = embedder
        self.index = index

    @classmethod
    def load(
        cls,
        index_path: Path,
        embedding_model_path: str,
        *,
        device: str = "cpu",
        batch_size: int = 32,
        use_gpu_index: bool = False,
        nprobe: int | None = None,
        ef_search: int | None = None,
    ) -> Retriever:
        """Load the embedder and the FAISS index (without the sentence embeddings, which
        only the compressor uses)."""
        embedder = Embedder.load(embedding_model_path, device=device, batch_size=batch_size)
        index = FaissIndex.load(index_path, use_gpu_index, with_sentence_embeddings=False)
        index.set_search_params(nprobe=nprobe, ef_search=ef_search)
        return cls(embedder, index)

    @property
    def num_chunks(self) -> int:
        return len(self.index.chunks)

    def embed(self, questions: Sequence[str]) -> np.ndarray:
        """Unit vectors of `questions`, one row each."""
        return self.embedder.encode(questions)

    def search(
        self, question_embedding: np.ndarray, top_k: int, started_at_s: float, started: float
    ) -> Retrieval:
        """The `top_k` chunks closest to one embedded question, best first. `started_at_s`
        (Unix) and `started` (perf_counter) mark when this request's work began."""
        hits = self.index.search(question_embedding[None, :], top_k)[0]
        return Retrieval(
            question_embedding=question_embedding,
            chunks=tuple(self.index.retrieved_chunk(hit) for hit in hits),
            index_version=self.index.version,
            timing=StageTiming(started_at_s, (time.perf_counter() - started) * 1000),
        )

    def retrieve(self, question: str, top_k: int) -> Retrieval:
        """Embed and search one question (the unbatched path)."""
        started_at_s, started = time.time(), time.perf_counter()
        return self.search(self.embed([question])[0], top_k, started_at_s, started)
