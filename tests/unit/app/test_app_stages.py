"""app.stages.HandleStages: Serve handles behind the `Stages` protocol, backpressure as 503.

The handles are fakes shaped like DeploymentHandle: these tests are about the mapping of
Serve's backpressure to the API's error; the real handles run in the integration tests.
"""

from __future__ import annotations

import asyncio

import pytest
from ray.serve.exceptions import BackPressureError

from app.errors import ApiError
from app.stages import HandleStages


def backpressure() -> BackPressureError:
    return BackPressureError(num_queued_requests=64, max_queued_requests=64)


class Method:
    def __init__(self, outcome) -> None:
        self.outcome = outcome
        self.args: list[tuple] = []

    def remote(self, *args):
        self.args.append(args)

        async def answer():
            if isinstance(self.outcome, Exception):
                raise self.outcome
            return self.outcome

        return answer()


class Stream:
    def __init__(self, events, fail_after: int | None = None) -> None:
        self.events = list(events)
        self.fail_after = fail_after
        self.cancelled = False

    def __aiter__(self):
        return self._iterate()

    async def _iterate(self):
        for i, event in enumerate(self.events):
            if i == self.fail_after:
                raise backpressure()
            yield event

    def cancel(self) -> None:
        self.cancelled = True


class StreamingHandle:
    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self.options_seen: dict = {}
        self.generate = self

    def options(self, **options):
        self.options_seen = options
        return self

    def remote(self, *args):
        self.args = args
        return self.stream


class Handle:
    def __init__(self, **methods) -> None:
        for name, method in methods.items():
            setattr(self, name, method)


def test_retrieve_and_prepare_pass_through_the_stage_answers():
    retriever = Handle(retrieve=Method("retrieval"))
    compressor = Handle(prepare=Method("prepared"))
    stages = HandleStages(retriever, compressor, Handle())

    assert asyncio.run(stages.retrieve("Q?", 3)) == "retrieval"
    assert asyncio.run(stages.prepare("Q?", "retrieval", "plan", 64)) == "prepared"
    assert retriever.retrieve.args == [("Q?", 3)]
    assert compressor.prepare.args == [("Q?", "retrieval", "plan", 64)]


@pytest.mark.parametrize("stage", ["retrieve", "prepare"])
def test_backpressure_becomes_503_overloaded_with_retry_after(stage):
    stages = HandleStages(
        Handle(retrieve=Method(backpressure())), Handle(prepare=Method(backpressure())), Handle()
    )
    call = stages.retrieve("Q?", 3) if stage == "retrieve" else stages.prepare("Q?", None, None, 1)

    with pytest.raises(ApiError) as excinfo:
        asyncio.run(call)

    assert (excinfo.value.status, excinfo.value.code) == (503, "overloaded")
    assert excinfo.value.headers == {"Retry-After": "1"}


async def drain(stages: HandleStages) -> list:
    return [event async for event in stages.generate([{"role": "user", "content": "Q"}], 8, 0.0)]


def test_generate_streams_the_events_and_cancels_the_stream_when_done():
    stream = Stream([{"type": "token", "text": "a"}, {"type": "finish", "reason": "stop"}])
    generator = StreamingHandle(stream)

    events = asyncio.run(drain(HandleStages(Handle(), Handle(), generator)))

    assert events == stream.events
    assert generator.options_seen == {"stream": True}
    assert generator.args == ([{"role": "user", "content": "Q"}], 8, 0.0)
    assert stream.cancelled


def test_generate_backpressure_becomes_503():
    stream = Stream([{"type": "token", "text": "a"}], fail_after=0)

    with pytest.raises(ApiError) as excinfo:
        asyncio.run(drain(HandleStages(Handle(), Handle(), StreamingHandle(stream))))

    assert excinfo.value.status == 503
    assert stream.cancelled
