"""app.pipeline: the stage sequence without HTTP, and the TPOT definition."""

from __future__ import annotations

import asyncio

import pytest

from app.errors import ApiError, StageError
from app.pipeline import (
    DoneEvent,
    ErrorEvent,
    RagPipeline,
    RagQuery,
    SourcesEvent,
    TokenEvent,
    tpot_ms,
)
from retrieval.compression import CompressionPlan
from retrieval.cost_model import CompressionDecision


@pytest.mark.parametrize(
    ("total", "ttft", "tokens", "expected"),
    [
        (1000.0, 200.0, 5, 200.0),
        (300.0, 100.0, 2, 200.0),
        (300.0, 100.0, 1, None),
        (300.0, 100.0, 0, None),
    ],
)
def test_tpot_is_time_after_the_first_token_per_later_token(total, ttft, tokens, expected):
    assert tpot_ms(total, ttft, tokens) == expected


def query() -> RagQuery:
    return RagQuery("Q?", 5, CompressionPlan("sentences"), 64, 0.0, "req-1")


async def collect(pipeline: RagPipeline) -> list:
    return [event async for event in pipeline.run(query())]


class RecordingMetrics:
    def __init__(self, fail: bool = False) -> None:
        self.results = []
        self.fail = fail

    def observe(self, result) -> None:
        self.results.append(result)
        if self.fail:
            raise RuntimeError("metrics backend down")


def test_events_come_in_order_and_metrics_see_the_result(stages):
    metrics = RecordingMetrics()

    events = asyncio.run(collect(RagPipeline(stages, metrics)))

    assert isinstance(events[0], SourcesEvent)
    assert all(isinstance(e, TokenEvent) for e in events[1:4])
    assert isinstance(events[-1], DoneEvent)
    result = events[-1].result
    assert result.id == "req-1"
    assert result.answer == "".join(e.text for e in events[1:4])
    assert result.finish_reason == "stop"
    assert result.usage.cached_prompt_tokens == 256
    assert result.timings_ms.ttft <= result.timings_ms.total
    assert metrics.results == [result]


def test_a_failing_metrics_sink_does_not_cost_the_answer(stages):
    events = asyncio.run(collect(RagPipeline(stages, RecordingMetrics(fail=True))))

    assert isinstance(events[-1], DoneEvent)


def test_missing_usage_gives_zero_counts_and_no_tpot(stages):
    stages.events = ({"type": "token", "text": "Hi"},)

    [*_, done] = asyncio.run(collect(RagPipeline(stages)))

    assert done.result.usage.prompt_tokens == 0
    assert done.result.usage.completion_tokens == 0
    assert done.result.tpot_ms is None
    assert done.result.finish_reason is None


def test_stage_error_is_raised_before_anything_is_yielded(stages):
    stages.retrieve_result = StageError(400, "bad", param="top_k")

    with pytest.raises(ApiError) as excinfo:
        asyncio.run(collect(RagPipeline(stages)))

    assert (excinfo.value.status, excinfo.value.param) == (400, "top_k")
    assert stages.called("prepare") == []


def test_error_after_the_first_token_is_an_event_that_ends_the_stream(stages):
    stages.events = (
        {"type": "token", "text": "Hi"},
        {"type": "error", "status": 400, "message": "stop", "error_type": "BadRequestError"},
        {"type": "token", "text": "never"},
    )

    events = asyncio.run(collect(RagPipeline(stages)))

    assert [type(e) for e in events] == [SourcesEvent, TokenEvent, ErrorEvent]
    assert (events[-1].error.status, events[-1].error.type) == (400, "BadRequestError")


def test_the_auto_decision_is_reported_with_the_requested_method(stages):
    decision = CompressionDecision(False, predicted_saving_ms=120.0, predicted_cost_ms=900.0)
    stages.decision = decision
    auto = RagQuery("Q?", 5, CompressionPlan("llmlingua", policy="auto"), 64, 0.0, "req-2")

    events = asyncio.run(_collect(RagPipeline(stages), auto))

    info = events[-1].result.compression_decision
    assert info is not None
    assert info.model_dump() == {
        "requested_method": "llmlingua",
        "compressed": False,
        "predicted_saving_ms": 120.0,
        "predicted_cost_ms": 900.0,
    }


def test_no_decision_is_reported_under_the_always_policy(stages):
    events = asyncio.run(collect(RagPipeline(stages)))

    assert events[-1].result.compression_decision is None


async def _collect(pipeline: RagPipeline, rag_query: RagQuery) -> list:
    return [event async for event in pipeline.run(rag_query)]
