"""Serve's own failures in the API's error shape (app.proxy_errors): the proxy's plain-text
answers and its silence when the ingress replica dies become OpenAI-shaped errors on /v1;
what the application sends passes untouched."""

from __future__ import annotations

import asyncio
import json

import pytest

from app.proxy_errors import ProxyErrorShape


def plain(status: int, text: bytes, headers=()):
    """Serve's proxy answering a failure itself, in plain text."""

    async def app(scope, receive, send):
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"), *headers],
            }
        )
        await send({"type": "http.response.body", "body": text[:5], "more_body": True})
        await send({"type": "http.response.body", "body": text[5:]})  # fmt: skip

    return app


async def silent(scope, receive, send):
    """The ingress replica died under the request: the proxy sends nothing."""


async def broken(scope, receive, send):
    raise RuntimeError("the proxy itself failed")


def passthrough(status: int, content_type: bytes, body: bytes):
    async def app(scope, receive, send):
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", content_type)],
            }
        )
        await send({"type": "http.response.body", "body": body})  # fmt: skip

    return app


def call(app, path="/v1/rag/query"):
    scope = {"type": "http", "method": "POST", "path": path,
             "headers": [(b"x-request-id", b"req-7")]}  # fmt: skip
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(ProxyErrorShape(app)(scope, receive, send))
    start = sent[0]
    body = b"".join(m.get("body", b"") for m in sent[1:])
    return start["status"], dict(start["headers"]), body


@pytest.mark.parametrize(
    ("app", "status", "kind", "code", "retry_after"),
    [
        (plain(503, b"Request dropped: queue full", [(b"retry-after", b"4")]), 503,
         "service_unavailable", "ingress_unavailable", b"4"),
        (plain(429, b"too many requests"), 429, "rate_limit_error", "overloaded", b"1"),
        (plain(408, b"Request req-7 timed out after 30s."), 408, "timeout", "timeout", None),
        (plain(500, b"Internal Server Error"), 500, "server_error", "internal_error", None),
        (silent, 503, "service_unavailable", "ingress_unavailable", b"1"),
        (broken, 500, "server_error", "internal_error", None),
    ],
    ids=["full queue", "429", "timeout", "plain 500", "replica lost", "proxy failed"],
)  # fmt: skip
def test_serves_own_failures_become_openai_errors_with_status_and_retry_after(
    app, status, kind, code, retry_after
):
    got_status, headers, body = call(app)

    error = json.loads(body)["error"]
    assert got_status == status
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["code"]) == (kind, code)
    assert "req-7" in error["message"]
    assert headers[b"content-type"] == b"application/json"
    assert headers.get(b"retry-after") == retry_after


def test_the_proxys_text_is_kept_in_the_message():
    _, _, body = call(plain(503, b"Request dropped: queue full"))

    assert "Request dropped: queue full" in json.loads(body)["error"]["message"]


@pytest.mark.parametrize(
    ("status", "content_type", "body"),
    [(401, b"application/json", b'{"error": {}}'),
     (200, b"text/event-stream", b"event: done\n\n"),
     (200, b"text/plain", b"fine")],
    ids=["app's JSON error", "a stream", "plain text that is no error"],
)  # fmt: skip
def test_what_the_application_sends_passes_untouched(status, content_type, body):
    got_status, headers, got_body = call(passthrough(status, content_type, body))

    assert (got_status, headers[b"content-type"], got_body) == (status, content_type, body)


def test_routes_outside_the_api_are_left_to_serve():
    sent = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {}

    scope = {"type": "http", "method": "GET", "path": "/-/healthz", "headers": []}
    asyncio.run(ProxyErrorShape(silent)(scope, receive, send))

    assert sent == []


def test_each_answer_it_makes_is_counted_in_the_error_sink():
    counted = []

    for app in (silent, plain(503, b"queue full"), passthrough(401, b"application/json", b"{}")):
        scope = {"type": "http", "method": "POST", "path": "/v1/rag/query", "headers": []}

        async def receive():
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message):
            pass

        shaped = ProxyErrorShape(app, sink=lambda status, code: counted.append((status, code)))
        asyncio.run(shaped(scope, receive, send))

    assert counted == [(503, "ingress_unavailable"), (503, "ingress_unavailable")]
