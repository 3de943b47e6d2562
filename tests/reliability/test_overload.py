"""Overload, big bodies, slow clients and fuzzing, against the real application (the shared
service, its ingress retuned for this module through its user_config).

The service admits 4 requests in flight (ingress.max_in_flight_requests), so 10x overload
takes 40 concurrent requests. Figures (time to reject, admitted p99) are measured by
`make chaos` into docs/reliability.md; these tests check the behaviour: every request is
answered or cleanly refused, nothing ≥ 500 but refusals, readiness holds.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from bench import chaos, stats
from bench.loadgen import RequestSpec, make_client, run_load
from bench.questions import DEFAULT_QUESTIONS

pytestmark = pytest.mark.reliability

IN_FLIGHT = 4
QUESTIONS = DEFAULT_QUESTIONS[:4]


# Ingress-only settings (app.tuning), set on the shared service for this module alone.
TUNING = {
    "ingress": {"max_in_flight_requests": IN_FLIGHT},
    "generator": {"max_tokens_limit": 64, "default_max_tokens": 16},
}


@pytest.fixture(scope="module", autouse=True)
def tuned(service):
    with service.tuned(TUNING):
        yield


def specs(count: int, max_tokens: int = 16) -> list[RequestSpec]:
    return [
        RequestSpec("rag", f"{QUESTIONS[i % len(QUESTIONS)]} ({i})", max_tokens=max_tokens)
        for i in range(count)
    ]


def test_ten_times_overload_is_answered_or_cleanly_refused_and_readiness_holds(service):
    readiness = chaos.ReadinessLog()

    async def run():
        watcher = asyncio.create_task(
            chaos.watch_readiness(service.base_url, readiness, interval_s=0.25)
        )
        async with make_client(
            service.base_url, api_key=service.api_key, request_timeout_s=120
        ) as client:
            records = await run_load(
                client, specs(10 * IN_FLIGHT), rate_per_s=None, concurrency=10 * IN_FLIGHT, seed=0
            )
        watcher.cancel()
        return records

    records = asyncio.run(run())

    tally = stats.counts(records)
    assert tally["failed"] == tally["hung"] == 0, stats.failures(records)
    assert tally["succeeded"] >= IN_FLIGHT
    assert tally["refused"] > 0  # 40 at once cannot all fit in 4 slots
    refused = [r for r in records if stats.outcome(r) == "refused"]
    assert {(r.status, r.error_code) for r in refused} == {(503, "overloaded")}
    assert all(int(r.retry_after) >= 1 for r in refused)
    assert readiness.samples and readiness.ready_share() == 1.0


def test_past_the_capacity_queries_are_refused_in_serves_proxy_before_the_ingress(service):
    """Once the proxy has learnt the ingress's capacity (four, the module's tuning) from an
    answer, a burst of 10x that at once is refused past it by Serve's proxy
    (app.proxy_admission), in the ingress's own 503 `overloaded`: the refused requests'
    ids are then in no log behind the proxy, where the ingress logs every request that
    reaches it, refused or not."""
    url = f"{service.base_url}/v1/rag/query"
    run = uuid.uuid4().hex
    ask = {"question": QUESTIONS[0], "max_tokens": 16}

    def post(request_id: str) -> httpx.Response:
        headers = {**service.headers, "x-request-id": request_id}
        return httpx.post(url, json=ask, headers=headers, timeout=120)

    first = post(f"itest-learn-{run}")
    assert first.status_code == 200
    assert "x-rag-capacity" not in first.headers  # the ingress's word to the proxy only

    ids = [f"itest-burst-{run}-{i}" for i in range(10 * IN_FLIGHT)]

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(headers=service.headers, timeout=120) as client:
            return await asyncio.gather(*(
                client.post(url, json=ask, headers={"x-request-id": request_id})
                for request_id in ids
            ))  # fmt: skip

    answers = asyncio.run(burst())
    refused = [a for a in answers if a.status_code != 200]
    assert refused, "40 at once cannot all fit in 4 places"
    assert {(a.status_code, a.json()["error"]["code"]) for a in refused} == {(503, "overloaded")}
    assert all(int(a.headers["retry-after"]) >= 1 for a in refused)
    # A request after the burst: once the ingress's log holds it, it holds the burst's too.
    assert post(f"itest-after-{run}").status_code == 200
    deadline = time.monotonic() + 30
    while not service.log_lines(f"itest-after-{run}") and time.monotonic() < deadline:
        time.sleep(0.5)
    logged = "\n".join(service.log_lines(f"itest-burst-{run}-"))
    assert f"itest-after-{run}" in "\n".join(service.log_lines(f"itest-after-{run}"))
    seen = {request_id: f"{request_id} " in logged for request_id in ids}
    statuses = {request_id: a.status_code for request_id, a in zip(ids, answers, strict=True)}
    assert all(seen[i] for i in ids if statuses[i] == 200), "the ingress's log is incomplete"
    assert not all(seen[i] for i in ids if statuses[i] != 200), (
        "every refusal came from the ingress: none was refused in the proxy"
    )


def test_a_body_over_the_limit_is_refused_before_it_is_read(service):
    body = json.dumps({"question": "x" * 2_000_000})
    response = httpx.post(
        f"{service.base_url}/v1/rag/query",
        content=body,
        headers={**service.headers, "content-type": "application/json"},
        timeout=60,
    )

    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"


@pytest.mark.parametrize("path", ["/v1/rag/query", "/v1/collections/default/documents"])
def test_a_chunked_body_without_a_key_is_refused_before_it_is_sent(service, path):
    """The headers and one 64 KiB chunk of a body that never ends: the 401 must come back
    while the rest is still unsent, so neither the proxy nor the ingress waited to read it."""
    address = urlsplit(service.base_url)
    with socket.create_connection((address.hostname, address.port), timeout=30) as sock:
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: {address.netloc}\r\n"
            "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
        )
        sock.sendall(b"10000\r\n" + b"x" * 0x10000 + b"\r\n")
        head = sock.recv(65536)

    assert head.startswith(b"HTTP/1.1 401"), head[:200]
    assert b"invalid_api_key" in head or b"www-authenticate" in head.lower()


def test_a_client_that_stops_reading_does_not_block_others(service):
    url = f"{service.base_url}/v1/rag/query"
    with (
        httpx.Client(headers=service.headers, timeout=120) as stalled,
        stalled.stream(
            "POST", url, json={"question": QUESTIONS[0], "stream": True, "max_tokens": 64}
        ) as response,
    ):
        assert response.status_code == 200
        # Read nothing more while others are served.
        started = time.perf_counter()
        answers = [
            httpx.post(url, json={"question": q, "max_tokens": 8}, headers=service.headers,
                       timeout=120)
            for q in QUESTIONS
        ]  # fmt: skip
        elapsed = time.perf_counter() - started
    assert [a.status_code for a in answers] == [200] * len(QUESTIONS), elapsed
    after = httpx.get(f"{service.base_url}/readyz", timeout=10)
    assert after.status_code == 200


@pytest.mark.skipif(shutil.which("st", path=str(Path(sys.executable).parent)) is None,
                    reason="schemathesis is not installed")  # fmt: skip
def test_fuzzing_every_route_finds_no_server_error(service, tmp_path):
    st = Path(sys.executable).with_name("st")
    result = subprocess.run(
        [
            str(st), "run", f"{service.base_url}/openapi.json",
            "--checks", "not_a_server_error",
            "--max-examples", "25",
            "--seed", "1",
            "--header", f"Authorization: Bearer {service.api_key}",
            "--request-timeout", "120",
            "--report", "junit", "--report-dir", str(tmp_path),
        ],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip

    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
