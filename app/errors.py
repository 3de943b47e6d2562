"""One error shape for the whole API: OpenAI's `{"error": {message, type, param, code}}`.

Stages report refusals as `StageError` values and unavailability as `StageUnavailable`; the
HTTP layer turns them, and every exception it catches, into a response here and only here.
No response carries a traceback.
"""

from __future__ import annotations

import math

from fastapi.responses import JSONResponse
from pydantic import BaseModel

from pipeline.messages import StageError
from pipeline.stages import StageUnavailable


class ApiError(Exception):
    """Raised inside the ingress; rendered once by `error_response`."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    @property
    def metric_code(self) -> str:
        """What the error metric counts it by: its code, else its type."""
        return self.code or self.type

    @classmethod
    def from_stage(cls, error: StageError, retry_after_s: float = 1.0) -> ApiError:
        headers = _retry_after(retry_after_s) if error.status in (429, 503) else None
        return cls(error.status, error.message, error.type, error.param, error.code, headers)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, "invalid_request_error", param, code)


def not_ready(message: str, retry_after_s: float) -> ApiError:
    return ApiError(
        503, message, "service_unavailable", code="not_ready", headers=_retry_after(retry_after_s)
    )


def overloaded(message: str, retry_after_s: float) -> ApiError:
    return ApiError(
        503, message, "service_unavailable", code="overloaded", headers=_retry_after(retry_after_s)
    )


def at_capacity(in_flight: int, retry_after_s: float) -> ApiError:
    """The 503 for a query past the service's capacity: the ingress's gate and Serve's
    proxy (app.proxy_admission) refuse in the same words."""
    return overloaded(
        f"the service is at capacity ({in_flight} requests in flight); retry shortly",
        retry_after_s,
    )


def stage_unavailable(exc: StageUnavailable, retry_after_s: float) -> ApiError:
    """503 with Retry-After: `overloaded` when the stage's queue is full, else
    `<stage>_unavailable` (no live replica, or it died under the request)."""
    code = "overloaded" if exc.kind == "overloaded" else f"{exc.stage}_unavailable"
    message = f"{exc}; retry shortly"
    return ApiError(
        503, message, "service_unavailable", code=code, headers=_retry_after(retry_after_s)
    )


def invalid_api_key() -> ApiError:
    return ApiError(
        401,
        "missing or invalid API key: send Authorization: Bearer <key>",
        "authentication_error",
        code="invalid_api_key",
        headers={"WWW-Authenticate": "Bearer"},
    )


def rate_limited(retry_after_s: float) -> ApiError:
    return ApiError(
        429,
        "rate limit exceeded for this API key",
        "rate_limit_error",
        code="rate_limit_exceeded",
        headers=_retry_after(retry_after_s),
    )


def upload_budget_exceeded(retry_after_s: float) -> ApiError:
    """An upload that would take this caller, or all callers, past their bytes in flight."""
    return ApiError(
        429,
        "too many upload bytes in flight: wait for your earlier uploads to be accepted, then retry",
        "rate_limit_error",
        code="upload_budget_exceeded",
        headers=_retry_after(retry_after_s),
    )


def payload_too_large(limit_bytes: int) -> ApiError:
    return ApiError(
        413,
        f"the request body is larger than {limit_bytes} bytes",
        "invalid_request_error",
        code="request_too_large",
    )


DEADLINE_PASSED = StageError(504, "the request ran past its deadline", "timeout", code="timeout")


def timed_out() -> ApiError:
    return ApiError.from_stage(DEADLINE_PASSED)


def internal() -> ApiError:
    return ApiError(500, "internal error", "server_error", code="internal_error")


def error_body(error: ApiError, request_id: str | None = None) -> dict:
    message = error.message
    suffix = f"(request {request_id})"
    if request_id and suffix not in message:
        message = f"{message} {suffix}"
    return {
        "error": {"message": message, "type": error.type, "param": error.param, "code": error.code}
    }


def error_response(error: ApiError, request_id: str | None = None) -> JSONResponse:
    return JSONResponse(
        error_body(error, request_id), status_code=error.status, headers=dict(error.headers)
    )


def _retry_after(seconds: float) -> dict[str, str]:
    # RFC 9110 delay-seconds: a whole, non-negative number, rounded up.
    return {"Retry-After": str(max(1, math.ceil(seconds)))}


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(BaseModel):
    """Every error response: OpenAI's error shape."""

    error: ErrorDetail


def _declared(description: str) -> dict:
    return {"model": ErrorBody, "description": description}


# Declared on routes so the OpenAPI document lists the error responses honestly.
ERROR_RESPONSES: dict[int | str, dict] = {
    400: _declared("Invalid request."),
    401: _declared("Missing or wrong API key."),
    403: _declared(
        "The API key's scopes do not cover the collection, or a change to the read-only "
        "default collection."
    ),
    404: _declared("Unknown model."),
    413: _declared("The request body is over the size limit."),
    429: _declared("The API key's rate limit is exceeded (with Retry-After)."),
    500: _declared("An unexpected server error (no traceback is ever included)."),
    502: _declared("The generator failed on the request."),
    503: _declared("Not ready, at capacity, or a stage is unavailable (with Retry-After)."),
    504: _declared("The request ran past its deadline."),
}
