"""Admission: refuse work the service cannot hold, fast, before any stage spends time on it.

- `InFlightGate`: at most N requests inside one ingress replica's pipeline; the next is
  refused at once (503 + Retry-After) instead of queueing behind work it would only slow.
- `KeyRateLimiter`: a token bucket per API key (429 + Retry-After).
- `CapacityHeader`: says on every /v1 response how many queries the whole service admits
  at once, for Serve's proxy to refuse past it before routing (app.proxy_admission).
- `BodySizeLimit`: an ASGI middleware that answers 413 from the Content-Length header before
  the body is read, and stops reading a body without one as soon as it passes the limit.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class InFlightGate:
    """Counts requests inside the pipeline; `try_enter` refuses once `limit` are in."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("the in-flight limit must be at least 1")
        self.limit = limit
        self.in_flight = 0

    def try_enter(self) -> bool:
        # Runs on the event loop only, so the check and the increment cannot interleave.
        if self.in_flight >= self.limit:
            return False
        self.in_flight += 1
        return True

    def leave(self) -> None:
        self.in_flight = max(0, self.in_flight - 1)


class KeyRateLimiter:
    """A token bucket per key: `rate_per_s` sustained, `burst` at once. Keeps the most
    recently seen `max_keys` buckets, so unknown keys cannot grow it without bound."""

    def __init__(
        self,
        rate_per_s: float,
        burst: int,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = 10_000,
    ) -> None:
        if rate_per_s <= 0 or burst < 1:
            raise ValueError("rate_per_s must be > 0 and burst >= 1")
        self._rate = rate_per_s
        self._burst = float(burst)
        self._clock = clock
        self._max_keys = max_keys
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def acquire(self, key: str) -> float | None:
        """Take one token for `key`: None when granted, else the seconds until one is due."""
        now = self._clock()
        tokens, last = self._buckets.pop(key, (self._burst, now))
        tokens = min(self._burst, tokens + (now - last) * self._rate)
        granted = tokens >= 1
        self._buckets[key] = (tokens - 1 if granted else tokens, now)
        if len(self._buckets) > self._max_keys:
            self._buckets.popitem(last=False)
        return None if granted else (1 - tokens) / self._rate


class BodySizeLimit:
    """Answer 413 for a request body over `max_bytes`, without reading it when its length
    is declared. `render_error(scope)` gives the JSON body of the refusal; `max_bytes_for`
    (scope -> bytes), when given, sets the limit per request (uploads get a larger one)."""

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int,
        render_error: Callable[[Scope], dict],
        max_bytes_for: Callable[[Scope], int] | None = None,
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.render_error = render_error
        self.max_bytes_for = max_bytes_for

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_bytes_for(scope) if self.max_bytes_for else self.max_bytes
        declared = content_length(scope)
        if declared is not None:
            if declared > limit:
                await self._refuse(scope, send)
                return
            await self.app(scope, receive, send)
            return
        # No declared length (chunked): read up to the limit, then replay what was read.
        messages: list[Message] = []
        total = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            total += len(message.get("body", b""))
            if total > limit:
                await self._refuse(scope, send)
                return
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, send: Send) -> None:
        await send_unread_refusal(send, 413, self.render_error(scope))


async def send_unread_refusal(
    send: Send, status: int, error: dict, headers: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    """Answer `status` with `error` as JSON, from middleware that has not read the body: with
    `Connection: close`, so the server drops the connection rather than read the rest."""
    body = json.dumps(error).encode()
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [
            (b"content-type", b"application/json"),
            (b"connection", b"close"),
            (b"content-length", str(len(body)).encode()),
            *headers,
        ],
    })  # fmt: skip
    await send({"type": "http.response.body", "body": body})


def content_length(scope: Scope) -> int | None:
    """The request's declared Content-Length, None when absent or not a count of bytes."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                length = int(value)
            except ValueError:
                return None
            return length if length >= 0 else None
    return None


class CapacityHeader:
    """Adds `name: value()` to every /v1 response (value read per response, so it follows
    a config update)."""

    def __init__(self, app: ASGIApp, name: bytes, value: Callable[[], bytes]) -> None:
        self.app = app
        self._name = name
        self._value = value

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return

        async def with_header(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [*message.get("headers", ()), (self._name, self._value())]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_header)
