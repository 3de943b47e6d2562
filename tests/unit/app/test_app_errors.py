"""app.errors: one error shape, the request id in the message, stage errors carried over."""

from __future__ import annotations

import json

from app.errors import (
    ApiError,
    bad_request,
    error_body,
    error_response,
    internal,
    overloaded,
)
from pipeline.messages import StageError


def test_error_body_is_the_openai_shape_with_the_request_id_appended_once():
    error = bad_request("top_k too big", param="top_k")

    assert error_body(error, "r1") == {
        "error": {
            "message": "top_k too big (request r1)",
            "type": "invalid_request_error",
            "param": "top_k",
            "code": None,
        }
    }
    assert error_body(internal(), "r1")["error"]["message"] == "internal error (request r1)"
    assert error_body(error)["error"]["message"] == "top_k too big"


def test_stage_error_keeps_every_field():
    stage = StageError(503, "busy", "service_unavailable", "param", "overloaded")

    error = ApiError.from_stage(stage)

    assert (error.status, error.message, error.type, error.param, error.code) == (
        503,
        "busy",
        "service_unavailable",
        "param",
        "overloaded",
    )


def test_error_response_carries_status_headers_and_request_id():
    response = error_response(overloaded("retriever at capacity", retry_after_s=1), "r9")

    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    assert "(request r9)" in json.loads(response.body)["error"]["message"]
    assert json.loads(response.body)["error"]["code"] == "overloaded"
