"""deployments.handles.HandleStages: Serve handles behind the `Stages` protocol.

The handles are fakes shaped like DeploymentHandle (`handle.method.remote(...)` gives an
awaitable response with `cancel()`; `handle.options(stream=True)` gives a streaming one):
these tests are about how Ray's failures become the pipeline's, which calls are sent again,
and which are not sent at all; the real handles run in the integration tests.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, TypeVar

import pytest
from ray.exceptions import ActorDiedError, RayActorError
from ray.serve._private.common import DeploymentID
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError

from deployments.handles import HandleStages
from pipeline.messages import (
    DEFAULT_SEARCH,
    FinishEvent,
    GenerationRequest,
    StageError,
    TokenEvent,
    TokenUsage,
)
from pipeline.stages import StageUnavailable

REQUEST = GenerationRequest([{"role": "user", "content": "Q"}], 8, 0.0, "req-1")
FINISH = FinishEvent("stop", TokenUsage(3, 1, 0))

T = TypeVar("T")


def bounded(coroutine: Coroutine[Any, Any, T], timeout_s: float = 5.0) -> T:
    """Run `coroutine`; one that hangs (a lost cancellation) fails the test instead, even
    when it swallows the cancellation that ends the wait."""
    started = time.monotonic()
    result = asyncio.run(asyncio.wait_for(coroutine, timeout_s))
    assert time.monotonic() - started < timeout_s, "hung until cancelled"
    return result


def backpressure() -> BackPressureError:
    return BackPressureError(num_queued_requests=64, max_queued_requests=64)


def unavailable_deployment() -> DeploymentUnavailableError:
    return DeploymentUnavailableError(DeploymentID(name="Retriever", app_name="rag"))


REPLICA_LOST: list[Callable[[], BaseException]] = [
    ActorDiedError,
    RayActorError,
    unavailable_deployment,
]


BLOCK = object()  # an outcome: the replica has not answered yet (until cancelled)


class Response:
    """Like DeploymentResponse: awaited once for the answer; `cancel()` cancels the call."""

    def __init__(self, outcome: Any) -> None:
        self.outcome = outcome
        self.cancelled = False

    def __await__(self):
        return self._answer().__await__()

    async def _answer(self) -> Any:
        if self.outcome is BLOCK:
            await asyncio.Event().wait()
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome

    def cancel(self) -> None:
        self.cancelled = True


class Method:
    """A handle method; call i answers outcomes[i] (the last one repeats)."""

    def __init__(self, *outcomes: Any) -> None:
        self.outcomes = outcomes
        self.args: list[tuple] = []
        self.responses: list[Response] = []

    def remote(self, *args: Any) -> Response:
        self.args.append(args)
        response = Response(self.outcomes[min(len(self.args), len(self.outcomes)) - 1])
        self.responses.append(response)
        return response


class Handle:
    def __init__(self, **methods: Method) -> None:
        for name, method in methods.items():
            setattr(self, name, method)


class Stream:
    """Like DeploymentResponseGenerator: async-iterable batches; `cancel()`.

    `script`: a list is a batch; an exception is raised; BLOCK waits until cancelled."""

    def __init__(self, *script: Any) -> None:
        self.script = script
        self.cancelled = False
        self.blocked = asyncio.Event()

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Any]:
        for step in self.script:
            if isinstance(step, BaseException):
                raise step
            if step is BLOCK:
                self.blocked.set()
                await asyncio.Event().wait()
            yield step

    def cancel(self) -> None:
        self.cancelled = True


class StreamingHandle:
    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self.options_seen: list[dict] = []
        self.calls: list[tuple] = []
        self.generate = self

    def options(self, **options: Any) -> StreamingHandle:
        self.options_seen.append(options)
        return self

    def remote(self, *args: Any) -> Stream:
        self.calls.append(args)
        return self.stream


class Readiness:
    """The ingress's view of which stages have a running replica; records each question.

    `down`: stages shown without a replica; `down_after`: a stage shown down from its
    n-th question on (a replica that died and was not replaced yet)."""

    def __init__(self, *down: str, down_after: dict[str, int] | None = None) -> None:
        self.down = set(down)
        self.down_after = down_after or {}
        self.asked: list[str] = []

    def __call__(self, stage: str) -> bool:
        self.asked.append(stage)
        if stage in self.down_after and self.asked.count(stage) >= self.down_after[stage]:
            return False
        return stage not in self.down


def stages_with(
    retrieve: Method | None = None,
    prepare: Method | None = None,
    generator: StreamingHandle | None = None,
    available: Readiness | None = None,
    retry_timeout_s: float = 10.0,
) -> HandleStages:
    return HandleStages(
        Handle(retrieve=retrieve or Method("retrieval")),  # type: ignore[arg-type]
        Handle(prepare=prepare or Method("prepared")),  # type: ignore[arg-type]
        generator or StreamingHandle(Stream()),  # type: ignore[arg-type]
        available or Readiness(),
        retry_timeout_s=retry_timeout_s,
    )


def call(stages: HandleStages, stage: str) -> Any:
    if stage == "retriever":
        return stages.retrieve("Q?", 3)
    return stages.prepare("Q?", "retrieval", "plan", 64)  # type: ignore[arg-type]


def method_of(stages: HandleStages, stage: str) -> Method:
    if stage == "retriever":
        return stages.retriever.retrieve  # type: ignore[attr-defined]
    return stages.compressor.prepare  # type: ignore[attr-defined]


def stages_answering(stage: str, *outcomes: Any, **options: Any) -> HandleStages:
    method = Method(*outcomes)
    if stage == "retriever":
        return stages_with(retrieve=method, **options)
    return stages_with(prepare=method, **options)


async def drain(stages: HandleStages) -> list:
    return [batch async for batch in stages.generate(REQUEST)]


# --- retrieve and prepare -----------------------------------------------------------------


def test_retrieve_and_prepare_pass_through_the_stage_answers():
    stages = stages_with()

    assert bounded(stages.retrieve("Q?", 3)) == "retrieval"
    assert bounded(stages.prepare("Q?", "retrieval", "plan", 64)) == "prepared"  # type: ignore[arg-type]
    assert method_of(stages, "retriever").args == [("Q?", 3, DEFAULT_SEARCH)]
    assert method_of(stages, "compressor").args == [("Q?", "retrieval", "plan", 64)]


@pytest.mark.parametrize("stage", ["retriever", "compressor"])
def test_a_stage_refusal_is_returned_as_a_value_not_retried(stage):
    refusal = StageError(400, "bad top_k", param="top_k")
    stages = stages_answering(stage, refusal)

    assert bounded(call(stages, stage)) == refusal
    assert len(method_of(stages, stage).args) == 1


@pytest.mark.parametrize("stage", ["retriever", "compressor"])
def test_backpressure_is_the_stage_overloaded_and_not_retried(stage):
    stages = stages_answering(stage, backpressure(), "late answer")

    with pytest.raises(StageUnavailable) as excinfo:
        bounded(call(stages, stage))

    assert (excinfo.value.stage, excinfo.value.kind) == (stage, "overloaded")
    assert len(method_of(stages, stage).args) == 1


@pytest.mark.parametrize("stage", ["retriever", "compressor"])
def test_a_stage_shown_without_a_replica_is_not_called(stage):
    stages = stages_answering(stage, "answer", available=Readiness(stage))

    with pytest.raises(StageUnavailable) as excinfo:
        bounded(call(stages, stage))

    assert (excinfo.value.stage, excinfo.value.kind) == (stage, "unavailable")
    assert excinfo.value.detail == "no running replica"
    assert method_of(stages, stage).args == []


def test_only_the_stage_without_a_replica_is_refused():
    stages = stages_with(available=Readiness("compressor"))

    assert bounded(call(stages, "retriever")) == "retrieval"


@pytest.mark.parametrize("lost", REPLICA_LOST)
def test_a_retrieval_whose_replica_was_lost_is_sent_once_more(lost):
    stages = stages_answering("retriever", lost(), "answer")

    assert bounded(call(stages, "retriever")) == "answer"
    method = method_of(stages, "retriever")
    assert method.args == [("Q?", 3, DEFAULT_SEARCH)] * 2


@pytest.mark.parametrize("lost", REPLICA_LOST)
def test_a_retrieval_lost_twice_is_the_retriever_unavailable(lost):
    stages = stages_answering("retriever", lost(), lost(), "never asked")

    with pytest.raises(StageUnavailable) as excinfo:
        bounded(call(stages, "retriever"))

    assert (excinfo.value.stage, excinfo.value.kind) == ("retriever", "unavailable")
    assert excinfo.value.detail == type(lost()).__name__
    assert len(method_of(stages, "retriever").args) == 2


def test_a_lost_retrieval_is_not_sent_again_once_no_replica_is_running():
    readiness = Readiness(down_after={"retriever": 2})
    stages = stages_answering("retriever", ActorDiedError(), "answer", available=readiness)

    with pytest.raises(StageUnavailable) as excinfo:
        bounded(call(stages, "retriever"))

    assert (excinfo.value.stage, excinfo.value.kind) == ("retriever", "unavailable")
    assert excinfo.value.detail == "ActorDiedError"
    assert len(method_of(stages, "retriever").args) == 1


def test_a_retry_that_takes_too_long_is_cancelled_and_the_retriever_unavailable():
    stages = stages_answering("retriever", ActorDiedError(), BLOCK, retry_timeout_s=0.01)

    with pytest.raises(StageUnavailable) as excinfo:
        bounded(call(stages, "retriever"))

    assert (excinfo.value.stage, excinfo.value.kind) == ("retriever", "unavailable")
    assert excinfo.value.detail == "TimeoutError"
    _, retry = method_of(stages, "retriever").responses
    assert retry.cancelled


def test_a_retry_refused_by_backpressure_is_the_retriever_overloaded():
    stages = stages_answering("retriever", ActorDiedError(), backpressure())

    with pytest.raises(StageUnavailable) as excinfo:
        bounded(call(stages, "retriever"))

    assert (excinfo.value.stage, excinfo.value.kind) == ("retriever", "overloaded")


@pytest.mark.parametrize("lost", REPLICA_LOST)
def test_a_preparation_whose_replica_was_lost_is_not_retried(lost):
    # The pipeline falls back to the uncompressed context instead.
    stages = stages_answering("compressor", lost(), "answer")

    with pytest.raises(StageUnavailable) as excinfo:
        bounded(call(stages, "compressor"))

    assert (excinfo.value.stage, excinfo.value.kind) == ("compressor", "unavailable")
    assert excinfo.value.detail == type(lost()).__name__
    assert len(method_of(stages, "compressor").args) == 1


@pytest.mark.parametrize("stage", ["retriever", "compressor"])
def test_an_application_error_propagates_without_a_retry(stage):
    stages = stages_answering(stage, RuntimeError("index corrupt"), "answer")

    with pytest.raises(RuntimeError, match="index corrupt"):
        bounded(call(stages, stage))

    assert len(method_of(stages, stage).args) == 1


@pytest.mark.parametrize("stage", ["retriever", "compressor"])
def test_a_cancelled_caller_cancels_the_remote_call(stage):
    stages = stages_answering(stage, BLOCK)
    method = method_of(stages, stage)

    async def cancel_while_waiting() -> None:
        task = asyncio.create_task(call(stages, stage))
        while not method.responses:
            await asyncio.sleep(0)
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    bounded(cancel_while_waiting())

    [response] = method.responses
    assert response.cancelled


def test_a_cancelled_caller_cancels_the_retried_call_too():
    stages = stages_answering("retriever", ActorDiedError(), BLOCK)
    method = method_of(stages, "retriever")

    async def cancel_during_the_retry() -> None:
        task = asyncio.create_task(call(stages, "retriever"))
        while len(method.responses) < 2:
            await asyncio.sleep(0)
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    bounded(cancel_during_the_retry())

    assert method.responses[1].cancelled


def test_a_caller_timeout_cancels_the_remote_call():
    stages = stages_answering("compressor", BLOCK)

    async def with_timeout() -> None:
        async with asyncio.timeout(0.01):
            await call(stages, "compressor")

    with pytest.raises(TimeoutError):
        bounded(with_timeout())

    [response] = method_of(stages, "compressor").responses
    assert response.cancelled


def test_an_answered_call_is_not_cancelled():
    stages = stages_with()

    bounded(call(stages, "retriever"))

    assert not method_of(stages, "retriever").responses[0].cancelled


# --- generate -------------------------------------------------------------------------------


def test_generate_streams_the_batches_and_cancels_the_stream_when_done():
    batches = ([TokenEvent("a")], [TokenEvent("b"), FINISH])
    stream = Stream(*batches)
    generator = StreamingHandle(stream)

    received = bounded(drain(stages_with(generator=generator)))

    assert received == list(batches)
    assert generator.options_seen == [{"stream": True}]
    assert generator.calls == [(REQUEST,)]
    assert stream.cancelled


def test_a_generator_shown_without_a_replica_is_not_called():
    generator = StreamingHandle(Stream([FINISH]))

    with pytest.raises(StageUnavailable) as excinfo:
        bounded(drain(stages_with(generator=generator, available=Readiness("generator"))))

    assert (excinfo.value.stage, excinfo.value.kind) == ("generator", "unavailable")
    assert generator.calls == []


def test_generate_backpressure_is_the_generator_overloaded():
    stream = Stream(backpressure())
    generator = StreamingHandle(stream)

    with pytest.raises(StageUnavailable) as excinfo:
        bounded(drain(stages_with(generator=generator)))

    assert (excinfo.value.stage, excinfo.value.kind) == ("generator", "overloaded")
    assert stream.cancelled


class ReraisingStream(Stream):
    """Serve's DeploymentResponseGenerator.cancel() fetches the call's result and so
    re-raises its failure (seen: a BackPressureError answered as Serve's plain-text 503)."""

    def cancel(self) -> None:
        super().cancel()
        for step in self.script:
            if isinstance(step, BaseException):
                raise step


@pytest.mark.parametrize("failure", [backpressure, *REPLICA_LOST])
def test_a_cancel_that_reraises_the_failure_does_not_replace_the_stage_error(failure):
    stream = ReraisingStream(failure())

    with pytest.raises(StageUnavailable) as excinfo:
        bounded(drain(stages_with(generator=StreamingHandle(stream))))

    assert excinfo.value.stage == "generator"
    assert stream.cancelled


@pytest.mark.parametrize("lost", REPLICA_LOST)
def test_a_lost_generator_replica_is_unavailable_and_never_retried(lost):
    stream = Stream([TokenEvent("a")], lost())
    generator = StreamingHandle(stream)
    received: list = []

    async def consume() -> None:
        async for batch in stages_with(generator=generator).generate(REQUEST):
            received.append(batch)

    with pytest.raises(StageUnavailable) as excinfo:
        bounded(consume())

    assert (excinfo.value.stage, excinfo.value.kind) == ("generator", "unavailable")
    assert excinfo.value.detail == type(lost()).__name__
    assert received == [[TokenEvent("a")]]
    assert len(generator.calls) == 1
    assert stream.cancelled


def test_another_generate_error_propagates_and_the_stream_is_cancelled():
    stream = Stream(RuntimeError("serialization failed"))

    with pytest.raises(RuntimeError, match="serialization failed"):
        bounded(drain(stages_with(generator=StreamingHandle(stream))))

    assert stream.cancelled


def test_a_consumer_that_stops_early_cancels_the_stream():
    stream = Stream([TokenEvent("a")], [TokenEvent("b")], [FINISH])

    async def first_batch_only() -> None:
        batches = stages_with(generator=StreamingHandle(stream)).generate(REQUEST)
        await anext(batches)
        await batches.aclose()  # type: ignore[attr-defined]

    bounded(first_batch_only())

    assert stream.cancelled


def test_a_cancelled_consumer_cancels_the_stream():
    stream = Stream([TokenEvent("a")], BLOCK, [FINISH])

    async def cancel_while_streaming() -> None:
        task = asyncio.create_task(drain(stages_with(generator=StreamingHandle(stream))))
        await stream.blocked.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    bounded(cancel_while_streaming())

    assert stream.cancelled
