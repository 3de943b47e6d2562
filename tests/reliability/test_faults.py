"""Replica deaths under steady load, against the real application.

kill -9 of a retriever replica (two are running): nothing fails, the calls it held are
sent again to the other. kill -9 of the only compressor: requests go on with the
uncompressed context, flagged `degraded`, until Serve has replaced it. Recovery times and
the other stages (the generator, its engine, a whole node) are measured by `make chaos`.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from bench import faults, outcomes
from bench.loadgen import RequestSpec, make_client, run_load
from bench.questions import DEFAULT_QUESTIONS

pytestmark = pytest.mark.reliability

QUESTIONS = DEFAULT_QUESTIONS[:4]


@pytest.fixture(scope="module")
def service(tmp_path_factory, launch):
    overrides = {
        "retriever.deployment.num_replicas": 2,
        "retriever.deployment.num_cpus": 0.1,
        "generator.default_max_tokens": 16,
    }
    with launch(tmp_path_factory, overrides) as started:
        yield started


def steady_load(service, count: int, kill_after_s: float, victim) -> list:
    """`count` requests from 4 clients; `victim()` (a pid) is killed `kill_after_s` in."""

    async def run():
        async def strike():
            await asyncio.sleep(kill_after_s)
            faults.kill(victim())

        async with make_client(
            service.base_url, api_key=service.api_key, request_timeout_s=120
        ) as client:
            specs = [
                RequestSpec("rag", f"{QUESTIONS[i % 4]} ({i})", max_tokens=16) for i in range(count)
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
        time.sleep(1)
    pytest.fail(f"{stage} did not get back to {count} replicas in {timeout_s} s")


def test_killing_one_of_two_retrievers_under_load_fails_nothing(service):
    victims = faults.replica_pids(service.pid, "Retriever")
    assert len(victims) == 2

    records = steady_load(service, 32, kill_after_s=2, victim=lambda: victims[0])

    tally = outcomes.counts(records)
    assert tally["succeeded"] == 32, (tally, outcomes.failures(records))
    assert victims[0] not in faults.replica_pids(service.pid, "Retriever")
    wait_for_replicas(service, "retriever", 2)


def test_killing_the_only_compressor_degrades_then_recovers(service):
    [victim] = faults.replica_pids(service.pid, "Compressor")
    ask = {"question": QUESTIONS[0], "max_tokens": 8}

    records = steady_load(service, 24, kill_after_s=1, victim=lambda: victim)

    tally = outcomes.counts(records)
    assert tally["failed"] == tally["hung"] == 0, outcomes.failures(records)
    assert tally["succeeded"] + tally["refused"] == 24
    degraded = httpx.post(
        f"{service.base_url}/v1/rag/query", json=ask, headers=service.headers, timeout=120
    ).json()
    wait_for_replicas(service, "compressor", 1)
    deadline = time.perf_counter() + 60
    while True:  # the ingress learns of the new replica within a readiness refresh
        body = httpx.post(
            f"{service.base_url}/v1/rag/query", json=ask, headers=service.headers, timeout=120
        ).json()
        if body["degraded"] is None or time.perf_counter() > deadline:
            break
        time.sleep(1)
    assert body["degraded"] is None and body["compression_method"] == "sentences"
    if degraded.get("degraded") is not None:  # asked while the compressor was still down
        assert degraded["degraded"].startswith("compressor_")
        assert degraded["compression_method"] == "none"
        assert (
            degraded["usage"]["context_tokens_after"] <= degraded["usage"]["context_tokens_before"]
        )
