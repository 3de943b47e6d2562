"""Compressor deployment: `retrieval.PromptPreparer` with the index's sentence store and
LLMLingua loaded, the work in a thread."""

from __future__ import annotations

import asyncio

from app.config import (
    PROJECT_ROOT,
    CompressionConfig,
    GeneratorConfig,
    PromptConfig,
    resolve_path,
)
from pipeline.log import get_logger
from pipeline.messages import CompressionPlan, PreparedPrompt, Retrieval, StageError
from retrieval.models import resolve_model_reference
from retrieval.preparation import PromptPreparer, PromptTooLongError

logger = get_logger(__name__)

# The CPU KV block is 128 tokens and only full blocks are cached (16 on most GPU backends).
CPU_KV_BLOCK_TOKENS = 128


class CompressorDeployment:
    def __init__(
        self,
        compression: CompressionConfig,
        generator: GeneratorConfig,
        prompt: PromptConfig,
        index_path: str,
    ) -> None:
        import torch

        torch.set_num_threads(compression.llmlingua.torch_threads)
        self._preparer = PromptPreparer.load(
            resolve_model_reference(generator.model_source, PROJECT_ROOT),
            prompt.system_prompt,
            generator.max_model_len,
            margin_tokens=prompt.margin_tokens,
            index_path=resolve_path(index_path),
            llmlingua=compression.llmlingua.to_load(),
            sentence_prefilter_rate=compression.sentence_prefilter_rate,
            cost_model=compression.cost_model.to_model(),
        )
        system_tokens = self._preparer.system_prompt_tokens
        if system_tokens < CPU_KV_BLOCK_TOKENS:
            logger.warning(
                "system prompt is %d tokens, shorter than one %d-token KV block: the prefix "
                "cache cannot hold it",
                system_tokens,
                CPU_KV_BLOCK_TOKENS,
            )
        logger.info(
            "compressor ready: llmlingua=%s, system prompt %d tokens",
            self._preparer.has_chunk_compressor,
            system_tokens,
        )

    async def prepare(
        self, question: str, retrieval: Retrieval, plan: CompressionPlan, max_output_tokens: int
    ) -> PreparedPrompt | StageError:
        """Compressed, budgeted messages for the generator, or the reason there are none."""
        if "llmlingua" in plan.method and not self._preparer.has_chunk_compressor:
            return StageError(
                400,
                f"compression method {plan.method!r} is not enabled on this deployment",
                param="compression.method",
            )
        try:
            return await asyncio.to_thread(
                self._preparer.prepare, question, retrieval, plan, max_output_tokens
            )
        except PromptTooLongError as exc:
            return StageError(400, str(exc), param="question", code="context_length_exceeded")

    async def check_health(self) -> None:
        """Serve's health check: the models are loaded (nothing that waits on requests)."""
        if self._preparer.system_prompt_tokens < 1:
            raise RuntimeError("the serving tokenizer is not loaded")
