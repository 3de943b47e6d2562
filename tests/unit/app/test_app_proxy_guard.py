"""The key check Serve's proxy runs before it reads a body (app.proxy_guard)."""

from __future__ import annotations

import asyncio
import json
import os
import time

import pytest

from app import proxy_drain, proxy_guard
from app.proxy_guard import ProxyKeyCheck, middlewares
from app.settings import load_settings

KEY = "k" * 20


class InnerApp:
    """Serve's proxy as the middleware sees it: it reads the body when called."""

    def __init__(self) -> None:
        self.called = False

    async def __call__(self, scope, receive, send):
        self.called = True
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def call(check, path="/v1/rag/query", headers=(), pieces=1, piece_bytes=1024, events=None):
    """Run one request through `check`, whose body arrives in `pieces`; what it sent, and
    whether the body was read. `events` (a list) gets every send and receive, in order."""
    scope = {"type": "http", "method": "POST", "path": path, "headers": list(headers)}
    events = [] if events is None else events
    left = [pieces]

    async def receive():
        left[0] -= 1
        events.append(("receive", piece_bytes))
        return {"type": "http.request", "body": b"x" * piece_bytes, "more_body": left[0] > 0}

    async def send(message):
        events.append(("send", message))

    asyncio.run(check(scope, receive, send))
    return [m for kind, m in events if kind == "send"], any(k == "receive" for k, _ in events)


def keyed_check(inner, environ=None):
    environ = {"RAG_API_KEYS": KEY} if environ is None else environ
    return ProxyKeyCheck(inner, load=lambda: load_settings(environ))


def test_a_request_without_a_key_is_answered_401_before_a_body_byte_then_its_body_dropped():
    inner = InnerApp()
    events = []
    sent, _ = call(keyed_check(inner), headers=[(b"transfer-encoding", b"chunked")], pieces=3,
                   events=events)  # fmt: skip

    start, answer, end = sent
    assert [kind for kind, _ in events] == ["send", "send", "receive", "receive", "receive", "send"]
    headers = dict(start["headers"])
    assert start["status"] == 401
    assert headers[b"connection"] == b"close"
    assert headers[b"www-authenticate"] == b"Bearer"
    error = json.loads(answer["body"])["error"]
    assert (error["type"], error["code"]) == ("authentication_error", "invalid_api_key")
    assert answer["more_body"] and end == {"type": "http.response.body", "body": b""}
    assert not inner.called


def test_what_a_refused_client_sends_is_dropped_only_up_to_the_bounds(monkeypatch):
    monkeypatch.setattr(proxy_drain, "DRAIN_MAX_BYTES", 3 * 1024)
    events = []
    call(keyed_check(InnerApp()), headers=[(b"content-length", b"999999")], pieces=100,
         events=events)  # fmt: skip
    assert sum(1 for kind, _ in events if kind == "receive") == 3

    monkeypatch.setattr(proxy_drain, "DRAIN_MAX_S", 0.2)
    silent_events = []

    async def silent_client():
        silent_events.append("receive")
        await asyncio.sleep(60)

    async def send(message):
        silent_events.append(message["type"])

    scope = {"type": "http", "method": "POST", "path": "/v1/rag/query",
             "headers": [(b"transfer-encoding", b"chunked")]}  # fmt: skip
    started = time.monotonic()
    asyncio.run(keyed_check(InnerApp())(scope, silent_client, send))
    assert time.monotonic() - started < 5
    assert silent_events[-1] == "http.response.body"


def test_a_wrong_key_or_scheme_is_refused_and_the_right_key_goes_through_to_the_proxy():
    for authorization in (b"Bearer " + b"x" * 20, b"Basic " + KEY.encode(), KEY.encode()):
        inner = InnerApp()
        sent, body_read = call(keyed_check(inner), headers=[(b"authorization", authorization)])
        assert sent[0]["status"] == 401 and not body_read and not inner.called

    inner = InnerApp()
    sent, body_read = call(
        keyed_check(inner), headers=[(b"authorization", f"Bearer {KEY}".encode())]
    )
    assert sent[0]["status"] == 200 and body_read and inner.called


def test_health_probes_and_a_keyless_service_are_left_to_the_proxy():
    for check, path in ((keyed_check(InnerApp()), "/-/healthz"),
                        (keyed_check(InnerApp(), environ={}), "/v1/rag/query")):  # fmt: skip
        sent, body_read = call(check, path=path)
        assert sent[0]["status"] == 200 and body_read


def test_a_key_added_to_the_key_file_is_taken_without_a_restart_and_a_broken_file_keeps_the_old(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(proxy_guard, "KEY_FILE_CHECK_S", 0.0)
    key_file = tmp_path / "keys.yaml"
    key_file.write_text(f"- key: {'a' * 20}\n  scopes: ['read:docs']\n")
    environ = {"RAG_API_KEYS_FILE": str(key_file)}
    check = ProxyKeyCheck(InnerApp(), load=lambda: load_settings(environ))
    new_key = [(b"authorization", f"Bearer {'b' * 20}".encode())]
    assert call(check, headers=new_key)[0][0]["status"] == 401

    key_file.write_text(f"- key: {'b' * 20}\n  scopes: ['write:docs']\n")
    os.utime(key_file, ns=(1, 10**18))  # a modification time the first read did not see
    assert call(check, headers=new_key)[0][0]["status"] == 200

    key_file.write_text("- key: [not, a, key\n")
    os.utime(key_file, ns=(1, 2 * 10**18))
    assert call(check, headers=new_key)[0][0]["status"] == 200


def test_serve_accepts_what_the_callback_returns():
    http_util = pytest.importorskip("ray.serve._private.http_util")

    assert len(http_util.validate_http_proxy_callback_return(middlewares())) == 3


def test_each_refusal_is_counted_in_the_error_sink():
    counted = []
    check = ProxyKeyCheck(
        InnerApp(),
        load=lambda: load_settings({"RAG_API_KEYS": KEY}),
        sink=lambda status, code: counted.append((status, code)),
    )

    call(check)
    call(check, headers=[(b"authorization", f"Bearer {KEY}".encode())])

    assert counted == [(401, "invalid_api_key")]


def test_past_the_draining_limit_a_refused_upload_is_closed_unread():
    async def run():
        check = keyed_check(InnerApp(), {"RAG_API_KEYS": KEY, "RAG_PROXY_MAX_DRAINING": "1"})
        scope = {"type": "http", "method": "POST", "path": "/v1/rag/query",
                 "headers": [(b"transfer-encoding", b"chunked")]}  # fmt: skip
        held = asyncio.Event()
        first_reads, second_reads, second_sent = [], [], []

        async def slow_client():  # the first client keeps sending until told to stop
            first_reads.append(1)
            await held.wait()
            return {"type": "http.request", "body": b"", "more_body": False}

        async def second_client():
            second_reads.append(1)
            return {"type": "http.request", "body": b"x", "more_body": False}

        async def ignore(message):
            pass

        async def record(message):
            second_sent.append(message)

        first = asyncio.create_task(check(scope, slow_client, ignore))
        while not first_reads:
            await asyncio.sleep(0)
        await check(scope, second_client, record)  # while the first drains
        held.set()
        await first
        return second_reads, second_sent

    second_reads, second_sent = asyncio.run(run())
    assert second_sent[0]["status"] == 401
    assert dict(second_sent[0]["headers"])[b"connection"] == b"close"
    assert second_reads == []  # not a byte of its body read


def test_the_draining_limit_must_be_a_count():
    with pytest.raises(Exception, match="RAG_PROXY_MAX_DRAINING"):
        load_settings({"RAG_PROXY_MAX_DRAINING": "lots"})
