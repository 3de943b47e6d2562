"""Retriever stage: embed the question (batched across requests) and search FAISS."""

from __future__ import annotations

import asyncio
import time

import numpy as np
from ray import serve

from app.config import PROJECT_ROOT, RetrieverConfig, resolve_path
from app.errors import StageError
from app.log import get_logger
from retrieval.context import Retrieval
from retrieval.embedding import Embedder
from retrieval.index import FaissIndex
from retrieval.models import resolve_model_reference

logger = get_logger(__name__)


class RetrieverDeployment:
    def __init__(self, config: RetrieverConfig) -> None:
        import torch

        torch.set_num_threads(config.embedding.torch_threads)
        self._config = config
        self._embedder = Embedder.load(
            resolve_model_reference(config.embedding.model, PROJECT_ROOT),
            device=config.embedding.device,
            batch_size=config.embedding.batch_size,
        )
        self._index = FaissIndex.load(resolve_path(config.index_path), config.use_gpu_index)
        self._index.set_search_params(nprobe=config.nprobe, ef_search=config.ef_search)
        if self._index.manifest.dimension != self._embedder.dimension:
            raise ValueError(
                f"index was built with {self._index.manifest.embedding_model} "
                f"({self._index.manifest.dimension} dims), not the configured embedder"
            )
        self._embed_batch.set_max_batch_size(config.embedding.batch_size)
        self._embed_batch.set_batch_wait_timeout_s(config.embedding.batch_wait_timeout_ms / 1000)
        logger.info(
            "retriever ready: %d chunks from %s", len(self._index.chunks), config.index_path
        )

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.005)
    async def _embed_batch(self, questions: list[str]) -> list[np.ndarray]:
        vectors = await asyncio.to_thread(self._embedder.encode, questions)
        return list(vectors)

    async def retrieve(self, question: str, top_k: int) -> Retrieval | StageError:
        """The `top_k` chunks most similar to `question`, best first."""
        if not 1 <= top_k <= self._config.max_top_k:
            return StageError(400, f"top_k must be 1..{self._config.max_top_k}", param="top_k")
        started = time.perf_counter()
        vector = await self._embed_batch(question)
        hits = await asyncio.to_thread(self._index.search, vector[None, :], top_k)
        chunks = tuple(self._index.context_chunk(hit) for hit in hits[0])
        return Retrieval(vector, chunks, (time.perf_counter() - started) * 1000)

    async def ready(self) -> dict:
        return {"chunks": len(self._index.chunks), "model": self._index.manifest.embedding_model}
