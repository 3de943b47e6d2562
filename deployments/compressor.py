"""Compressor deployment: `retrieval.PromptPreparer` with the index's sentence store and
LLMLingua loaded, and `retrieval.Attributor` for the citations; the work in a thread.

Attribution lives here because the index's sentence embeddings do: only the answer's
sentences are embedded per request. (Sentence embeddings are looked up by the sentence's
text, so the shipped corpus's store serves any collection's sentences it also holds, and the
others are embedded.)
"""

from __future__ import annotations

import asyncio
import time

from app.config import RagAppConfig
from corpus.catalog import SentenceStoreCatalog
from corpus.collection_store import CollectionStore
from deployments.version_refresh import VERSION_REFRESH_S, VersionRefresher
from pipeline.config_base import PROJECT_ROOT, resolve_path
from pipeline.log import get_logger
from pipeline.messages import (
    DEFAULT_COLLECTION,
    Attribution,
    Citation,
    CompressionPlan,
    Conversation,
    PreparedPrompt,
    PromptSource,
    Retrieval,
    StageError,
    StageTiming,
)
from prepare.attribution import AttributionOptions, Attributor
from prepare.continuation import SentTurns
from prepare.preparation import PromptPreparer, PromptTooLongError
from retrieval.embedding import Embedder
from retrieval.models import resolve_model_reference

logger = get_logger(__name__)

# The CPU KV block is 128 tokens and only full blocks are cached (16 on most GPU backends).
CPU_KV_BLOCK_TOKENS = 128


class CompressorDeployment:
    def __init__(self, config: RagAppConfig) -> None:
        import torch

        compression, generator = config.compression, config.generator
        torch.set_num_threads(compression.llmlingua.torch_threads)
        # Another collection's sentences come from the version folder its retrieval names.
        collections = (
            SentenceStoreCatalog(CollectionStore(resolve_path(config.collections.root)))
            if config.collections.enabled
            else None
        )
        self._refresher = (
            VersionRefresher(collections.refresh, VERSION_REFRESH_S)
            if collections is not None
            else None
        )
        self._preparer = PromptPreparer.load(
            resolve_model_reference(generator.tokenizer_source(), PROJECT_ROOT),
            config.prompt.system_prompts(),
            generator.max_model_len,
            config.preparation_options(),
            index_path=resolve_path(config.retriever.index_path),
            llmlingua=compression.llmlingua.to_load(),
            cost_model=compression.cost_model.to_model(),
            collection_stores=collections.store_for if collections is not None else None,
            sent_turns=(
                SentTurns(compression.reuse.remembered_turns)
                if compression.reuse.remembered_turns
                else None
            ),
        )
        self._attributor: Attributor | None = None
        if config.citations.enabled:
            embedding = config.retriever.embedding
            embedder = Embedder.load(
                resolve_model_reference(embedding.model, PROJECT_ROOT), device=embedding.device
            )
            options = AttributionOptions(
                min_score=config.citations.min_score,
                lexical_weight=config.citations.lexical_weight,
            )
            self._attributor = Attributor(embedder.encode, options)
        for style, tokens in self._preparer.system_prompt_tokens.items():
            if tokens < CPU_KV_BLOCK_TOKENS:
                logger.warning(
                    "the %s system prompt is %d tokens, shorter than one %d-token KV block: "
                    "the prefix cache cannot hold it",
                    style,
                    tokens,
                    CPU_KV_BLOCK_TOKENS,
                )
        logger.info(
            "compressor ready: llmlingua=%s, citations=%s, system prompts %s tokens",
            self._preparer.has_chunk_compressor,
            self._attributor is not None,
            self._preparer.system_prompt_tokens,
        )

    async def prepare(
        self,
        conversation: Conversation,
        retrieval: Retrieval,
        plan: CompressionPlan,
        max_output_tokens: int,
    ) -> PreparedPrompt | StageError:
        """Compressed, budgeted messages for the generator, or the reason there are none."""
        if retrieval.collection != DEFAULT_COLLECTION and self._refresher is not None:
            self._refresher.start()
        if not self._preparer.loaded_for(plan.method):
            return StageError(
                400,
                f"compression method {plan.method!r} is not enabled on this deployment",
                param="compression.method",
            )
        try:
            return await asyncio.to_thread(
                self._preparer.prepare, conversation, retrieval, plan, max_output_tokens
            )
        except PromptTooLongError as exc:
            return StageError(400, str(exc), param="question", code="context_length_exceeded")

    async def attribute(
        self, answer: str, sources: tuple[PromptSource, ...]
    ) -> Attribution | StageError:
        """Each answer sentence's supporting source sentence, as citations."""
        if self._attributor is None:
            return StageError(400, "citations are not enabled on this deployment")
        started_at_s, started = time.time(), time.perf_counter()
        citations = await asyncio.to_thread(self._attribute, self._attributor, answer, sources)
        own_ms = (time.perf_counter() - started) * 1000
        return Attribution(citations, StageTiming(started_at_s, own_ms))

    def _attribute(
        self, attributor: Attributor, answer: str, sources: tuple[PromptSource, ...]
    ) -> tuple[Citation, ...]:
        # The index's own sentence embeddings: only the answer's sentences are embedded.
        store = self._preparer.sentence_store
        known = store.embeddings_of(s.chunk_id for s in sources) if store is not None else None
        return attributor.attribute(answer, sources, known)

    async def check_health(self) -> None:
        """Serve's health check: the models are loaded (nothing that waits on requests)."""
        if min(self._preparer.system_prompt_tokens.values()) < 1:
            raise RuntimeError("the serving tokenizer is not loaded")
