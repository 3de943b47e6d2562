"""The checks every /v1 request passes before routing, as one pure ASGI middleware:
the request id, the API key (401), the key's scope where the URL names the collection
(403), and the per-key rate limit (429).

Auth runs before the body is parsed: an unauthenticated caller learns nothing about the
request format. Keys are compared in constant time. A refused request that carries a body
is answered with `Connection: close`, so the server drops the connection instead of
reading the rest of a body nobody asked for (to keep the connection for another request).
"""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from app.errors import ApiError, error_response, invalid_api_key, not_ready, rate_limited
from app.keys import ADMIN, Grant, path_refusal


class RequestGuard:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = getattr(scope["app"].state, "rag", None)
        serve_id = state.serve_request_id() if state is not None else None
        request_id = serve_id or request_id_in(scope)
        scope.setdefault("state", {})["request_id"] = request_id
        if serve_id is None:  # Serve's proxy sets the header itself
            send = with_response_header(send, b"x-request-id", request_id.encode())
        if scope["path"].startswith("/v1/"):
            refusal = _refusal(state, scope)
            if refusal is not None:
                await send_refusal(refusal, request_id, scope, receive, send)
                return
        await self.app(scope, receive, send)


def request_id_of(request: Request) -> str:
    """The id the guard gave this request (a new one outside the middleware)."""
    request_id = getattr(request.state, "request_id", None)
    if request_id is None:
        request_id = request.state.request_id = uuid.uuid4().hex
    return request_id


def grant_of(request: Request) -> Grant:
    """What the request's key may do (set by the guard; every collection without keys)."""
    return getattr(request.state, "grant", ADMIN)


def _refusal(state: Any, scope: Scope) -> ApiError | None:
    if state is None:
        return not_ready("the service is starting", retry_after_s=5)
    key = None
    if state.settings.auth_required:
        key = state.settings.key_of(request_header(scope, b"authorization"))
        if key is None:
            return invalid_api_key()
        grant = scope["state"]["grant"] = state.settings.grant(key)
        if refusal := path_refusal(grant, scope["method"], scope["path"]):
            return refusal
    # Who the request counts against (rate limit, upload budget): its key, else its address.
    client = scope.get("client") or ("unknown", 0)
    caller = scope["state"]["caller"] = key or f"address:{client[0]}"
    if state.rate_limiter is not None:
        wait_s = state.rate_limiter.acquire(caller)
        if wait_s is not None:
            return rate_limited(wait_s)
    return None


async def send_refusal(
    error: ApiError, request_id: str, scope: Scope, receive: Receive, send: Send
) -> None:
    """Answer `error` without reading the body: a request that announced one gets
    `Connection: close`, so the server drops it instead of reading what nobody asked for."""
    if announces_body(scope):
        send = with_response_header(send, b"connection", b"close")
    await error_response(error, request_id)(scope, receive, send)


def announces_body(scope: Scope) -> bool:
    """Whether the request announces a body: chunked, or a Content-Length above 0."""
    length = request_header(scope, b"content-length")
    return request_header(scope, b"transfer-encoding") is not None or (
        length is not None and length.strip() not in ("", "0")
    )


def request_id_in(scope: Scope) -> str:
    """The client's x-request-id, else a new id."""
    return request_header(scope, b"x-request-id") or uuid.uuid4().hex


def request_header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return None


def with_response_header(send: Send, name: bytes, value: bytes) -> Send:
    async def wrapped(message: Any) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers", ()))
            if not any(key.lower() == name for key, _ in headers):
                headers.append((name, value))
            message = {**message, "headers": headers}
        await send(message)

    return wrapped
