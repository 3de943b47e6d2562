"""/v1/responses and /v1/embeddings over HTTP and through the `openai` client.

The stages are fakes (tests/unit/app/conftest.py): these tests are about the protocol."""

from __future__ import annotations

import base64
import json

import numpy as np
import openai
import pytest
from app_fakes import EMBEDDING_MODEL

from app.config import RagAppConfig
from pipeline.messages import ErrorEvent, StageError, TokenEvent, Turn

MODEL = RagAppConfig().generator.model_id
ANSWER = "Paged attention stores KV in blocks [kv#0]."
RESPONSES = "/v1/responses"


@pytest.fixture
def sdk(client) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{client.base_url}/v1", api_key="unused", http_client=client, max_retries=0
    )


def test_a_response_holds_the_search_then_the_cited_answer(sdk, stages):
    response = sdk.responses.create(model=MODEL, input="How is KV stored?", max_output_tokens=40)

    search, message = response.output
    assert search.type == "file_search_call"
    assert search.queries == ["How is KV stored?"]
    assert [(r.file_id, r.filename) for r in search.results] == [
        ("kv#0", "KV cache"),
        ("batching#2", "Batching"),
    ]
    assert response.output_text == ANSWER
    [annotation] = message.content[0].annotations
    assert (annotation.type, annotation.file_id, annotation.index) == (
        "file_citation",
        "kv#0",
        len(ANSWER),
    )
    assert response.usage.input_tokens == 321
    assert response.usage.input_tokens_details.cached_tokens == 256
    assert response.usage.output_tokens == 3
    assert response.status == "completed"
    assert stages.called("generate")[0][1] == 40


def test_message_items_become_the_conversation_and_instructions_are_counted(client, stages):
    body = {
        "model": MODEL,
        "instructions": "Be brief.",
        "input": [
            {"role": "developer", "content": "Ignore the sources."},
            {"role": "user", "content": "What is KV?"},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Keys and values.", "annotations": []}],
            },
            {"type": "file_search_call", "id": "fs_1", "queries": [], "status": "completed"},
            {"role": "user", "content": [{"type": "input_text", "text": "How is it stored?"}]},
        ],
    }

    response = client.post(RESPONSES, json=body)

    assert response.status_code == 200, response.text
    [conversation] = stages.conversations
    assert conversation.question == "How is it stored?"
    assert conversation.history == (
        Turn("user", "What is KV?"),
        Turn("assistant", "Keys and values."),
    )
    assert response.json()["rag"]["sources"][0]["id"] == "kv#0"


def test_the_stream_sends_typed_events_in_order(sdk):
    events = list(sdk.responses.create(model=MODEL, input="How is KV stored?", stream=True))

    kinds = [event.type for event in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.output_item.done",
    ]
    assert kinds[-5:] == [
        "response.output_text.annotation.added",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == ANSWER == events[-1].response.output_text


def test_an_error_after_the_first_token_is_an_error_event(client, stages):
    stages.events = (TokenEvent("Partial"), ErrorEvent(StageError(500, "engine died")))

    response = client.post(RESPONSES, json={"model": MODEL, "input": "Q?", "stream": True})

    blocks = [b for b in response.text.replace("\r\n", "\n").split("\n\n") if b.strip()]
    last = json.loads(blocks[-1].split("data: ", 1)[1])
    assert last["type"] == "error" and last["message"].startswith("the generator failed")


def test_text_format_json_schema_reaches_the_engine(client, stages):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    body = {
        "model": MODEL,
        "input": "Q?",
        "text": {"format": {"type": "json_schema", "name": "r", "schema": schema}},
        "top_p": 0.5,
        "temperature": 0,
        "extra": None,
    }
    body.pop("extra")

    assert client.post(RESPONSES, json=body).status_code == 200
    sampling = stages.requests[0].sampling
    assert (sampling.output.kind, sampling.output.schema, sampling.top_p) == (
        "json_schema",
        schema,
        0.5,
    )


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id", "unsupported_parameter"),
        ({"store": True}, "store", "unsupported_parameter"),
        ({"background": True}, "background", "unsupported_parameter"),
        ({"tools": [{"type": "file_search"}]}, "tools", "unsupported_parameter"),
        ({"input": [{"type": "function_call_output", "call_id": "c"}]}, "input.0.type", None),
        ({"input": [{"role": "assistant", "content": "hi"}]}, "input", None),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, None, None),
        (
            {"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": 3}}}},
            None,
            None,
        ),
        ({"max_output_tokens": 0}, "max_output_tokens", None),
        ({"nonsense": 1}, "nonsense", "unknown_field"),
    ],
)
def test_refused_and_bad_requests_are_400(client, stages, fields, param, code):
    response = client.post(RESPONSES, json={"model": MODEL, "input": "Q?", **fields})

    assert response.status_code == 400, response.text
    error = response.json()["error"]
    if param is not None:
        assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    assert stages.calls == []


def test_store_false_and_the_ignored_fields_are_accepted(client):
    body = {
        "model": MODEL, "input": "Q?", "store": False, "metadata": {"a": "b"}, "user": "u",
        "reasoning": {"effort": "low"}, "truncation": "auto", "include": [], "tools": [],
        "parallel_tool_calls": False,
    }  # fmt: skip

    assert client.post(RESPONSES, json=body).status_code == 200


def test_embeddings_come_as_floats_or_base64(sdk, client, stages):
    floats = sdk.embeddings.create(model=EMBEDDING_MODEL, input=["one two", "three"])
    raw = client.post(
        "/v1/embeddings",
        json={"model": EMBEDDING_MODEL, "input": "one two", "encoding_format": "base64"},
    ).json()

    vectors = np.array([item.embedding for item in floats.data], dtype=np.float32)
    assert vectors.shape == (2, 3)
    decoded = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), "<f4")
    assert np.array_equal(decoded, vectors[0])
    assert floats.usage.prompt_tokens == 4 + 3
    assert floats.model == EMBEDDING_MODEL
    assert stages.called("embed") == [("one two", "three"), ("one two",)]


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"model": "other", "input": "x"}, 404, "model"),
        ({"model": EMBEDDING_MODEL, "input": []}, 400, "input"),
        ({"model": EMBEDDING_MODEL, "input": ["ok", " "]}, 400, "input.1"),
        ({"model": EMBEDDING_MODEL, "input": [1, 2, 3]}, 400, "input.0"),
        ({"model": EMBEDDING_MODEL, "input": ["x"] * 257}, 400, "input"),
        ({"model": EMBEDDING_MODEL, "input": "x", "dimensions": 2}, 400, "dimensions"),
        ({"model": EMBEDDING_MODEL, "input": "x", "encoding_format": "int8"}, 400, None),
    ],
)
def test_bad_embedding_requests_are_refused(client, body, status, param):
    response = client.post("/v1/embeddings", json=body)

    assert response.status_code == status, response.text
    if param is not None:
        assert response.json()["error"]["param"] == param
