"""`pipeline.stages.Stages` over Ray Serve deployment handles.

Ray's failures become the pipeline's: a full queue (`BackPressureError`) is the stage
`overloaded`; a replica that died under the call, or a deployment with no replica, is the
stage `unavailable`. A stage that the ingress's readiness view shows without a running
replica is not called at all (a call would wait in Serve's queue for a replica to start).
A retrieval whose replica died is sent once more, within `retry_timeout_s` (it has no side
effects, and Serve has by then taken the dead replica out of rotation); a preparation is
not, since the pipeline has a fallback for it, and neither is an attribution (the answer
goes out without citations); a generation is never repeated. A call
abandoned by its caller (timeout, client gone) is cancelled on its replica.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any

from ray.exceptions import RayActorError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError
from ray.serve.handle import (
    DeploymentHandle,
    DeploymentResponse,
    DeploymentResponseGenerator,
)

from pipeline.log import get_logger
from pipeline.messages import (
    DEFAULT_SEARCH,
    Attribution,
    CompressionPlan,
    Conversation,
    EmbeddedTexts,
    GenerationEvent,
    GenerationRequest,
    PreparedPrompt,
    PromptSource,
    Retrieval,
    SearchOptions,
    StageError,
)
from pipeline.stages import StageName, StageUnavailable

logger = get_logger(__name__)

# A replica that died, or could not be reached, under the call.
REPLICA_LOST = (RayActorError, DeploymentUnavailableError)


class HandleStages:
    def __init__(
        self,
        retriever: DeploymentHandle,
        compressor: DeploymentHandle,
        generator: DeploymentHandle,
        available: Callable[[StageName], bool] = lambda stage: True,
        retry_timeout_s: float = 10.0,
    ) -> None:
        self.retriever = retriever
        self.compressor = compressor
        self.generator = generator
        self._available = available
        self._retry_timeout_s = retry_timeout_s

    async def retrieve(
        self, question: str, top_k: int, search: SearchOptions = DEFAULT_SEARCH
    ) -> Retrieval | StageError:
        send = functools.partial(self.retriever.retrieve.remote, question, top_k, search)
        try:
            return await self._call("retriever", send)
        except REPLICA_LOST as exc:
            if not self._available("retriever"):
                raise StageUnavailable("retriever", "unavailable", type(exc).__name__) from None
            logger.warning("a retriever replica was lost; sending the call again")
        try:
            async with asyncio.timeout(self._retry_timeout_s):
                return await self._call("retriever", send)
        except (*REPLICA_LOST, TimeoutError) as exc:
            raise StageUnavailable("retriever", "unavailable", type(exc).__name__) from None

    async def prepare(
        self,
        conversation: Conversation,
        retrieval: Retrieval,
        plan: CompressionPlan,
        max_output_tokens: int,
    ) -> PreparedPrompt | StageError:
        try:
            return await self._call(
                "compressor",
                lambda: self.compressor.prepare.remote(
                    conversation, retrieval, plan, max_output_tokens
                ),
            )
        except REPLICA_LOST as exc:
            raise StageUnavailable("compressor", "unavailable", type(exc).__name__) from None

    async def attribute(
        self, answer: str, sources: tuple[PromptSource, ...]
    ) -> Attribution | StageError:
        try:
            return await self._call(
                "compressor", lambda: self.compressor.attribute.remote(answer, sources)
            )
        except REPLICA_LOST as exc:
            raise StageUnavailable("compressor", "unavailable", type(exc).__name__) from None

    async def generate(
        self, request: GenerationRequest
    ) -> AsyncGenerator[Sequence[GenerationEvent], None]:
        if not self._available("generator"):
            raise StageUnavailable("generator", "unavailable", "no running replica")
        stream = None
        try:
            # Serve may refuse the call as it is made (a full queue), not only when it is read.
            stream = self.generator.options(stream=True).generate.remote(request)
            async for batch in stream:
                yield batch
        except BackPressureError as exc:
            raise StageUnavailable("generator", "overloaded", str(exc)) from None
        except REPLICA_LOST as exc:
            logger.warning("generator replica lost (request %s)", request.request_id)
            raise StageUnavailable("generator", "unavailable", type(exc).__name__) from None
        finally:
            if stream is not None:
                _cancel(stream)

    async def _call(self, stage: StageName, send: Callable[[], DeploymentResponse]) -> Any:
        return await call_stage(stage, send, self._available)

    async def embed(self, texts: list[str]) -> EmbeddedTexts | StageError:
        """The retriever's embeddings of `texts` (app.embeddings_api)."""
        try:
            return await self._call("retriever", lambda: self.retriever.embed.remote(texts))
        except REPLICA_LOST as exc:
            raise StageUnavailable("retriever", "unavailable", type(exc).__name__) from None


async def call_stage(
    stage: StageName,
    send: Callable[[], DeploymentResponse],
    available: Callable[[StageName], bool] = lambda stage: True,
) -> Any:
    """One handle call; a full queue or a stage with no running replica is
    StageUnavailable, a lost replica is raised as it came (for the caller to decide), and a
    call its caller abandons is cancelled on its replica."""
    if not available(stage):
        raise StageUnavailable(stage, "unavailable", "no running replica")
    response = None
    try:
        response = send()  # Serve may refuse the call as it is made (a full queue)
        return await response
    except asyncio.CancelledError:
        if response is not None:
            _cancel(response)
        raise
    except BackPressureError as exc:
        raise StageUnavailable(stage, "overloaded", str(exc)) from None


def _cancel(call: DeploymentResponse | DeploymentResponseGenerator) -> None:
    """Cancel a handle call, best effort. Serve's `cancel()` fetches the call's result to
    cancel it on its replica and so re-raises the call's own failure (a BackPressureError,
    an ActorDiedError): that must not replace the error being handled."""
    try:
        call.cancel()
    except Exception as exc:  # the failure is already being reported by the caller
        logger.debug("cancelling a failed call raised %s", type(exc).__name__)
