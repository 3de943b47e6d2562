"""Admission in Serve's HTTP proxy: a query past what the whole service admits at once is
refused there, before Serve routes it to an ingress replica.

The ingress admits at most its in-flight limit per replica (app.admission.InFlightGate) and
refuses the next query in microseconds, but under a burst the refusal reaches the client
late: each request first crosses Serve's proxy, its router and the hop to a busy ingress
replica, on cores the engine is using (docs/security.md, "How fast a refusal comes").

The ingress says on every /v1 response how many queries the whole service admits at once
(CAPACITY_HEADER: its in-flight limit times its replicas, and its Retry-After). The proxy
keeps the last value it saw, strips the header, counts the queries it has passed on and not
yet seen answered, and refuses the next one with the ingress's own 503 `overloaded` when
that count alone reaches the capacity: every ingress slot is then held by a request from
this proxy, so the ingress would refuse it too. With several proxies (one per node) each
counts only its own, so each refuses only past the whole capacity and the ingress refuses
the rest, as before. Until its first answer from the ingress the proxy knows no capacity
and passes everything on.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.error_metrics import ErrorSink
from app.errors import at_capacity
from app.guard import request_id_in
from app.proxy_drain import refuse_unheld

CAPACITY_HEADER = b"x-rag-capacity"
# The routes the ingress admits through its in-flight gate (app.api).
QUERY_PATHS = frozenset({"/v1/rag/query", "/v1/chat/completions"})


def capacity_value(queries: int, retry_after_s: float) -> bytes:
    """CAPACITY_HEADER's value: `<queries>; retry-after=<seconds>`."""
    return f"{queries}; retry-after={retry_after_s:g}".encode()


def parse_capacity(value: bytes) -> tuple[int, float] | None:
    """(queries, retry-after seconds) from CAPACITY_HEADER's value, None if malformed."""
    queries, _, retry = value.decode("latin-1").partition(";")
    name, _, seconds = retry.strip().partition("=")
    try:
        parsed = int(queries), float(seconds)
    except ValueError:
        return None
    return parsed if name == "retry-after" and parsed[0] >= 1 and parsed[1] >= 0 else None


class ProxyAdmission:
    def __init__(self, app: ASGIApp, sink: ErrorSink = lambda status, code: None) -> None:
        self.app = app
        self._sink = sink
        self._capacity: tuple[int, float] | None = None  # as the ingress last said
        self._in_flight = 0  # queries passed on, not yet answered (one event loop)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        if scope["path"] not in QUERY_PATHS or scope["method"] != "POST":
            await self.app(scope, receive, self._learning(send))
            return
        if self._capacity is not None and self._in_flight >= self._capacity[0]:
            refusal = at_capacity(*self._capacity)
            self._sink(refusal.status, refusal.metric_code)
            request_id = request_id_in(scope)
            await refuse_unheld(refusal, request_id, scope, receive, send)
            return
        self._in_flight += 1
        try:
            await self.app(scope, receive, self._learning(send))
        finally:
            self._in_flight -= 1

    def _learning(self, send: Send) -> Send:
        """`send`, taking CAPACITY_HEADER out of the response and keeping its value."""

        async def wrapped(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = []
                for name, value in message.get("headers", ()):
                    if name.lower() == CAPACITY_HEADER:
                        self._capacity = parse_capacity(value) or self._capacity
                    else:
                        headers.append((name, value))
                message = {**message, "headers": headers}
            await send(message)

        return wrapped
