"""Replica deaths under steady load, against the real application (the shared service,
two replicas of the retriever and of the compressor).

kill -9 of one retriever replica: nothing fails, the calls it held are sent again to the
other. kill -9 of every compressor replica: requests go on with the uncompressed context,
flagged `degraded`, until Serve has replaced them. Recovery times and
the other stages (the generator, its engine, a whole node) are measured by `make chaos`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

import httpx
import pytest

from bench import outcomes
from bench.loadgen import RequestSpec, make_client, run_load
from bench.questions import DEFAULT_QUESTIONS
from harness import processes

pytestmark = pytest.mark.reliability

QUESTIONS = DEFAULT_QUESTIONS[:4]


def steady_load(service, count: int, kill_after_s: float, victim, max_tokens: int = 8) -> list:
    """`count` requests from 4 clients; `victim()` (a pid) is killed `kill_after_s` in."""

    async def run():
        async def strike():
            await asyncio.sleep(kill_after_s)
            processes.kill(victim())

        async with make_client(
            service.base_url, api_key=service.api_key, request_timeout_s=120
        ) as client:
            specs = [
                RequestSpec("rag", f"{QUESTIONS[i % 4]} ({i})", max_tokens=max_tokens)
                for i in range(count)
            ]
            striker = asyncio.create_task(strike())
            records = await run_load(client, specs, rate_per_s=None, concurrency=4, seed=0)
            await striker
            return records

    return asyncio.run(run())


def wait_for_replicas(service, stage: str, count: int, timeout_s: float = 240) -> float:
    started = time.perf_counter()
    while time.perf_counter() - started < timeout_s:
        body = httpx.get(f"{service.base_url}/readyz", timeout=10).json()
        if body["replicas"].get(stage, 0) >= count:
            return time.perf_counter() - started
        time.sleep(0.5)
    pytest.fail(f"{stage} did not get back to {count} replicas in {timeout_s} s")


def test_killing_one_of_two_retrievers_under_load_fails_nothing(service):
    victims = processes.replica_pids(service.pid, "Retriever")
    assert len(victims) == 2

    records = steady_load(service, 24, kill_after_s=2, victim=lambda: victims[0])

    tally = outcomes.counts(records)
    assert tally["succeeded"] == 24, (tally, outcomes.failures(records))
    assert victims[0] not in processes.replica_pids(service.pid, "Retriever")
    wait_for_replicas(service, "retriever", 2)


def asked_while_down(service, stage: str, ask: dict, found: list, stop: threading.Event) -> None:
    """Once /readyz says `stage` has no running replica, ask `ask` and keep the response
    body in `found` (the calls of a steady load may all be waiting in Serve's queue then)."""
    while not stop.is_set():
        with contextlib.suppress(httpx.HTTPError, ValueError):
            ready = httpx.get(f"{service.base_url}/readyz", timeout=10).json()
            if ready["replicas"].get(stage, 0) == 0:
                response = httpx.post(
                    f"{service.base_url}/v1/rag/query", json=ask, headers=service.headers,
                    timeout=120,
                )  # fmt: skip
                found.append((response.status_code, response.json()))
                return
        time.sleep(0.1)


def test_killing_every_compressor_degrades_then_recovers(service):
    victims = processes.replica_pids(service.pid, "Compressor")
    assert len(victims) == 2
    ask = {"question": QUESTIONS[0], "max_tokens": 8}
    found: list = []
    stop = threading.Event()
    probe = threading.Thread(
        target=asked_while_down, args=(service, "compressor", ask, found, stop)
    )

    def strike() -> int:
        for pid in victims[1:]:
            processes.kill(pid)
        probe.start()
        return victims[0]

    try:
        records = steady_load(service, 24, kill_after_s=1, victim=strike)
        probe.join(timeout=120)
    finally:
        stop.set()

    tally = outcomes.counts(records)
    assert tally["failed"] == tally["hung"] == 0, outcomes.failures(records)
    assert tally["succeeded"] + tally["refused"] == 24
    # Asked while no compressor ran: answered with the uncompressed context, saying why.
    assert found, "the service never reported the compressor down"
    [(status, degraded)] = found
    assert status == 200, degraded
    assert degraded["degraded"] is not None and degraded["degraded"].startswith("compressor_")
    assert degraded["compression_method"] == "none"
    usage = degraded["usage"]
    assert usage["context_tokens_after"] <= usage["context_tokens_before"]
    wait_for_replicas(service, "compressor", len(victims))
    deadline = time.perf_counter() + 60
    while True:  # the ingress learns of the new replicas within a readiness refresh
        body = httpx.post(
            f"{service.base_url}/v1/rag/query", json=ask, headers=service.headers, timeout=120
        ).json()
        if body["degraded"] is None or time.perf_counter() > deadline:
            break
        time.sleep(0.5)
    assert body["degraded"] is None and body["compression_method"] == "sentences"
