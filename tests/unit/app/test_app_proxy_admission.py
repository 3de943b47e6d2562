"""Admission in Serve's proxy past the capacity the ingress states (app.proxy_admission)."""

from __future__ import annotations

import asyncio
import json

import pytest

from app.admission import CapacityHeader
from app.proxy_admission import CAPACITY_HEADER, ProxyAdmission, capacity_value, parse_capacity
from app.proxy_guard import middlewares


class Ingress:
    """The ingress behind the proxy: answers each query once `release` is set, stating
    the capacity on its responses."""

    def __init__(self, capacity: bytes | None = capacity_value(2, 1.5)) -> None:
        self.capacity = capacity
        self.release = asyncio.Event()
        self.calls = 0

    async def __call__(self, scope, receive, send):
        self.calls += 1
        await receive()
        await self.release.wait()
        headers = [(b"content-type", b"application/json")]
        if self.capacity is not None:
            headers.append((CAPACITY_HEADER, self.capacity))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"{}"})


async def ask(app, path="/v1/rag/query", method="POST", headers=()):
    """One request through `app`: its status, headers and body."""
    scope = {"type": "http", "method": method, "path": path,
             "headers": [(b"content-length", b"2"), *headers]}  # fmt: skip
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    start = sent[0]
    body = b"".join(m.get("body", b"") for m in sent[1:])
    return start["status"], dict(start["headers"]), body


def test_past_the_stated_capacity_a_query_is_refused_in_the_proxy_in_the_ingress_shape():
    async def run():
        ingress = Ingress()
        counted = []
        proxy = ProxyAdmission(ingress, sink=lambda status, code: counted.append((status, code)))
        ingress.release.set()
        status, headers, _ = await ask(proxy)  # learns the capacity: 2
        assert status == 200 and CAPACITY_HEADER not in headers  # not shown to clients
        ingress.release.clear()
        held = [asyncio.create_task(ask(proxy)) for _ in range(2)]
        while ingress.calls < 3:
            await asyncio.sleep(0)
        refused = await asyncio.wait_for(ask(proxy), 5)  # held by the ingress if let through
        models = asyncio.create_task(ask(proxy, "/v1/models", "GET"))
        await asyncio.sleep(0)
        calls_while_full = ingress.calls
        ingress.release.set()
        await asyncio.gather(*held, models)
        after = await ask(proxy)
        return refused, calls_while_full, after, counted

    (status, headers, body), calls_while_full, after, counted = asyncio.run(run())
    assert status == 503
    assert headers[b"retry-after"] == b"2"  # 1.5 s, rounded up
    error = json.loads(body)["error"]
    assert (error["type"], error["code"]) == ("service_unavailable", "overloaded")
    assert "capacity (2 requests in flight)" in error["message"]
    assert calls_while_full == 4  # the refused query never reached the ingress; /v1/models did
    assert after[0] == 200  # answered ones leave room again
    assert counted == [(503, "overloaded")]


def test_as_serve_stacks_them_the_key_is_checked_before_admission_counts_a_request(
    monkeypatch,
):
    """Serve wraps its app in the callback's middlewares in list order (the last is
    outermost): an unauthenticated query must get its 401 even when the service is at
    capacity, and must not take a place in it."""
    http_util = pytest.importorskip("ray.serve._private.http_util")
    key = "k" * 20
    monkeypatch.setenv("RAG_API_KEYS", key)
    keyed = [(b"authorization", f"Bearer {key}".encode())]

    async def run():
        ingress = Ingress(capacity=capacity_value(1, 1.0))
        app = http_util._apply_middlewares(ingress, middlewares())
        ingress.release.set()
        await ask(app, headers=keyed)  # the proxy learns the capacity: 1
        ingress.release.clear()
        held = asyncio.create_task(ask(app, headers=keyed))  # takes the one place
        await asyncio.sleep(0.05)
        statuses = (await ask(app))[0], (await ask(app, headers=keyed))[0]
        ingress.release.set()
        return (*statuses, (await held)[0])

    assert asyncio.run(run()) == (401, 503, 200)


def test_until_the_ingress_states_a_capacity_everything_is_passed_on():
    async def run():
        ingress = Ingress(capacity=None)
        proxy = ProxyAdmission(ingress)
        tasks = [asyncio.create_task(ask(proxy)) for _ in range(5)]
        while ingress.calls < 5:
            await asyncio.sleep(0)
        ingress.release.set()
        return await asyncio.gather(*tasks)

    assert [status for status, _, _ in asyncio.run(run())] == [200] * 5


def test_a_malformed_capacity_is_ignored():
    for value in (b"", b"lots", b"0; retry-after=1", b"4; retry=1", b"4; retry-after=-1"):
        assert parse_capacity(value) is None
    assert parse_capacity(capacity_value(24, 1.0)) == (24, 1.0)


def test_the_ingress_states_its_capacity_on_v1_responses_only():
    async def run(path):
        async def app(scope, receive, send):
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b""})

        stated = CapacityHeader(app, name=CAPACITY_HEADER, value=lambda: b"24; retry-after=1")
        return (await ask(stated, path))[1]

    assert asyncio.run(run("/v1/rag/query"))[CAPACITY_HEADER] == b"24; retry-after=1"
    assert CAPACITY_HEADER not in asyncio.run(run("/healthz"))
