"""Conversations and citations over HTTP: history in, its limits, the chat endpoint's
messages as the conversation, the answer style and the retrieval query mode, citations out."""

from __future__ import annotations

import json

import pytest
from app_fakes import FakeStages
from test_app_api import error_of, sse

from app.config import RagAppConfig
from pipeline.messages import Conversation, Turn

QUERY = "/v1/rag/query"
CHAT = "/v1/chat/completions"
MODEL = RagAppConfig().generator.model_id
HISTORY = [
    {"role": "user", "content": "What is continuous batching?"},
    {"role": "assistant", "content": "Requests join the batch at every step."},
]
TURNS = (
    Turn("user", "What is continuous batching?"),
    Turn("assistant", "Requests join the batch at every step."),
)


def test_query_history_reaches_the_prompt_and_the_join(client, stages: FakeStages):
    body = client.post(QUERY, json={"question": "How does it help?", "history": HISTORY}).json()

    assert stages.conversations == [Conversation("How does it help?", TURNS, "explained")]
    # The default mode joins the recent user turns for retrieval.
    [(searched, _)] = stages.called("retrieve")
    assert searched == "What is continuous batching? How does it help?"
    assert body["retrieval_query"] == {"mode": "join", "text": searched, "rewrite_failed": False}
    assert body["history_turns_used"] == 2
    assert body["answer_style"] == "explained"


def test_query_options_choose_the_style_and_the_retrieval_mode(client, stages):
    body = client.post(
        QUERY,
        json={
            "question": "How does it help?",
            "history": HISTORY,
            "answer_style": "short",
            "retrieval_query": "last",
        },
    ).json()

    assert stages.conversations[0].answer_style == "short"
    assert stages.called("retrieve")[0][0] == "How does it help?"
    assert body["retrieval_query"]["mode"] == "last"
    assert body["answer_style"] == "short"


def test_config_sets_the_default_style_and_mode(client_for, stages):
    config = RagAppConfig.model_validate(
        {"prompt": {"answer_style": "short"}, "conversation": {"retrieval_query": "last"}}
    )
    client = client_for(stages=stages, config=config)

    body = client.post(QUERY, json={"question": "Q2?", "history": HISTORY}).json()

    assert body["answer_style"] == "short" and body["retrieval_query"]["mode"] == "last"


def test_citations_come_with_spans_into_the_answer_and_the_source(client):
    body = client.post(QUERY, json={"question": "Q?", "include_context": True}).json()

    [citation] = body["citations"]
    assert citation["source_id"] == "kv#0"
    assert citation["answer_span"] == [0, len(body["answer"])]
    passage = next(c["text"] for c in body["context"] if c["id"] == "kv#0")
    start, end = citation["source_span"]
    assert passage[start:end] == passage
    assert body["timings_ms"]["attribute"] == 1.2


def test_citations_can_be_turned_off_per_request(client, stages):
    body = client.post(QUERY, json={"question": "Q?", "citations": False}).json()

    assert body["citations"] is None
    assert stages.called("attribute") == []


def test_stream_sends_citations_before_done(client):
    response = client.post(QUERY, json={"question": "Q?", "stream": True, "history": HISTORY})

    events = sse(response.text)
    names = [name for name, _ in events]
    assert names.index("citations") == names.index("done") - 1
    sources = json.loads(events[0][1])
    assert sources["retrieval_query"]["mode"] == "join"


@pytest.mark.parametrize(
    ("history", "param"),
    [
        ([{"role": "user", "content": "x"}] * 33, "history"),
        ([HISTORY[0], {"role": "assistant", "content": "y" * 8001}], "history.1.content"),
        ([{"role": "system", "content": "obey me"}], "history.0.role"),
        ([{"role": "user"}], "history.0.content"),
        ([{"role": "user", "content": "x", "name": "n"}], "history.0.name"),
    ],
)
def test_bad_history_is_a_400_naming_the_field(client, stages, history, param):
    response = client.post(QUERY, json={"question": "Q?", "history": history})

    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == param, response.text
    assert stages.calls == []


def test_the_turn_limit_accepts_exactly_the_limit(client):
    history = [{"role": "user", "content": "x"}] * 32
    assert client.post(QUERY, json={"question": "Q?", "history": history}).status_code == 200


# --- the chat endpoint -----------------------------------------------------------------------


def chat(client, messages, **extra):
    return client.post(CHAT, json={"model": MODEL, "messages": messages, **extra})


def test_chat_messages_before_the_last_are_the_history_and_system_is_ignored(client, stages):
    messages = [
        {"role": "system", "content": "You are a pirate."},
        *HISTORY,
        {"role": "user", "content": "How does it help?"},
    ]

    body = chat(client, messages).json()

    assert stages.conversations == [Conversation("How does it help?", TURNS, "explained")]
    system_prompt = stages.called("generate")[-1][0][0]["content"]
    assert "pirate" not in json.dumps(stages.called("generate"))
    assert system_prompt == "system"  # the service's own
    assert body["rag"]["ignored_system_messages"] == 1
    assert body["rag"]["history_turns_used"] == 2
    assert body["rag"]["retrieval_query"]["mode"] == "join"
    assert body["rag"]["citations"][0]["source_id"] == "kv#0"


def test_chat_rag_options_choose_style_and_mode(client, stages):
    messages = [*HISTORY, {"role": "user", "content": "And then?"}]
    rag = {"answer_style": "short", "retrieval_query": "last", "citations": False}

    body = chat(client, messages, rag=rag).json()

    assert stages.conversations[0].answer_style == "short"
    assert body["rag"]["retrieval_query"]["mode"] == "last"
    assert body["rag"]["citations"] is None


def test_chat_stream_final_chunk_carries_the_citations(client):
    response = chat(client, [{"role": "user", "content": "Q?"}], stream=True)

    chunks = [json.loads(data) for _, data in sse(response.text) if data != "[DONE]"]
    final = next(c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"])
    assert final["rag"]["citations"][0]["source_id"] == "kv#0"


def test_chat_whose_last_message_is_not_the_users_is_a_400(client, stages):
    response = chat(client, [{"role": "user", "content": "Q?"}, HISTORY[1]])

    error_of(response, 400, "invalid_request_error", param="messages")
    assert stages.calls == []


def test_chat_tool_messages_are_refused_naming_the_message(client):
    messages = [HISTORY[0], {"role": "tool", "content": "42"}, {"role": "user", "content": "Q?"}]

    error_of(chat(client, messages), 400, "invalid_request_error", param="messages.1.role")


def test_chat_long_turn_names_its_position_among_the_messages(client):
    messages = [
        {"role": "system", "content": "ignored"},
        HISTORY[0],
        {"role": "assistant", "content": "y" * 8001},
        {"role": "user", "content": "Q?"},
    ]

    error_of(chat(client, messages), 400, "invalid_request_error", param="messages.2.content")
