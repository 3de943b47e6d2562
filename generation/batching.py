"""Send a token stream across a Ray hop in batches: the first event at once, then whatever
has accumulated, at most every `interval_ms`.

Each item a Serve streaming call yields is its own Ray object with a fixed cost; one per token
makes that cost per token (ray-project/ray#52745). Batching bounds it per interval, and
sending the first event at once keeps it out of TTFT.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TypeVar

T = TypeVar("T")


async def batch_events(
    source: AsyncGenerator[T, None], interval_ms: float
) -> AsyncIterator[list[T]]:
    """Yield lists of the items of `source`: the first as soon as it arrives, each later one
    no sooner than `interval_ms` after the previous, the last as soon as `source` ends.

    An exception from `source` is raised after the items that came before it. Closing this
    generator cancels the read of `source` (which aborts the request in the engine).
    """
    if interval_ms <= 0:
        async with contextlib.aclosing(source):
            async for item in source:
                yield [item]
        return

    interval_s = interval_ms / 1000
    loop = asyncio.get_running_loop()
    pending: list[T] = []
    arrived = asyncio.Event()
    finished = asyncio.Event()
    failure: list[BaseException] = []

    async def read() -> None:
        try:
            async for item in source:
                pending.append(item)
                arrived.set()
        except Exception as exc:  # handed to the consumer, after what came before it
            failure.append(exc)
        finally:
            finished.set()
            arrived.set()

    reader = asyncio.create_task(read())
    last_sent: float | None = None
    try:
        while True:
            await arrived.wait()
            if last_sent is not None and not finished.is_set():
                remaining = interval_s - (loop.time() - last_sent)
                if remaining > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(finished.wait(), remaining)
            arrived.clear()
            if pending:
                batch = pending[:]
                pending.clear()
                yield batch
                last_sent = loop.time()
            if finished.is_set() and not pending:
                if failure:
                    raise failure[0]
                return
    finally:
        if not reader.done():
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
