"""The retriever stage without Ray: embed questions, search, return chunk hits.

Three ways to rank (`pipeline.messages.RetrievalMode`): `dense` (FAISS over the question's
embedding), `lexical` (BM25 over the question's words, retrieval.lexical) and `hybrid` (both,
fused by weighted reciprocal rank fusion). The defaults come from `HybridParams`; a call may
override the mode and the weights.

The deployment wraps it (batching the embeddings across requests, threads, health); tests
and benchmarks construct it directly.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from pipeline.messages import DEFAULT_COLLECTION, Retrieval, RetrievalMode, StageTiming
from retrieval.embedding import Embedder
from retrieval.fusion import HybridParams, check_fusion_params, reciprocal_rank_fusion
from retrieval.index import FaissIndex, SearchHit
from retrieval.lexical import LexicalIndex, LexicalIndexMissing, has_lexical

logger = logging.getLogger(__name__)


class Retriever:
    def __init__(
        self,
        embedder: Embedder,
        index: FaissIndex,
        lexical: LexicalIndex | None = None,
        hybrid: HybridParams | None = None,
        collection: str = DEFAULT_COLLECTION,
    ) -> None:
        """`lexical` is the index's BM25 part (None: an index built without one, which can
        only search densely); `hybrid` holds the default mode and fusion settings;
        `collection` names what the index holds, in every Retrieval. Raises
        LexicalIndexMissing when the default mode needs a lexical part that is absent."""
        if index.manifest.dimension != embedder.dimension:
            raise ValueError(
                f"index was built with {index.manifest.embedding_model} "
                f"({index.manifest.dimension} dims), not the configured embedder "
                f"({embedder.dimension} dims)"
            )
        if lexical is not None and lexical.num_rows != len(index.chunks):
            raise ValueError(
                f"the lexical index has {lexical.num_rows} rows, the index {len(index.chunks)}"
            )
        self.embedder = embedder
        self.index = index
        self.lexical = lexical
        self.hybrid = hybrid or HybridParams()
        self.collection = collection
        if self.hybrid.mode != "dense":
            self._require_lexical(self.hybrid.mode)

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
        hybrid: HybridParams | None = None,
        dense_fallback: bool = False,
    ) -> Retriever:
        """Load the embedder, the FAISS index (without the sentence embeddings, which
        only the compressor uses) and the index's lexical part when it has one.

        When `hybrid.mode` needs a lexical part the index lacks (one built before it
        existed): with `dense_fallback` the default mode becomes dense and a warning says
        so; without, LexicalIndexMissing is raised before the embedder loads."""
        index, lexical, hybrid = _open_index(
            index_path, use_gpu_index, nprobe, ef_search, hybrid, dense_fallback
        )
        embedder = Embedder.load(embedding_model_path, device=device, batch_size=batch_size)
        return cls(embedder, index, lexical, hybrid)

    def open_version(
        self,
        index_path: Path,
        collection: str,
        *,
        use_gpu_index: bool = False,
        nprobe: int | None = None,
        ef_search: int | None = None,
    ) -> Retriever:
        """A retriever over another index folder (a collection's version) that shares this
        one's embedder and fusion settings; the search breadth is the folder's own unless
        given; an index without a lexical part searches densely."""
        index, lexical, hybrid = _open_index(
            index_path, use_gpu_index, nprobe, ef_search, self.hybrid, dense_fallback=True
        )
        return Retriever(self.embedder, index, lexical, hybrid, collection)

    @property
    def num_chunks(self) -> int:
        return len(self.index.chunks)

    def embed(self, questions: Sequence[str]) -> np.ndarray:
        """Unit vectors of `questions`, one row each."""
        return self.embedder.encode(questions)

    def count_tokens(self, texts: Sequence[str]) -> int:
        return self.embedder.count_tokens(texts)

    @property
    def has_lexical(self) -> bool:
        """Whether lexical and hybrid retrieval are available (the index has a BM25 part)."""
        return self.lexical is not None

    def search(
        self,
        question_embedding: np.ndarray,
        top_k: int,
        started_at_s: float,
        started: float,
        *,
        question: str | None = None,
        mode: RetrievalMode | None = None,
        dense_weight: float | None = None,
        lexical_weight: float | None = None,
    ) -> Retrieval:
        """The `top_k` best chunks for one question, best first. `started_at_s` (Unix) and
        `started` (perf_counter) mark when this request's work began.

        `mode` and the weights override the configured defaults (None keeps them); lexical
        and hybrid need the question's text. A chunk's score is the cosine similarity
        (dense), the BM25 score (lexical) or the fused RRF score (hybrid). Lexical search
        returns fewer than `top_k` chunks when fewer share a word with the question. Raises
        ValueError (LexicalIndexMissing among them) on a request that cannot be served.
        """
        hits = self.rank(
            question_embedding,
            top_k,
            question=question,
            mode=mode,
            dense_weight=dense_weight,
            lexical_weight=lexical_weight,
        )
        return Retrieval(
            question_embedding=question_embedding,
            chunks=tuple(self.index.retrieved_chunk(hit) for hit in hits),
            index_version=self.index.version,
            timing=StageTiming(started_at_s, (time.perf_counter() - started) * 1000),
            collection=self.collection,
        )

    def rank(
        self,
        question_embedding: np.ndarray,
        top_k: int,
        *,
        question: str | None = None,
        mode: RetrievalMode | None = None,
        dense_weight: float | None = None,
        lexical_weight: float | None = None,
    ) -> list[SearchHit]:
        """The hits behind `search` (rows and scores, best first), without building the
        reply; the arguments are those of `search`."""
        settings = self.hybrid
        mode = mode or settings.mode
        if mode == "dense":
            return self.index.search(question_embedding[None, :], top_k)[0]
        lexical = self._require_lexical(mode)
        if question is None:
            raise ValueError(f"{mode} retrieval needs the question's text")
        if mode == "lexical":
            return lexical.search(question, top_k)
        if mode != "hybrid":
            raise ValueError(f"unknown retrieval mode {mode!r}")
        weights = (
            settings.dense_weight if dense_weight is None else dense_weight,
            settings.lexical_weight if lexical_weight is None else lexical_weight,
        )
        check_fusion_params(weights, settings.rrf_k)
        candidates = max(settings.candidates, top_k)
        dense_hits = self.index.search(question_embedding[None, :], candidates)[0]
        lexical_hits = lexical.search(question, candidates)
        fused = reciprocal_rank_fusion(
            [[hit.position for hit in dense_hits], [hit.position for hit in lexical_hits]],
            weights,
            settings.rrf_k,
            top_k,
        )
        return [SearchHit(item.row, item.score) for item in fused]

    def retrieve(
        self,
        question: str,
        top_k: int,
        *,
        mode: RetrievalMode | None = None,
        dense_weight: float | None = None,
        lexical_weight: float | None = None,
    ) -> Retrieval:
        """Embed and search one question (the unbatched path); the configured mode and
        weights unless overridden."""
        started_at_s, started = time.time(), time.perf_counter()
        return self.search(
            self.embed([question])[0],
            top_k,
            started_at_s,
            started,
            question=question,
            mode=mode,
            dense_weight=dense_weight,
            lexical_weight=lexical_weight,
        )

    def _require_lexical(self, mode: str) -> LexicalIndex:
        if self.lexical is None:
            raise LexicalIndexMissing(
                f"{mode} retrieval needs a lexical index, and this index "
                f"({self.index.version}) was built without one: rebuild it with "
                "`python -m retrieval.build`"
            )
        return self.lexical


def _open_index(
    index_path: Path,
    use_gpu_index: bool,
    nprobe: int | None,
    ef_search: int | None,
    hybrid: HybridParams | None,
    dense_fallback: bool,
) -> tuple[FaissIndex, LexicalIndex | None, HybridParams | None]:
    """The FAISS index (without sentence embeddings), its lexical part when it has one, and
    the hybrid settings it can serve (see `Retriever.load`)."""
    index = FaissIndex.load(index_path, use_gpu_index, with_sentence_embeddings=False)
    index.set_search_params(nprobe=nprobe, ef_search=ef_search)
    lexical = LexicalIndex.load(index_path) if has_lexical(index.manifest) else None
    if lexical is None and hybrid is not None and hybrid.mode != "dense":
        if not dense_fallback:
            raise LexicalIndexMissing(
                f"retriever.hybrid.mode is {hybrid.mode!r}, but {index_path} was built "
                "without a lexical index: rebuild it with `python -m retrieval.build` or "
                "set retriever.hybrid.mode to 'dense'"
            )
        logger.warning(
            "%s was built without a lexical index: retrieving densely instead of %s; "
            "rebuild it with `python -m retrieval.build` for %s retrieval",
            index_path,
            hybrid.mode,
            hybrid.mode,
        )
        hybrid = dataclasses.replace(hybrid, mode="dense")
    return index, lexical, hybrid
