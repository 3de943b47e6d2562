"""app.readiness: stage probes with a deadline, and remembering a positive answer."""

from __future__ import annotations

import asyncio

from app.readiness import Readiness, ReadinessReport


class CountingProbe:
    def __init__(self, outcome: object = "ok", delay_s: float = 0.0) -> None:
        self.calls = 0
        self.outcome = outcome
        self.delay_s = delay_s

    async def __call__(self) -> object:
        self.calls += 1
        await asyncio.sleep(self.delay_s)
        if isinstance(self.outcome, Exception):
            raise self.outcome
        return self.outcome


def test_every_stage_ready_is_ready():
    readiness = Readiness({"a": CountingProbe(), "b": CountingProbe()}, timeout_s=1)

    report = asyncio.run(readiness.check())

    assert report == ReadinessReport(True, {"a": "ready", "b": "ready"})


def test_slow_stage_is_starting_and_failing_stage_is_unavailable():
    readiness = Readiness(
        {
            "fast": CountingProbe(),
            "slow": CountingProbe(delay_s=5),
            "broken": CountingProbe(RuntimeError("down")),
        },
        timeout_s=0.05,
    )

    report = asyncio.run(readiness.check())

    assert report == ReadinessReport(
        False, {"fast": "ready", "slow": "starting", "broken": "unavailable"}
    )


def test_a_positive_result_is_remembered_and_fresh_asks_again():
    probe = CountingProbe()
    readiness = Readiness({"a": probe}, timeout_s=1, remember_s=60)

    async def scenario() -> list[ReadinessReport]:
        return [
            await readiness.check(),
            await readiness.check(),
            await readiness.check(fresh=True),
        ]

    reports = asyncio.run(scenario())

    assert all(r.ready for r in reports)
    assert probe.calls == 2


def test_a_negative_result_is_not_remembered():
    probe = CountingProbe(RuntimeError("not yet"))
    readiness = Readiness({"a": probe}, timeout_s=1, remember_s=60)

    async def scenario() -> tuple[ReadinessReport, ReadinessReport]:
        first = await readiness.check()
        probe.outcome = "ok"
        return first, await readiness.check()

    first, second = asyncio.run(scenario())

    assert (first.ready, second.ready) == (False, True)
    assert probe.calls == 2


def test_a_remembered_result_expires():
    probe = CountingProbe()
    readiness = Readiness({"a": probe}, timeout_s=1, remember_s=0)

    async def scenario() -> None:
        await readiness.check()
        await readiness.check()

    asyncio.run(scenario())

    assert probe.calls == 2
