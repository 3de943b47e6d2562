"""The chat endpoint's sampling and output fields: what reaches the generator, n choices
from one retrieval, logprobs in the body and the stream, and structured output.

The stages are fakes (tests/unit/app/conftest.py): these tests are about the mapping."""

from __future__ import annotations

import json

import openai
import pytest

from app.config import RagAppConfig
from pipeline.messages import (
    DEFAULT_SAMPLING,
    FinishEvent,
    OutputFormat,
    Sampling,
    TokenEvent,
    TokenLogprob,
    TokenUsage,
)

MODEL = RagAppConfig().generator.model_id
CHAT = "/v1/chat/completions"
SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}


def chat(**fields) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "How is KV stored?"}]} | fields


def test_sampling_fields_reach_the_generator_as_sent(client, stages):
    body = chat(
        temperature=0.7,
        top_p=0.9,
        stop="END",
        seed=42,
        presence_penalty=0.5,
        frequency_penalty=-0.25,
        logit_bias={"13": -100, "7": 2.5},
        logprobs=True,
        top_logprobs=2,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}},
    )

    assert client.post(CHAT, json=body).status_code == 200

    [request] = stages.requests
    assert request.temperature == 0.7
    assert request.sampling == Sampling(
        top_p=0.9,
        stop=("END",),
        seed=42,
        presence_penalty=0.5,
        frequency_penalty=-0.25,
        logit_bias=((13, -100.0), (7, 2.5)),
        logprobs=True,
        top_logprobs=2,
        output=OutputFormat("json_schema", SCHEMA),
    )


def test_fields_without_meaning_here_are_accepted_and_change_nothing(client, stages):
    body = chat(
        user="u", metadata={"k": "v"}, store=True, service_tier="auto", parallel_tool_calls=True,
        tool_choice="none", tools=[], reasoning_effort="low", modalities=["text"],
        prompt_cache_key="k", safety_identifier="s", verbosity="low",
    )  # fmt: skip

    assert client.post(CHAT, json=body).status_code == 200
    assert stages.requests[0].sampling == DEFAULT_SAMPLING


def test_n_choices_share_one_retrieval_and_one_prompt(client, stages):
    body = client.post(CHAT, json=chat(n=3, seed=10)).json()

    assert [choice["index"] for choice in body["choices"]] == [0, 1, 2]
    assert len(stages.called("retrieve")) == 1 and len(stages.called("prepare")) == 1
    prompts = {json.dumps(request.messages) for request in stages.requests}
    assert len(stages.requests) == 3 and len(prompts) == 1
    # Each draw its own seed, or the three would be one answer thrice.
    assert sorted(request.sampling.seed for request in stages.requests) == [10, 11, 12]
    assert len({request.request_id for request in stages.requests}) == 3
    assert body["usage"]["completion_tokens"] == 9
    assert body["usage"]["prompt_tokens"] == 321


def test_n_choices_stream_each_under_its_index(client):
    response = client.post(CHAT, json=chat(n=2, stream=True))

    chunks = [
        json.loads(block.removeprefix("data: "))
        for block in response.text.split("\n\n")
        if block.startswith("data: {")
    ]
    texts: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            texts[choice["index"]] = texts.get(choice["index"], "") + (
                choice["delta"].get("content") or ""
            )
    assert texts[0] == texts[1] == "Paged attention stores KV in blocks [kv#0]."


LOGPROBS = (TokenLogprob("Paged", -0.1, (("Paged", -0.1), ("Page", -2.0))),)


def test_logprobs_are_in_the_choice_and_in_the_stream(client, stages):
    stages.events = (
        TokenEvent("Paged", LOGPROBS),
        TokenEvent(" attention", (TokenLogprob(" attention", -0.2, ((" attention", -0.2),)),)),
        FinishEvent("stop", TokenUsage(10, 2, 0)),
    )

    body = client.post(CHAT, json=chat(logprobs=True, top_logprobs=2)).json()
    streamed = client.post(CHAT, json=chat(logprobs=True, top_logprobs=2, stream=True)).text

    content = body["choices"][0]["logprobs"]["content"]
    assert [token["token"] for token in content] == ["Paged", " attention"]
    assert content[0]["top_logprobs"][1] == {
        "token": "Page",
        "logprob": -2.0,
        "bytes": list(b"Page"),
    }
    assert content[0]["bytes"] == list(b"Paged")
    chunks = [json.loads(b[6:]) for b in streamed.split("\n\n") if b.startswith("data: {")]
    tokens = [
        token["token"]
        for chunk in chunks
        for choice in chunk["choices"]
        if choice.get("logprobs")
        for token in choice["logprobs"]["content"]
    ]
    assert tokens == ["Paged", " attention"]


def test_a_json_answer_keeps_its_brackets_and_gets_no_citations(client, stages):
    answer = '{"a": "[kv#9] <source id=1>"}'
    stages.events = (TokenEvent(answer), FinishEvent("stop", TokenUsage(10, 5, 0)))

    body = client.post(CHAT, json=chat(response_format={"type": "json_object"})).json()

    assert body["choices"][0]["message"]["content"] == answer
    assert body["rag"]["citations"] is None
    assert stages.called("attribute") == []


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
        ({"audio": {"voice": "alloy"}}, "audio"),
        ({"prediction": {"type": "content", "content": "x"}}, "prediction"),
        ({"web_search_options": {}}, "web_search_options"),
        ({"function_call": "auto"}, "function_call"),
    ],
)
def test_refused_fields_name_themselves_and_say_why(client, stages, fields, param):
    response = client.post(CHAT, json=chat(**fields))

    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["param"], error["code"]) == (param, "unsupported_parameter")
    assert "not" in error["message"]
    assert stages.calls == []


def test_the_openai_client_parse_reads_a_schema_answer(client, stages):
    from pydantic import BaseModel

    class Reply(BaseModel):
        a: str

    stages.events = (TokenEvent('{"a": "blocks"}'), FinishEvent("stop", TokenUsage(10, 5, 0)))
    sdk = openai.OpenAI(
        base_url=f"{client.base_url}/v1", api_key="unused", http_client=client, max_retries=0
    )

    completion = sdk.chat.completions.parse(
        model=MODEL, messages=[{"role": "user", "content": "Q?"}], response_format=Reply
    )

    assert completion.choices[0].message.parsed == Reply(a="blocks")
    sent = stages.requests[0].sampling.output
    assert sent.kind == "json_schema" and sent.schema["required"] == ["a"]
