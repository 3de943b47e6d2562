"""`Stages` over Ray Serve deployment handles, with Serve's backpressure mapped to 503."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from ray.serve.exceptions import BackPressureError
from ray.serve.handle import DeploymentHandle

from app.errors import StageError, overloaded
from retrieval.compression import CompressionPlan
from retrieval.context import Retrieval
from retrieval.preparation import PreparedPrompt


class HandleStages:
    def __init__(
        self, retriever: DeploymentHandle, compressor: DeploymentHandle, generator: DeploymentHandle
    ) -> None:
        self.retriever = retriever
        self.compressor = compressor
        self.generator = generator

    async def retrieve(self, question: str, top_k: int) -> Retrieval | StageError:
        try:
            return await self.retriever.retrieve.remote(question, top_k)
        except BackPressureError:
            raise overloaded("the retriever is at capacity; retry shortly") from None

    async def prepare(
        self, question: str, retrieval: Retrieval, plan: CompressionPlan, max_output_tokens: int
    ) -> PreparedPrompt | StageError:
        try:
            return await self.compressor.prepare.remote(
                question, retrieval, plan, max_output_tokens
            )
        except BackPressureError:
            raise overloaded("the compressor is at capacity; retry shortly") from None

    async def generate(
        self, messages: list[dict[str, str]], max_tokens: int, temperature: float
    ) -> AsyncIterator[dict[str, Any]]:
        stream = self.generator.options(stream=True).generate.remote(
            messages, max_tokens, temperature
        )
        try:
            async for event in stream:
                yield event
        except BackPressureError:
            raise overloaded("the generator is at capacity; retry shortly") from None
        finally:
            stream.cancel()
