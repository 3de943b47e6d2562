"""Compressor stage: compress the retrieved context and fit the prompt to the model."""

from __future__ import annotations

import asyncio

from app.config import (
    PROJECT_ROOT,
    CompressionConfig,
    GeneratorConfig,
    PromptConfig,
    resolve_path,
)
from app.errors import StageError
from app.log import get_logger
from retrieval.compression import CompressionPlan
from retrieval.context import Retrieval
from retrieval.llmlingua_compressor import LLMLinguaCompressor, LLMLinguaOptions
from retrieval.models import resolve_model_reference
from retrieval.preparation import PreparedPrompt, PromptPreparer, PromptTooLongError
from retrieval.tokens import ServingTokenizer

logger = get_logger(__name__)

# The CPU KV block is 128 tokens and only full blocks are cached (16 on most GPU backends).
CPU_KV_BLOCK_TOKENS = 128


class CompressorDeployment:
    def __init__(
        self, compression: CompressionConfig, generator: GeneratorConfig, prompt: PromptConfig
    ) -> None:
        import torch

        torch.set_num_threads(compression.llmlingua.torch_threads)
        tokenizer = ServingTokenizer.load(
            resolve_model_reference(generator.model_source, PROJECT_ROOT)
        )
        llmlingua = None
        if compression.llmlingua.enabled:
            settings = compression.llmlingua
            llmlingua = LLMLinguaCompressor.load(
                resolve_model_reference(settings.model, PROJECT_ROOT),
                LLMLinguaOptions(
                    use_llmlingua2=settings.use_llmlingua2,
                    rank_method=settings.rank_method,
                    condition_compare=settings.condition_compare,
                    iterative_size=settings.iterative_size,
                ),
                device=settings.device,
                dtype=settings.dtype,
                tiktoken_cache_dir=str(resolve_path(settings.tiktoken_cache_dir)),
            )
        self._preparer = PromptPreparer(
            tokenizer,
            prompt.system_prompt,
            generator.max_model_len,
            prompt.margin_tokens,
            llmlingua,
            compression.sentence_prefilter_rate,
            compression.cost_model.to_model(),
        )
        self._llmlingua_loaded = llmlingua is not None
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
            self._llmlingua_loaded,
            system_tokens,
        )

    async def prepare(
        self, question: str, retrieval: Retrieval, plan: CompressionPlan, max_output_tokens: int
    ) -> PreparedPrompt | StageError:
        """Compressed, budgeted messages for the generator, or the reason there are none."""
        if "llmlingua" in plan.method and not self._llmlingua_loaded:
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

    async def ready(self) -> dict:
        return {
            "llmlingua": self._llmlingua_loaded,
            "system_prompt_tokens": self._preparer.system_prompt_tokens,
        }
