"""Opening new collection versions off the query path, in each retriever and compressor
replica: a catalog's `refresh()` in a thread every `interval_s`.

Queries read CURRENT themselves (corpus.catalog), so this changes no answer; it only
spares the first query after a publish the wait for the new version to open. It starts
with the first query that names a collection: a replica that serves only the shipped
corpus polls nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from pipeline.log import get_logger

logger = get_logger(__name__)

# How often each replica looks for a new version of the collections it serves.
VERSION_REFRESH_S = 0.5


class VersionRefresher:
    def __init__(self, refresh: Callable[[], object], interval_s: float) -> None:
        self._refresh = refresh
        self._interval_s = interval_s
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        """Begin refreshing, once, in the running event loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await asyncio.to_thread(self._refresh)
            except Exception:  # a failed refresh leaves the query path to open it
                logger.exception("refreshing collection versions failed; retrying")
