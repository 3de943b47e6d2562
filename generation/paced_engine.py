"""A null engine: tokens at a fixed pace, no model. It stands in for vLLM when measuring
what the serving chain itself costs (bench.chaos' overload runs; the retired bench.overhead
in docs/retired.md)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from pipeline.messages import (
    FinishEvent,
    GenerationEvent,
    GenerationRequest,
    TokenEvent,
    TokenUsage,
)

TOKEN_TEXT = " tok"
# vLLM's pace with the CPU default's reader here, roughly: what bench.chaos stands it in for.
VLLM_LIKE_TTFT_MS = 300.0
VLLM_LIKE_TPOT_MS = 30.0


class PacedEngine:
    """The first token `ttft_ms` after the request, then one every `tpot_ms`; `max_tokens`
    tokens in all. Prompt tokens are counted as whitespace-separated words."""

    def __init__(
        self, ttft_ms: float = VLLM_LIKE_TTFT_MS, tpot_ms: float = VLLM_LIKE_TPOT_MS
    ) -> None:
        self.ttft_s = ttft_ms / 1000
        self.tpot_s = tpot_ms / 1000

    async def stream(self, request: GenerationRequest) -> AsyncGenerator[GenerationEvent, None]:
        loop = asyncio.get_running_loop()
        # Deadlines from the start, so timer lateness does not accumulate over a stream.
        start = loop.time()
        for index in range(request.max_tokens):
            delay = start + self.ttft_s + index * self.tpot_s - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            yield TokenEvent(TOKEN_TEXT)
        prompt_tokens = sum(len(m["content"].split()) for m in request.messages)
        yield FinishEvent("length", TokenUsage(prompt_tokens, request.max_tokens, 0))

    async def check_health(self) -> None:
        return None
