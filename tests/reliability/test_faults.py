"""Replica deaths under steady load, against the real application (the shared service,
two replicas of the retriever and of the compressor).

kill -9 of one retriever replica: nothing fails, the calls it held are sent again to the
other. kill -9 of every compressor replica: requests go on with the uncompressed context,
flagged `degraded`, until Serve has replaced them. kill -9 of the vLLM engine process, and
of the only generator replica: no request fails or hangs; each is answered, refused with
503 and Retry-After before its first token, or ends its stream with an error event naming
why; the service answers again once Serve has replaced the replica. A client that leaves
mid-answer: the request is aborted inside vLLM (its own log says so). Recovery times under
the scale profile and a whole node's loss are measured by `make chaos`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time

import httpx
import pytest
from services import read_http_reply

from bench import stats
from bench.loadgen import RequestSpec, make_client, run_load
from bench.questions import DEFAULT_QUESTIONS
from harness import processes

pytestmark = pytest.mark.reliability

QUESTIONS = DEFAULT_QUESTIONS[:4]


def steady_load(
    service, count: int, kill_after_s: float | None, victim, max_tokens: int = 8
) -> list:
    """`count` requests from 4 clients; `victim()` (a pid) is killed `kill_after_s` in, or,
    when that is None, as the first token of any of them arrives: the generator then holds
    requests whatever the time the stages before it took (on a slow machine nothing had
    reached it 2 s in, and the fault went unnoticed)."""

    async def run():
        answering = asyncio.Event()

        async def strike():
            if kill_after_s is None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(answering.wait(), timeout=120)
            else:
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
            records = await run_load(
                client, specs, rate_per_s=None, concurrency=4, seed=0, answering=answering
            )
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

    tally = stats.counts(records)
    assert tally["succeeded"] == 24, (tally, stats.failures(records))
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

    tally = stats.counts(records)
    assert tally["failed"] == tally["hung"] == 0, stats.failures(records)
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


def answered_again(service, timeout_s: float = 300) -> float:
    """Seconds until a query is answered again (Serve replaces a generator in about a
    minute here: a new replica, a new engine, the model loaded)."""
    started = time.perf_counter()
    ask = {"question": QUESTIONS[0], "max_tokens": 4}
    while time.perf_counter() - started < timeout_s:
        with contextlib.suppress(httpx.HTTPError):
            response = httpx.post(
                f"{service.base_url}/v1/rag/query", json=ask, headers=service.headers,
                timeout=120,
            )  # fmt: skip
            if response.status_code == 200:
                return time.perf_counter() - started
        time.sleep(1)
    pytest.fail(f"no answer {timeout_s} s after the generator's fault")


def clean_outcomes(records) -> dict[str, int]:
    """The tally, after checking that no request failed or hung, every one ended one of the
    promised ways, and the fault was felt (some request refused or interrupted)."""
    tally = stats.counts(records)
    assert tally["failed"] == tally["hung"] == 0, (tally, stats.failures(records))
    assert tally["succeeded"] + tally["refused"] + tally["interrupted"] == tally["sent"]
    assert tally["refused"] + tally["interrupted"] > 0, ("the fault went unnoticed", tally)
    return tally


def test_killing_the_vllm_engine_under_load_ends_cleanly_then_recovers(service):
    # The replica lives on with a dead engine: its calls end with engine_dead, the health
    # check fails, and Serve replaces it.
    [engine] = processes.engine_pids(service.pid)

    records = steady_load(service, 16, kill_after_s=None, victim=lambda: engine, max_tokens=32)

    clean_outcomes(records)
    codes = {r.error_code for r in records if not r.ok}
    assert codes <= {"engine_dead", "generator_unavailable", "not_ready"}, codes
    answered_again(service)
    assert engine not in processes.engine_pids(service.pid)


def test_killing_the_only_generator_under_load_ends_cleanly_then_recovers(service):
    [generator] = processes.replica_pids(service.pid, "Generator")

    records = steady_load(service, 16, kill_after_s=None, victim=lambda: generator, max_tokens=32)

    clean_outcomes(records)
    answered_again(service)
    assert processes.replica_pids(service.pid, "Generator") not in ([], [generator])


def test_a_client_that_leaves_mid_answer_has_its_request_aborted_in_vllm(service):
    body = {"question": QUESTIONS[1], "stream": True, "max_tokens": 256}
    with (
        service.client() as client,
        client.stream("POST", "/v1/rag/query", json=body) as response,
    ):
        assert response.status_code == 200
        request_id = response.headers["x-request-id"]
        deltas = 0
        for line in response.iter_lines():  # leave after the second piece of answer
            deltas += line == "event: delta"
            if deltas == 2:
                break
    # Closing the client mid-answer: the ingress cancels its call, Serve passes the
    # cancellation to the generator replica, and vLLM aborts the request.
    deadline = time.perf_counter() + 60
    while time.perf_counter() < deadline:
        taken = service.log_lines(f"{request_id}-")  # vLLM's id: ours, a suffix
        if any(line.rstrip().endswith("aborted.") for line in taken):
            return
        time.sleep(1)
    pytest.fail(f"vLLM never logged request {request_id} aborted; its lines: {taken[-5:]}")


HALF_A_BODY = b'--x\r\nContent-Disposition: form-data; name="files"; filename="a.txt"\r\n\r\nhal'


def test_an_ingress_replica_killed_under_a_request_is_answered_in_the_api_error_shape(service):
    # An upload whose body stops half way holds the request in the ingress (it waits for the
    # rest), so the kill lands under it without a race. Serve's proxy then has no answer
    # (it sends nothing when the replica dies); app.proxy_errors answers 503 in the API's
    # error shape with Retry-After, and Serve replaces the ingress.
    [ingress] = processes.replica_pids(service.pid, "RagIngress")
    url = httpx.URL(service.base_url)
    with socket.create_connection((url.host, url.port), timeout=120) as connection:
        connection.sendall(
            b"POST /v1/collections/notes/documents HTTP/1.1\r\nHost: rag\r\n"
            b"Authorization: Bearer " + service.api_key.encode() + b"\r\n"
            b"Content-Type: multipart/form-data; boundary=x\r\nTransfer-Encoding: chunked\r\n"
            b"\r\n" + f"{len(HALF_A_BODY):x}\r\n".encode() + HALF_A_BODY + b"\r\n"
        )
        time.sleep(2)  # the request reaches the ingress and waits there for its body
        processes.kill(ingress)
        status, headers, body = read_http_reply(connection)
    assert status == 503, body
    assert headers["content-type"] == "application/json" and "retry-after" in headers
    error = json.loads(body)["error"]
    assert (error["type"], error["code"]) == ("service_unavailable", "ingress_unavailable")
    assert ingress not in processes.replica_pids(service.pid, "RagIngress")
