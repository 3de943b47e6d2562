"""generation.batching.batch_events: the first item at once, later ones grouped per interval,
nothing lost or reordered, errors after the items before them, and cancellation upstream."""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Any, TypeVar

import pytest

from generation.batching import batch_events

T = TypeVar("T")


def bounded(coroutine: Coroutine[Any, Any, T], timeout_s: float = 5.0) -> T:
    """Run `coroutine`; one that hangs (a lost cancellation) fails the test instead, even
    when it swallows the cancellation that ends the wait."""
    started = time.monotonic()
    result = asyncio.run(asyncio.wait_for(coroutine, timeout_s))
    assert time.monotonic() - started < timeout_s, "hung until cancelled"
    return result


async def instant(items: list[int], error: Exception | None = None) -> AsyncIterator[int]:
    for item in items:
        yield item
    if error is not None:
        raise error


async def paced(count: int, every_s: float) -> AsyncIterator[int]:
    for item in range(count):
        yield item
        await asyncio.sleep(every_s)


async def collect(source: AsyncIterator[int], interval_ms: float) -> list[list[int]]:
    return [batch async for batch in batch_events(source, interval_ms)]


def test_the_first_item_comes_at_once_whatever_the_interval():
    async def scenario() -> tuple[list[int], float]:
        gate = asyncio.Event()

        async def source() -> AsyncIterator[int]:
            yield 0
            await gate.wait()  # nothing more until the test is done
            yield 1

        loop = asyncio.get_running_loop()
        batches = batch_events(source(), interval_ms=10_000)
        started = loop.time()
        first = await asyncio.wait_for(anext(batches), timeout=1.0)
        elapsed = loop.time() - started
        await batches.aclose()
        return first, elapsed

    first, elapsed = bounded(scenario())

    assert first == [0]
    assert elapsed < 0.05


def test_later_items_are_grouped_per_interval_without_loss_or_reordering():
    interval_s = 0.03

    async def scenario() -> tuple[list[list[int]], list[float], float]:
        loop = asyncio.get_running_loop()
        started = loop.time()
        batches, received = [], []
        async for batch in batch_events(paced(40, every_s=0.002), interval_s * 1000):
            batches.append(batch)
            received.append(loop.time())
        return batches, received, loop.time() - started

    batches, received, elapsed = bounded(scenario())

    assert [item for batch in batches for item in batch] == list(range(40))
    assert batches[0] == [0]
    assert all(batches), "no empty batch"
    assert 2 <= len(batches) <= math.ceil(elapsed / interval_s) + 2
    assert len(batches) < 40
    # Each batch but the last (sent when the source ended) waited out the interval.
    gaps = [later - earlier for earlier, later in itertools.pairwise(received)]
    assert all(gap >= interval_s * 0.9 for gap in gaps[:-1]), gaps


@pytest.mark.parametrize("interval_ms", [0, -5])
def test_no_interval_sends_each_item_on_its_own(interval_ms):
    batches = bounded(collect(instant([1, 2, 3]), interval_ms))

    assert batches == [[1], [2], [3]]


def test_an_instant_source_still_arrives_whole_and_in_order():
    batches = bounded(collect(instant(list(range(100))), 50))

    assert [item for batch in batches for item in batch] == list(range(100))
    assert len(batches) <= 2


@pytest.mark.parametrize("ends_after_s", [0.0, 0.005])
def test_the_last_batch_is_not_held_back_by_the_interval_when_the_source_ends(ends_after_s):
    async def scenario() -> list[list[int]]:
        async def source() -> AsyncIterator[int]:
            yield 0
            await asyncio.sleep(0.005)
            yield 1
            await asyncio.sleep(ends_after_s)  # then the source ends, early in a 2 s interval

        # A batch held for the interval would miss this deadline by far.
        return await asyncio.wait_for(collect(source(), interval_ms=2000), timeout=0.5)

    assert bounded(scenario()) == [[0], [1]]


@pytest.mark.parametrize("interval_ms", [0, 10])
def test_an_error_from_the_source_comes_after_the_items_before_it(interval_ms):
    async def scenario() -> tuple[list[int], BaseException | None]:
        seen: list[int] = []
        try:
            async for batch in batch_events(
                instant([1, 2, 3], error=RuntimeError("engine failed")), interval_ms
            ):
                seen.extend(batch)
        except RuntimeError as exc:
            return seen, exc
        return seen, None

    seen, error = bounded(scenario())

    assert seen == [1, 2, 3]
    assert isinstance(error, RuntimeError) and str(error) == "engine failed"


@pytest.mark.parametrize("interval_ms", [0, 10])
def test_an_error_before_any_item_is_raised_without_a_batch(interval_ms):
    with pytest.raises(RuntimeError, match="refused"):
        bounded(collect(instant([], error=RuntimeError("refused")), interval_ms))


def endless_source(log: list[str]) -> AsyncIterator[int]:
    async def endless() -> AsyncIterator[int]:
        item = 0
        try:
            while True:
                yield item
                item += 1
                await asyncio.sleep(0.002)
        except asyncio.CancelledError:
            log.append("cancelled")
            raise
        finally:
            log.append("closed")

    return endless()


def test_closing_the_consumer_early_cancels_the_source_at_once():
    async def scenario() -> tuple[list[int], list[str]]:
        log: list[str] = []
        batches = batch_events(endless_source(log), 30)
        seen = [*await anext(batches), *await anext(batches)]
        await batches.aclose()
        return seen, list(log)  # what had happened by the time aclose() returned

    seen, log = bounded(scenario())

    assert seen[:2] == [0, 1]
    assert log == ["cancelled", "closed"]


def test_without_an_interval_closing_the_consumer_closes_the_source_soon():
    # Without an interval there is no read in flight to cancel: the source is left at its
    # yield and closed by asyncio's async-generator finalizer once nothing refers to it.
    async def scenario() -> tuple[list[int], list[str]]:
        log: list[str] = []
        batches = batch_events(endless_source(log), 0)
        seen = [*await anext(batches), *await anext(batches)]
        await batches.aclose()
        for _ in range(5):
            if log:
                break
            await asyncio.sleep(0)
        return seen, log

    seen, log = bounded(scenario())

    assert seen == [0, 1]
    assert log == ["closed"]


def test_a_cancelled_consumer_cancels_the_read_of_the_source():
    async def scenario() -> list[str]:
        log: list[str] = []
        reading = asyncio.Event()

        async def stalled() -> AsyncIterator[int]:
            try:
                yield 0
                reading.set()
                await asyncio.Event().wait()  # an engine that has not answered yet
                yield 1
            except asyncio.CancelledError:
                log.append("cancelled")
                raise
            finally:
                log.append("closed")

        async def consume() -> None:
            async for _ in batch_events(stalled(), 30):
                pass

        task = asyncio.create_task(consume())
        await reading.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return log

    assert bounded(scenario()) == ["cancelled", "closed"]
