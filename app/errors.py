"""One error shape for the whole API: OpenAI's `{"error": {message, type, param, code}}`.

Stages report failures as `StageError` values; the ingress turns them, and every exception
it catches, into an HTTP response here and only here. No response carries a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi.responses import JSONResponse


@dataclass(frozen=True)
class StageError:
    """A failure a stage returns as data, so it crosses deployment hops intact."""

    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None


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

    @classmethod
    def from_stage(cls, error: StageError) -> ApiError:
        return cls(error.status, error.message, error.type, error.param, error.code)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, "invalid_request_error", param, code)


def not_ready(message: str) -> ApiError:
    return ApiError(503, message, "service_unavailable", code="not_ready")


def overloaded(message: str) -> ApiError:
    return ApiError(
        503, message, "service_unavailable", code="overloaded", headers={"Retry-After": "1"}
    )


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


# Declared on routes so the OpenAPI document lists the error responses honestly.
ERROR_RESPONSES: dict[int | str, dict] = {
    400: {"description": "Invalid request (OpenAI error shape)."},
    401: {"description": "Missing or wrong API key."},
    404: {"description": "Unknown model."},
    503: {"description": "A stage is not ready, or the service is overloaded."},
    504: {"description": "The request ran past its deadline."},
}
