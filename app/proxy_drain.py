"""A refusal that still lets its client read it: answered before the body is read, then
what the client still sends is dropped as it arrives, within bounds, before the connection
closes (app.proxy_guard's 401s, app.proxy_admission's 503s)."""

from __future__ import annotations

import asyncio
import time

from starlette.types import Receive, Scope, Send

from app.errors import ApiError, error_response
from app.guard import announces_body, send_refusal

# What a refused client may still send, dropped as it arrives, before the connection closes:
# twice the largest upload shipped (collections.max_upload_bytes), and some seconds.
DRAIN_MAX_BYTES = 64 << 20
DRAIN_MAX_S = 10.0


async def refuse_unheld(
    error: ApiError, request_id: str, scope: Scope, receive: Receive, send: Send
) -> None:
    """Answer `error` before reading the body; then read what the client still sends and
    drop it, piece by piece, before closing (a lingering close, as nginx does). An HTTP
    client writes its whole body before it reads the answer, and a server that closes on
    unread bytes makes the kernel reset the connection, so the client would see a reset
    instead of its 401. The bytes dropped are bounded (DRAIN_MAX_BYTES, DRAIN_MAX_S); what
    is held at once is one piece."""
    if not announces_body(scope):
        await send_refusal(error, request_id, scope, receive, send)
        return
    response = error_response(error, request_id)
    headers = [*response.raw_headers, (b"connection", b"close")]
    await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
    # The whole answer is on the wire (Content-Length); the last, empty piece ends the
    # exchange once the body is dropped.
    await send({"type": "http.response.body", "body": response.body, "more_body": True})
    await _drop_body(receive)
    await send({"type": "http.response.body", "body": b""})


async def _drop_body(receive: Receive) -> None:
    deadline = time.monotonic() + DRAIN_MAX_S
    dropped = 0
    while dropped < DRAIN_MAX_BYTES:
        try:
            message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            return
        if message["type"] != "http.request":  # the client left
            return
        dropped += len(message.get("body", b""))
        if not message.get("more_body", False):
            return
