"""Count every error response the API sends, by status and OpenAI error code.

Errors are answered in many places (the key check and rate limit in `RequestGuard`, the body
limit, the exception handlers, Serve-side refusals turned into 503s); this middleware sits
outside all of them and sees each one as it leaves. The code is read from the error body
(`{"error": {"code": ..., "type": ...}}`): `code` when set, else `type`. An error sent
inside a stream after a 200 (an SSE `error` event) is not an HTTP error and is not counted
here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

ErrorSink = Callable[[int, str], None]

# An error body is one small JSON message; a larger or streamed one is not parsed.
_MAX_PARSED_BYTES = 64 * 1024


class ErrorCounter:
    def __init__(self, app: ASGIApp, sink: ErrorSink) -> None:
        self.app = app
        self.sink = sink

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 0
        counted = False

        async def counting_send(message: Message) -> None:
            nonlocal status, counted
            if message["type"] == "http.response.start":
                status = int(message["status"])
            elif message["type"] == "http.response.body" and status >= 400 and not counted:
                counted = True
                self.sink(status, error_code(message.get("body", b"")))
            await send(message)

        await self.app(scope, receive, counting_send)


def error_code(body: bytes) -> str:
    """The OpenAI error shape's `code`, else its `type`, else "unknown"."""
    if not body or len(body) > _MAX_PARSED_BYTES:
        return "unknown"
    try:
        error: Any = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return "unknown"
    if not isinstance(error, dict):
        return "unknown"
    return str(error.get("code") or error.get("type") or "unknown")
