"""Every error response is counted once, by status and OpenAI error code, wherever it is
answered: the key check, the rate limit, the body limit, validation, admission, a route."""

from __future__ import annotations

import pytest
from app_fakes import make_state
from fastapi.testclient import TestClient

from app.admission import KeyRateLimiter
from app.api import create_api
from app.error_metrics import error_code
from app.settings import Settings

QUERY = "/v1/rag/query"
KEY = "k" * 24


@pytest.fixture
def errors() -> list[tuple[int, str]]:
    return []


def client_of(errors: list[tuple[int, str]], **kwargs) -> TestClient:
    state = make_state(count_error=lambda status, code: errors.append((status, code)), **kwargs)
    return TestClient(create_api(state), raise_server_exceptions=False)


def test_a_good_request_counts_nothing(errors):
    response = client_of(errors).post(QUERY, json={"question": "Q?"})

    assert response.status_code == 200
    assert errors == []


def test_validation_error_is_counted_with_its_code(errors):
    response = client_of(errors).post(QUERY, json={"question": "Q?", "nope": 1})

    assert response.status_code == 400
    assert errors == [(400, "unknown_field")]


def test_missing_key_is_counted_though_answered_before_the_routes(errors):
    settings = Settings(environment="production", api_keys=(KEY,))
    response = client_of(errors, settings=settings).post(QUERY, json={"question": "Q?"})

    assert response.status_code == 401
    assert errors == [(401, "invalid_api_key")]


def test_rate_limited_request_is_counted(errors):
    client = client_of(errors, rate_limiter=KeyRateLimiter(rate_per_s=0.01, burst=1))

    statuses = [client.post(QUERY, json={"question": "Q?"}).status_code for _ in range(2)]

    assert statuses == [200, 429]
    assert [status for status, _ in errors] == [429]


def test_not_ready_is_counted(errors):
    response = client_of(errors, replicas={"retriever": 0, "generator": 1}).post(
        QUERY, json={"question": "Q?"}
    )

    assert response.status_code == 503
    assert errors == [(503, "not_ready")]


def test_unknown_route_is_counted_by_type(errors):
    response = client_of(errors).get("/v1/nowhere")

    assert response.status_code == 404
    assert errors == [(404, "not_found_error")]


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b'{"error": {"code": "overloaded", "type": "service_unavailable"}}', "overloaded"),
        (b'{"error": {"code": null, "type": "invalid_request_error"}}', "invalid_request_error"),
        (b'{"detail": "x"}', "unknown"),
        (b"not json", "unknown"),
        (b"", "unknown"),
        (b'["a list"]', "unknown"),
    ],
)
def test_error_code_reads_the_openai_shape(body, code):
    assert error_code(body) == code
