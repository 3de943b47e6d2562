"""Readiness from health, not from load: Serve's own view of each stage, refreshed in the
background and read from memory.

Serve health-checks every replica itself (`check_health`, outside the request queue) and
replaces the ones that fail. The monitor asks it, every `refresh_s`, how many replicas of each
stage are running; `/readyz` and admission read the last answer and never wait behind
requests. A stage with no running replica is `unavailable`. The service is ready while every
required stage has a replica; an optional stage (the compressor, which the pipeline can do
without) only marks it `degraded`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field

from pipeline.log import get_logger

logger = get_logger(__name__)

# stage name -> running replicas
ReplicaCounts = Mapping[str, int]
StatusSource = Callable[[], Awaitable[ReplicaCounts]]


@dataclass(frozen=True)
class ReadinessReport:
    ready: bool
    stages: dict[str, str]
    degraded: tuple[str, ...] = ()
    checked_at: float | None = None
    replicas: dict[str, int] = field(default_factory=dict)

    def body(self) -> dict:
        age_s = None if self.checked_at is None else round(time.monotonic() - self.checked_at, 1)
        return {
            "ready": self.ready,
            "stages": self.stages,
            "degraded": list(self.degraded),
            "replicas": self.replicas,
            "checked_s_ago": age_s,
        }


STARTING = ReadinessReport(False, {})


class ReadinessMonitor:
    def __init__(
        self,
        source: StatusSource,
        required: Collection[str],
        optional: Collection[str] = (),
        refresh_s: float = 2.0,
        timeout_s: float = 5.0,
    ) -> None:
        self._source = source
        self._required = tuple(required)
        self._optional = tuple(optional)
        self._refresh_s = refresh_s
        self._timeout_s = timeout_s
        self._report = STARTING
        self._task: asyncio.Task | None = None

    @property
    def report(self) -> ReadinessReport:
        return self._report

    def start(self) -> None:
        """Refresh in the background from now on (idempotent; needs a running loop)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def refresh(self) -> ReadinessReport:
        """Ask the source once. On failure keep the last report: a slow or restarting
        controller says nothing about whether the stages can serve."""
        try:
            counts = await asyncio.wait_for(self._source(), self._timeout_s)
        except Exception as exc:
            logger.warning("readiness refresh failed: %s", type(exc).__name__)
            return self._report
        self._report = self.judge(counts)
        return self._report

    def judge(self, counts: ReplicaCounts) -> ReadinessReport:
        stages = {
            name: "ready" if counts.get(name, 0) > 0 else "unavailable"
            for name in (*self._required, *self._optional)
        }
        ready = all(stages[name] == "ready" for name in self._required)
        degraded = tuple(name for name in self._optional if stages[name] != "ready")
        # Every count the source gave, the ingress's own included (informational).
        replicas = {name: int(counts.get(name, 0)) for name in (*stages, *counts)}
        return ReadinessReport(ready, stages, degraded, time.monotonic(), replicas)

    async def _run(self) -> None:
        while True:
            before = self._report.ready
            report = await self.refresh()
            if report.ready != before:
                logger.info("readiness: %s", report.stages)
            await asyncio.sleep(self._refresh_s)
