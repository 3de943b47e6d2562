"""deployments.version_refresh: the refresh runs in the background, repeatedly, once started,
and a failing refresh does not stop it."""

from __future__ import annotations

import asyncio

from deployments.version_refresh import VersionRefresher


def test_refreshes_repeatedly_after_start_and_survives_a_failure():
    calls = []

    def refresh():
        calls.append(len(calls))
        if len(calls) == 1:
            raise OSError("a folder vanished")

    async def scenario():
        refresher = VersionRefresher(refresh, interval_s=0.01)
        await asyncio.sleep(0.05)
        assert calls == []  # nothing before the first start
        refresher.start()
        refresher.start()  # a second start adds no second loop
        await asyncio.sleep(0.2)

    asyncio.run(scenario())

    assert len(calls) >= 3
