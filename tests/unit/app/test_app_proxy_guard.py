"""The key check Serve's proxy runs before it reads a body (app.proxy_guard)."""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from app import proxy_guard
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


def call(check, path="/v1/rag/query", headers=()):
    """Run one request through `check`; what it sent, and whether the body was read."""
    scope = {"type": "http", "method": "POST", "path": path, "headers": list(headers)}
    reads = []
    sent = []

    async def receive():
        reads.append(1)
        return {"type": "http.request", "body": b"x" * 1024, "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(check(scope, receive, send))
    return sent, bool(reads)


def keyed_check(inner, environ=None):
    environ = {"RAG_API_KEYS": KEY} if environ is None else environ
    return ProxyKeyCheck(inner, load=lambda: load_settings(environ))


def test_a_request_without_a_key_is_refused_401_in_openai_shape_and_its_body_never_read():
    inner = InnerApp()
    sent, body_read = call(keyed_check(inner), headers=[(b"transfer-encoding", b"chunked")])

    start, body = sent
    headers = dict(start["headers"])
    assert start["status"] == 401
    assert headers[b"connection"] == b"close"
    assert headers[b"www-authenticate"] == b"Bearer"
    error = json.loads(body["body"])["error"]
    assert (error["type"], error["code"]) == ("authentication_error", "invalid_api_key")
    assert not body_read and not inner.called


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
    check = ProxyKeyCheck(InnerApp(), load=lambda: load_settings(environ), key_file=str(key_file))
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

    assert len(http_util.validate_http_proxy_callback_return(middlewares())) == 2
