"""Serve's own failures in the API's error shape, from inside Serve's HTTP proxy.

Serve's proxy answers some failures itself, in plain text: a request past
`http_options.request_timeout_s` (408), a full queue (503, or 429), an application with no
replica (503). One it does not answer at all: when the ingress replica dies under a
request, the proxy sends nothing and the HTTP server falls back to a bare
"Internal Server Error". On /v1 routes this middleware (installed with the key check,
app.proxy_guard) turns each into the OpenAI error shape every other error has, keeping the
status and Retry-After, and answers the replica's death with 503 `ingress_unavailable` and
Retry-After, as a lost replica of any other stage is answered. What the application sends
itself (JSON errors, answers, streams) passes through untouched.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.error_metrics import ErrorSink
from app.errors import ApiError, error_response, internal
from app.guard import request_id_in

logger = logging.getLogger(__name__)

RETRY_AFTER_S = "1"


class ProxyErrorShape:
    def __init__(self, app: ASGIApp, sink: ErrorSink = lambda status, code: None) -> None:
        self.app = app
        self._sink = sink

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        request_id = request_id_in(scope)
        reply = _Reply(scope, receive, send, request_id, self._sink)
        try:
            await self.app(scope, receive, reply.send)
        except Exception:
            if reply.started:
                raise
            logger.exception("Serve's proxy failed before answering request %s", request_id)
            await reply.send_error(internal())
            return
        if reply.held is not None:  # plain text whose last body piece never came
            await reply.send_error(reply.held_error())
        elif not reply.started:
            await reply.send_error(_replica_lost())


class _Reply:
    """The response as it leaves the proxy: a plain-text error is held back (start and
    body) and replaced; everything else goes straight on."""

    def __init__(
        self, scope: Scope, receive: Receive, send: Send, request_id: str, sink: ErrorSink
    ) -> None:
        self._scope, self._receive, self._send = scope, receive, send
        self._request_id, self._sink = request_id, sink
        self.started = False
        self.held: MutableMapping[str, Any] | None = None
        self._body = b""

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start" and _plain_text_error(message):
            self.held, self.started = dict(message), True
            return
        if self.held is not None and message["type"] == "http.response.body":
            self._body += message.get("body", b"")
            if not message.get("more_body", False):
                error, self.held = self.held_error(), None
                await self.send_error(error)
            return
        self.started = self.started or message["type"] == "http.response.start"
        await self._send(message)

    def held_error(self) -> ApiError:
        assert self.held is not None
        headers = dict(self.held.get("headers", ()))
        text = self._body.decode("utf-8", "replace").strip()
        return _from_proxy(self.held["status"], text, headers.get(b"retry-after"))

    async def send_error(self, error: ApiError) -> None:
        self.started, self.held = True, None
        self._sink(error.status, error.metric_code)
        response = error_response(error, self._request_id)
        await response(self._scope, self._receive, self._send)


def _plain_text_error(start: Message) -> bool:
    content_type = dict(start.get("headers", ())).get(b"content-type", b"")
    return start["status"] >= 400 and content_type.startswith(b"text/plain")


def _from_proxy(status: int, text: str, retry_after: bytes | None) -> ApiError:
    """Serve's plain-text answer as the API's error: same status, a type and code by it."""
    message = f"Serve's proxy: {text or 'no detail'}"
    if status == 408:
        return ApiError(408, message, "timeout", code="timeout")
    if status in (429, 503):
        retry = {"Retry-After": retry_after.decode() if retry_after else RETRY_AFTER_S}
        kind = ("rate_limit_error", "overloaded") if status == 429 else (
            "service_unavailable", "ingress_unavailable"
        )  # fmt: skip
        return ApiError(status, message, kind[0], code=kind[1], headers=retry)
    if status >= 500:
        return ApiError(status, message, "server_error", code="internal_error")
    return ApiError(status, message, "invalid_request_error")


def _replica_lost() -> ApiError:
    return ApiError(
        503,
        "the ingress replica was lost under this request; retry shortly",
        "service_unavailable",
        code="ingress_unavailable",
        headers={"Retry-After": RETRY_AFTER_S},
    )
