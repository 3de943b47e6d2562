"""app.readiness: readiness is read from Serve's replica counts, refreshed in the background,
and never waits on a stage."""

from __future__ import annotations

import asyncio

from app.readiness import ReadinessMonitor


def monitor(source, refresh_s: float = 3600, timeout_s: float = 0.2) -> ReadinessMonitor:
    return ReadinessMonitor(
        source,
        required=("retriever", "generator"),
        optional=("compressor",),
        refresh_s=refresh_s,
        timeout_s=timeout_s,
    )


def counts(**replicas: int):
    async def source():
        return replicas

    return source


def test_not_ready_until_the_first_answer():
    report = monitor(counts(retriever=1, generator=1, compressor=1)).report

    assert (report.ready, report.stages) == (False, {})


def test_every_stage_running_is_ready():
    report = asyncio.run(monitor(counts(retriever=2, generator=1, compressor=1)).refresh())

    assert report.ready
    assert report.stages == {"retriever": "ready", "generator": "ready", "compressor": "ready"}
    assert report.replicas == {"retriever": 2, "generator": 1, "compressor": 1}
    assert report.degraded == ()


def test_a_required_stage_without_replicas_is_not_ready():
    report = asyncio.run(monitor(counts(retriever=1, generator=0, compressor=1)).refresh())

    assert not report.ready
    assert report.stages["generator"] == "unavailable"


def test_a_stage_missing_from_the_status_is_unavailable():
    report = asyncio.run(monitor(counts(generator=1, compressor=1)).refresh())

    assert not report.ready
    assert report.stages["retriever"] == "unavailable"


def test_an_optional_stage_down_only_degrades():
    report = asyncio.run(monitor(counts(retriever=1, generator=1, compressor=0)).refresh())

    assert report.ready
    assert report.degraded == ("compressor",)
    assert report.body()["degraded"] == ["compressor"]


def test_a_failing_or_slow_source_keeps_the_last_report():
    answers = [{"retriever": 1, "generator": 1, "compressor": 1}]

    async def flaky():
        if not answers:
            raise ConnectionError("controller restarting")
        return answers.pop()

    async def main():
        watched = monitor(flaky)
        first = await watched.refresh()
        second = await watched.refresh()  # raises inside: the last report stands
        return first, second

    first, second = asyncio.run(main())
    assert first.ready and second is first

    async def never():
        await asyncio.sleep(30)

    slow = monitor(never, timeout_s=0.05)
    assert asyncio.run(slow.refresh()).ready is False  # nothing known yet: still starting


def test_background_refresh_follows_the_source_without_being_asked():
    replicas = {"retriever": 1, "generator": 1, "compressor": 1}

    async def source():
        return dict(replicas)

    async def main():
        watched = monitor(source, refresh_s=0.01)
        watched.start()
        await asyncio.sleep(0.05)
        before = watched.report.ready
        replicas["generator"] = 0
        await asyncio.sleep(0.05)
        after = watched.report.ready
        await watched.stop()
        return before, after

    assert asyncio.run(main()) == (True, False)
