"""From retrieved chunks to the chat messages vLLM receives: sanitise, compress, fit, assemble."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from retrieval.budget import context_budget_tokens, fit_to_budget
from retrieval.compression import (
    ChunkCompressor,
    CompressionPlan,
    compress_chunks,
    count_context_tokens,
)
from retrieval.context import ContextChunk, Retrieval
from retrieval.cost_model import CompressionCostModel, CompressionDecision
from retrieval.prompt import build_messages, neutralize
from retrieval.tokens import ServingTokenizer


class PromptTooLongError(ValueError):
    """The question and the answer budget leave no room in the model's context window."""


@dataclass(frozen=True)
class PreparedPrompt:
    """The generator's input, and what compression and budgeting did to get there."""

    messages: list[dict[str, str]]
    chunks: tuple[ContextChunk, ...]
    method: str
    context_tokens_before: int
    context_tokens_after: int
    compress_ms: float
    truncated: bool
    # Set when the plan's policy was "auto": what the cost model predicted and chose.
    decision: CompressionDecision | None = None


class PromptPreparer:
    """Turns (question, retrieval, plan) into messages that fit the serving model."""

    def __init__(
        self,
        tokenizer: ServingTokenizer,
        system_prompt: str,
        max_model_len: int,
        margin_tokens: int = 16,
        chunk_compressor: ChunkCompressor | None = None,
        sentence_prefilter_rate: float = 0.5,
        cost_model: CompressionCostModel | None = None,
    ) -> None:
        self._tokenizer = tokenizer
        self._system_prompt = system_prompt
        self._max_model_len = max_model_len
        self._margin_tokens = margin_tokens
        self._chunk_compressor = chunk_compressor
        self._sentence_prefilter_rate = sentence_prefilter_rate
        self._cost_model = cost_model
        self._reserved = tokenizer.reserved_strings()
        # The system prompt never changes: count it once, not on every readiness probe.
        self.system_prompt_tokens = tokenizer.count_chat(
            [{"role": "system", "content": system_prompt}]
        )

    def prepare(
        self, question: str, retrieval: Retrieval, plan: CompressionPlan, max_output_tokens: int
    ) -> PreparedPrompt:
        """Compress the context per `plan`, cut it to the token budget, build the messages.

        Raises PromptTooLongError when even an empty context does not fit, and ValueError
        when `plan` names a method whose compressor is not loaded.
        """
        question = neutralize(question, self._reserved).strip()
        chunks = [self._sanitized(chunk) for chunk in retrieval.chunks]
        count = self._tokenizer.count
        tokens_before = count_context_tokens(chunks, count)
        fixed_tokens = self._tokenizer.count_chat(build_messages(self._system_prompt, [], question))
        budget = context_budget_tokens(
            self._max_model_len, max_output_tokens, fixed_tokens, self._margin_tokens
        )
        if budget <= 0:
            raise PromptTooLongError(
                f"the question ({fixed_tokens} prompt tokens with the system prompt) and "
                f"max_tokens={max_output_tokens} exceed the model's {self._max_model_len}-token "
                "context"
            )
        decision = None
        if plan.policy == "auto" and plan.method != "none":
            decision = self._decide(plan, tokens_before, len(chunks), budget, fixed_tokens)
            if not decision.compress:
                plan = replace(plan, method="none")

        started = time.perf_counter()
        compressed = compress_chunks(
            plan,
            question,
            retrieval.question_embedding,
            chunks,
            count,
            self._chunk_compressor,
            self._sentence_prefilter_rate,
        )
        compress_ms = (time.perf_counter() - started) * 1000
        kept, truncated = fit_to_budget(compressed, count, budget)
        kept = [replace(chunk, sentence_embeddings=None) for chunk in kept]
        return PreparedPrompt(
            messages=build_messages(self._system_prompt, kept, question),
            chunks=tuple(kept),
            method=plan.method,
            context_tokens_before=tokens_before,
            context_tokens_after=count_context_tokens(kept, count),
            compress_ms=compress_ms,
            truncated=truncated,
            decision=decision,
        )

    def _decide(
        self,
        plan: CompressionPlan,
        tokens_before: int,
        chunks: int,
        budget: int,
        fixed_tokens: int,
    ) -> CompressionDecision:
        """The cost model's verdict on `plan`, for what would actually be sent: both sides
        are cut to the context budget, and the cached system prompt is not prefilled."""
        if self._cost_model is None:
            raise ValueError("compression policy 'auto' needs a cost model")
        return self._cost_model.decide(
            plan.method,
            tokens_before=min(tokens_before, budget),
            tokens_after=min(plan.target_for(tokens_before), budget),
            chunks=chunks,
            other_uncached_tokens=max(0, fixed_tokens - self.system_prompt_tokens),
            prefilter_rate=self._sentence_prefilter_rate,
        )

    def _sanitized(self, chunk: ContextChunk) -> ContextChunk:
        return replace(
            chunk,
            chunk_id=neutralize(chunk.chunk_id, self._reserved),
            title=neutralize(chunk.title, self._reserved),
            text=neutralize(chunk.text, self._reserved),
            sentences=tuple(neutralize(s, self._reserved) for s in chunk.sentences),
        )
