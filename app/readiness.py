"""Readiness of every stage, asked with a short deadline and remembered for a few seconds."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from app.log import get_logger

logger = get_logger(__name__)

Probe = Callable[[], Awaitable[object]]


@dataclass(frozen=True)
class ReadinessReport:
    ready: bool
    stages: dict[str, str]


class Readiness:
    def __init__(
        self, probes: Mapping[str, Probe], timeout_s: float, remember_s: float = 5.0
    ) -> None:
        self._probes = dict(probes)
        self._timeout_s = timeout_s
        self._remember_s = remember_s
        self._last: ReadinessReport | None = None
        self._checked_at = 0.0

    async def check(self, fresh: bool = False) -> ReadinessReport:
        """Ask each stage; a stage that fails or does not answer in time is not ready."""
        recent = time.monotonic() - self._checked_at < self._remember_s
        if not fresh and self._last is not None and self._last.ready and recent:
            return self._last
        names = list(self._probes)
        results = await asyncio.gather(*(self._probe(self._probes[name]) for name in names))
        stages = dict(zip(names, results, strict=True))
        report = ReadinessReport(all(r == "ready" for r in results), stages)
        self._last, self._checked_at = report, time.monotonic()
        return report

    async def _probe(self, probe: Probe) -> str:
        try:
            await asyncio.wait_for(probe(), self._timeout_s)
        except TimeoutError:
            return "starting"
        except Exception as exc:  # a failing stage must read as not ready, whatever it raised
            logger.warning("readiness probe failed: %s", type(exc).__name__)
            return "unavailable"
        return "ready"
