"""How the pipeline reaches its stages, and how a stage that cannot serve says so.

`Stages` is implemented over Ray Serve handles in `deployments/` and by fakes in the tests.
Request-level refusals come back as `StageError` values; a stage that cannot take or finish
the call at all (at capacity, no live replica, its replica died) raises `StageUnavailable`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from typing import Literal, Protocol

from pipeline.messages import (
    DEFAULT_SEARCH,
    Attribution,
    CompressionPlan,
    Conversation,
    GenerationEvent,
    GenerationRequest,
    PreparedPrompt,
    PromptSource,
    Retrieval,
    SearchOptions,
    StageError,
)

StageName = Literal["retriever", "compressor", "generator", "writer"]
# overloaded: its queue is full; unavailable: no live replica, or the replica died mid-call.
UnavailableKind = Literal["overloaded", "unavailable"]


class StageUnavailable(Exception):
    """A stage could not take or could not finish a call; a retry later may succeed."""

    def __init__(self, stage: StageName, kind: UnavailableKind, detail: str = "") -> None:
        self.stage = stage
        self.kind = kind
        self.detail = detail
        message = f"the {stage} is {'at capacity' if kind == 'overloaded' else 'unavailable'}"
        super().__init__(f"{message}: {detail}" if detail else message)


class Stages(Protocol):
    """The three downstream stages, however they are reached."""

    async def retrieve(
        self, question: str, top_k: int, search: SearchOptions = DEFAULT_SEARCH
    ) -> Retrieval | StageError: ...

    async def prepare(
        self,
        conversation: Conversation,
        retrieval: Retrieval,
        plan: CompressionPlan,
        max_output_tokens: int,
    ) -> PreparedPrompt | StageError: ...

    async def attribute(
        self, answer: str, sources: tuple[PromptSource, ...]
    ) -> Attribution | StageError:
        """Citations: each answer sentence and the source sentence that supports it."""
        ...

    def generate(
        self, request: GenerationRequest
    ) -> AsyncGenerator[Sequence[GenerationEvent], None]:
        """Batches of events; the last batch ends with a FinishEvent or an ErrorEvent."""
        ...


class FallbackPreparer(Protocol):
    """Builds the uncompressed, budgeted prompt when the compressor stage cannot, and clears
    text the pipeline sends the generator itself (a rewrite's) of control strings."""

    def cleaned(self, text: str) -> str: ...

    def prepare(
        self,
        conversation: Conversation,
        retrieval: Retrieval,
        plan: CompressionPlan,
        max_output_tokens: int,
        degraded: str | None = None,
    ) -> PreparedPrompt: ...
