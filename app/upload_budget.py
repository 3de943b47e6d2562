"""Bound what document uploads can make one ingress replica hold.

An upload's body is held in the ingress until it goes on to the collection writer, so the
bytes of uploads in flight are memory the service holds for its callers. `UploadBudget`
caps them per caller (API key, or client address without keys) and in all; the
`UploadBudgetGate` middleware reserves a request's share before a body byte is read (its
Content-Length, or the largest upload allowed when the body is chunked) and refuses what
does not fit with 429 and Retry-After, closing the connection instead of reading the body.
It runs after the request guard, so a caller without a valid key never reserves anything.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from app.admission import content_length, send_unread_refusal
from app.errors import ApiError, error_body


class UploadBudget:
    """Bytes of uploads in flight, per caller and in all. Event-loop only: a reservation's
    check and its increment cannot interleave with another's."""

    def __init__(self, per_caller_bytes: int, total_bytes: int) -> None:
        if per_caller_bytes < 1 or total_bytes < 1:
            raise ValueError("upload budgets must be at least one byte")
        self.per_caller_bytes = per_caller_bytes
        self.total_bytes = total_bytes
        self._held: dict[str, int] = {}
        self.total_held = 0

    def held(self, caller: str) -> int:
        return self._held.get(caller, 0)

    def reserve(self, caller: str, nbytes: int) -> bool:
        """Hold `nbytes` for `caller` if both budgets have room; False (nothing held) if not."""
        held = self.held(caller)
        if held + nbytes > self.per_caller_bytes or self.total_held + nbytes > self.total_bytes:
            return False
        self._held[caller] = held + nbytes
        self.total_held += nbytes
        return True

    def release(self, caller: str, nbytes: int) -> None:
        left = self.held(caller) - nbytes
        if left < 0:
            raise ValueError(f"releasing {nbytes} bytes {caller!r} does not hold")
        if left:
            self._held[caller] = left
        else:
            self._held.pop(caller, None)
        self.total_held -= nbytes


class UploadBudgetGate:
    """ASGI middleware: requests `is_upload(scope)` picks reserve their body's bytes in
    `budget` for the request's caller (`scope["state"]["caller"]`, set by the request guard)
    while they run; one that does not fit is answered with `refusal`, unread."""

    def __init__(
        self,
        app: ASGIApp,
        budget: UploadBudget,
        is_upload: Callable[[Scope], bool],
        largest_upload_bytes: int,
        refusal: ApiError,
    ) -> None:
        self.app = app
        self.budget = budget
        self.is_upload = is_upload
        self.largest_upload_bytes = largest_upload_bytes
        self.refusal = refusal

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.is_upload(scope):
            await self.app(scope, receive, send)
            return
        declared = content_length(scope)
        # A chunked body may grow to the largest upload; a larger declared one is refused by
        # the size limit after this, unread.
        largest = self.largest_upload_bytes
        nbytes = largest if declared is None else min(declared, largest)
        caller = caller_of(scope)
        if not self.budget.reserve(caller, nbytes):
            refusal = self.refusal
            headers = [(k.lower().encode(), v.encode()) for k, v in refusal.headers.items()]
            await send_unread_refusal(send, refusal.status, error_body(refusal), headers)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.budget.release(caller, nbytes)


def caller_of(scope: Scope) -> str:
    """Who the request counts against: the guard's caller, else the client's address."""
    caller = scope.get("state", {}).get("caller")
    if caller:
        return str(caller)
    client = scope.get("client") or ("unknown", 0)
    return f"address:{client[0]}"
