"""Retriever deployment: `retrieval.Retriever` with question embeddings batched across
requests (`@serve.batch`) and the blocking work off the event loop.

A request that names a collection is searched in that collection's current version
(`corpus.catalog`): CURRENT is read as the request starts, so a publish is seen by the
next request on every replica, and a request keeps the version it started with."""

from __future__ import annotations

import asyncio
import functools
import time

import numpy as np
from ray import serve

from corpus.catalog import CollectionEmpty, RetrieverCatalog
from corpus.collection_store import CollectionNotFound, CollectionStore, InvalidCollectionName
from corpus.config import CollectionsConfig
from deployments.collection_metrics import VersionLoadMetrics
from deployments.version_refresh import VERSION_REFRESH_S, VersionRefresher
from pipeline.config_base import PROJECT_ROOT, resolve_path
from pipeline.log import get_logger
from pipeline.messages import (
    DEFAULT_COLLECTION,
    DEFAULT_SEARCH,
    EmbeddedTexts,
    Retrieval,
    SearchOptions,
    StageError,
)
from retrieval.config import RetrieverConfig
from retrieval.models import resolve_model_reference
from retrieval.retriever import Retriever

logger = get_logger(__name__)


class RetrieverDeployment:
    def __init__(
        self, config: RetrieverConfig, collections: CollectionsConfig | None = None
    ) -> None:
        """`collections` None (or disabled): only the shipped corpus is searched."""
        import torch

        torch.set_num_threads(config.embedding.torch_threads)
        self._max_top_k = config.max_top_k
        self._retriever = Retriever.load(
            resolve_path(config.index_path),
            resolve_model_reference(config.embedding.model, PROJECT_ROOT),
            device=config.embedding.device,
            batch_size=config.embedding.batch_size,
            use_gpu_index=config.use_gpu_index,
            nprobe=config.nprobe,
            ef_search=config.ef_search,
            hybrid=config.hybrid.to_params(),
            dense_fallback=config.hybrid.dense_fallback,
        )
        store = (
            CollectionStore(resolve_path(collections.root))
            if collections is not None and collections.enabled
            else None
        )
        self._catalog = RetrieverCatalog(
            self._retriever,
            store,
            functools.partial(
                self._retriever.open_version,
                use_gpu_index=config.use_gpu_index,
                nprobe=config.nprobe,
                ef_search=config.ef_search,
            ),
            on_load=VersionLoadMetrics().observe_load if store is not None else None,
        )
        self._refresher = (
            VersionRefresher(self._catalog.refresh, VERSION_REFRESH_S)
            if store is not None and collections is not None
            else None
        )
        self._embed_batch.set_max_batch_size(config.embedding.batch_size)
        self._embed_batch.set_batch_wait_timeout_s(config.embedding.batch_wait_timeout_ms / 1000)
        logger.info(
            "retriever ready: %d chunks from %s, %s retrieval (lexical index: %s)",
            self._retriever.num_chunks,
            config.index_path,
            self._retriever.hybrid.mode,
            "yes" if self._retriever.has_lexical else "no",
        )

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.005)
    async def _embed_batch(self, questions: list[str]) -> list[np.ndarray]:
        return list(await asyncio.to_thread(self._retriever.embed, questions))

    async def retrieve(
        self, question: str, top_k: int, search: SearchOptions = DEFAULT_SEARCH
    ) -> Retrieval | StageError:
        """The `top_k` best chunks for `question`, best first, ranked as `search` asks
        (dense, lexical or hybrid, and the weights; the configured default where it is
        silent). The question is embedded whatever the mode: the compressor selects
        sentences by that vector."""
        if not 1 <= top_k <= self._max_top_k:
            return StageError(400, f"top_k must be 1..{self._max_top_k}", param="top_k")
        started_at_s, started = time.time(), time.perf_counter()
        if search.collection not in (None, DEFAULT_COLLECTION) and self._refresher is not None:
            self._refresher.start()
        try:
            # The version is chosen here, before any work: this request keeps it.
            retriever = await asyncio.to_thread(self._catalog.retriever_for, search.collection)
        except CollectionNotFound as exc:
            return StageError(
                404, str(exc), "not_found_error", param="collection", code="collection_not_found"
            )
        except InvalidCollectionName as exc:
            return StageError(400, str(exc), param="collection", code="invalid_collection_name")
        except CollectionEmpty as exc:
            return StageError(409, str(exc), param="collection", code="collection_empty")
        vector = await self._embed_batch(question)
        rank = functools.partial(
            retriever.search,
            vector,
            top_k,
            started_at_s,
            started,
            question=question,
            mode=search.mode,
            dense_weight=search.dense_weight,
            lexical_weight=search.lexical_weight,
        )
        try:
            return await asyncio.to_thread(rank)
        except ValueError as exc:  # a mode this index cannot serve (no BM25 part), bad weights
            return StageError(400, str(exc), param="retrieval", code="invalid_retrieval")

    async def embed(self, texts: list[str]) -> EmbeddedTexts:
        """The texts' unit vectors by the index's own model, through the question batches."""
        vectors = await asyncio.gather(*(self._embed_batch(text) for text in texts))
        tokens = await asyncio.to_thread(self._retriever.count_tokens, texts)
        return EmbeddedTexts(np.stack(vectors), tokens)

    async def check_health(self) -> None:
        """Serve's health check: the index is loaded (nothing that waits on requests)."""
        if self._retriever.num_chunks < 1:
            raise RuntimeError("the index holds no chunks")
