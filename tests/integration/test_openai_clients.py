"""The clients integrators use, unchanged, against the real service (the session's shared
one: Ray Serve, vLLM on the CPU, FAISS, sentence-transformers): the official `openai`
client on the chat, Responses and embeddings APIs, with every standard sampling field and
structured output."""

from __future__ import annotations

import base64
import json

import jsonschema
import numpy as np
import openai
import pytest
from pydantic import BaseModel, Field

pytestmark = pytest.mark.integration

QUESTION = "What does the prefix cache keep between requests?"
STOP_QUESTION = "What is continuous batching?"
NO_CITATIONS = {"rag": {"citations": False}}
ANSWER_SCHEMA = {
    "type": "object",
    # A bound on the string, so that a small reader's answer ends inside max_tokens.
    "properties": {
        "answer": {"type": "string", "maxLength": 120},
        "confident": {"type": "boolean"},
    },
    "required": ["answer", "confident"],
    "additionalProperties": False,
}


class Answer(BaseModel):
    answer: str = Field(max_length=120)
    confident: bool


@pytest.fixture(scope="module")
def service(shared_service):
    return shared_service


@pytest.fixture(scope="module")
def client(service) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{service.base_url}/v1", api_key=service.api_key, max_retries=0)


@pytest.fixture(scope="module")
def model(service) -> str:
    return service.config["generator"]["model_id"]


def ask(client: openai.OpenAI, model: str, question: str = QUESTION, **fields):
    return client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": question}],
        max_tokens=fields.pop("max_tokens", 24),
        **fields,
    )


@pytest.mark.parametrize(
    "fields",
    [
        {"temperature": 0.7, "seed": 3},
        {"top_p": 0.9, "temperature": 0.5},
        {"stop": ["\n\n", "."]},
        {"seed": 11},
        {"presence_penalty": 0.5},
        {"frequency_penalty": 0.5},
        {"logit_bias": {"13": -100}},
        {"logprobs": True, "top_logprobs": 2},
        {"n": 2},
        {"user": "u-1", "metadata": {"team": "a"}, "store": False, "service_tier": "auto"},
        {"parallel_tool_calls": False, "tool_choice": "none"},
        {"response_format": {"type": "text"}},
    ],
    ids=lambda fields: "+".join(fields),
)
def test_each_standard_chat_field_is_answered(client, model, fields):
    completion = ask(client, model, **fields)

    assert completion.choices[0].message.content is not None
    assert completion.usage.completion_tokens >= 1


def test_stop_cuts_the_answer_where_the_string_would_appear(client, model):
    # Greedy, so the answer without a stop is the one the stop cuts.
    whole = ask(client, model, STOP_QUESTION, temperature=0, max_tokens=48, extra_body=NO_CITATIONS)
    text = whole.choices[0].message.content
    words = text.split()
    assert len(words) > 4, text
    stop = f" {words[3]}"
    cut = ask(
        client, model, STOP_QUESTION, temperature=0, max_tokens=48, stop=[stop],
        extra_body=NO_CITATIONS,
    )  # fmt: skip

    assert cut.choices[0].finish_reason == "stop"
    assert stop not in cut.choices[0].message.content
    assert text.startswith(cut.choices[0].message.content)
    assert len(cut.choices[0].message.content) < len(text)


def test_logprobs_come_per_token_with_alternatives(client, model):
    completion = ask(client, model, logprobs=True, top_logprobs=3, temperature=0)

    content = completion.choices[0].logprobs.content
    assert len(content) == completion.usage.completion_tokens
    for token in content:
        assert token.logprob <= 0
        assert len(token.top_logprobs) == 3
        # Greedy: the chosen token is the most likely one.
        assert token.logprob == pytest.approx(max(t.logprob for t in token.top_logprobs))


def test_n_answers_come_from_one_retrieval_and_one_prompt(client, model):
    completion = ask(client, model, n=3, temperature=1.0, seed=5, max_tokens=16)

    assert [choice.index for choice in completion.choices] == [0, 1, 2]
    assert all(choice.message.content for choice in completion.choices)
    rag = completion.model_extra["rag"]
    # One retrieval and one compression: the stage timings are one request's.
    assert rag["timings_ms"]["retrieve"] > 0 and rag["timings_ms"]["compress"] >= 0
    assert len(completion.model_extra["sources"]) >= 1
    lengths = completion.usage.completion_tokens
    assert lengths >= 3


def test_stream_with_n_and_usage(client, model):
    stream = ask(
        client, model, n=2, stream=True, stream_options={"include_usage": True}, max_tokens=12
    )
    texts: dict[int, str] = {}
    usage = None
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
        usage = chunk.usage or usage

    assert set(texts) == {0, 1} and all(texts.values())
    assert usage is not None and usage.completion_tokens >= 2


def test_json_schema_answers_fit_the_schema(client, model):
    completion = ask(
        client,
        model,
        max_tokens=160,
        temperature=0,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA, "strict": True},
        },
    )

    jsonschema.validate(json.loads(completion.choices[0].message.content), ANSWER_SCHEMA)
    assert completion.model_extra["rag"]["citations"] is None


def test_json_object_is_json(client, model):
    completion = ask(
        client, model, max_tokens=160, temperature=0, response_format={"type": "json_object"}
    )

    # Any JSON object: the test reader may nest one until max_tokens cuts it, so the answer
    # is JSON from its first character, and whole JSON unless cut at the cap.
    content = completion.choices[0].message.content
    assert content.startswith("{")
    if completion.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(content), dict)


def test_chat_completions_parse_fills_a_pydantic_model(client, model):
    completion = client.chat.completions.parse(
        model=model,
        messages=[{"role": "user", "content": QUESTION}],
        response_format=Answer,
        max_tokens=160,
        temperature=0,
    )

    assert isinstance(completion.choices[0].message.parsed, Answer)


def test_seeded_greedy_chat_and_responses_give_the_same_answer(client, model):
    chat = ask(client, model, temperature=0, seed=7, max_tokens=32)
    response = client.responses.create(
        model=model, input=QUESTION, temperature=0, max_output_tokens=32, extra_body={"seed": 7}
    )

    assert response.output_text == chat.choices[0].message.content


def test_responses_create_gives_sources_then_the_cited_message(client, model):
    response = client.responses.create(
        model=model, input=[{"role": "user", "content": QUESTION}], max_output_tokens=48,
        instructions="Answer briefly.",
    )  # fmt: skip

    search, message = response.output
    assert search.type == "file_search_call" and search.status == "completed"
    source_ids = {result.file_id for result in search.results}
    assert source_ids and all(result.text for result in search.results)
    assert message.type == "message" and response.output_text
    for annotation in message.content[0].annotations:
        assert annotation.type == "file_citation"
        assert annotation.file_id in source_ids
        assert 0 < annotation.index <= len(response.output_text)
    assert response.usage.input_tokens > 0 and response.usage.output_tokens >= 1
    assert response.usage.input_tokens_details.cached_tokens >= 0


def test_responses_stream_sends_the_typed_events(client, model):
    events = list(
        client.responses.create(model=model, input=QUESTION, max_output_tokens=24, stream=True)
    )

    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert "response.output_text.delta" in kinds
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert deltas == final.output_text
    assert final.usage.output_tokens >= 1


def test_responses_parse_fills_a_pydantic_model(client, model):
    response = client.responses.parse(
        model=model, input=QUESTION, text_format=Answer, max_output_tokens=160, temperature=0
    )

    assert isinstance(response.output_parsed, Answer)


def test_stateful_responses_are_refused_with_a_clear_400(client, model):
    with pytest.raises(openai.BadRequestError) as excinfo:
        client.responses.create(model=model, input=QUESTION, previous_response_id="resp_1")

    assert excinfo.value.code == "unsupported_parameter"
    assert excinfo.value.param == "previous_response_id"


def test_embeddings_are_the_index_models_unit_vectors(client, service):
    models = [m.id for m in client.models.list().data]
    embedding_model = models[1]
    texts = ["What is a KV block?", "Continuous batching admits requests at every step."]

    floats = client.embeddings.create(model=embedding_model, input=texts)
    encoded = client.embeddings.create(model=embedding_model, input=texts, encoding_format="base64")

    vectors = np.array([item.embedding for item in floats.data])
    assert vectors.shape == (2, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
    # Asked for base64, the client hands the string over as it came.
    decoded = [np.frombuffer(base64.b64decode(item.embedding), "<f4") for item in encoded.data]
    assert np.allclose(np.array(decoded), vectors, atol=1e-6)
    assert floats.usage.prompt_tokens > len(" ".join(texts).split())
    # The retriever's own vectors: a question lands nearest the chunk it names.
    question = client.embeddings.create(model=embedding_model, input=texts[0]).data[0].embedding
    assert float(np.dot(question, vectors[0])) == pytest.approx(1.0, abs=1e-4)


def test_langchain_chat_openai_invokes_streams_and_structures(service, model):
    from langchain_openai import ChatOpenAI

    settings = {"model": model, "base_url": f"{service.base_url}/v1", "api_key": service.api_key}
    llm = ChatOpenAI(**settings, max_tokens=24, temperature=0, top_p=0.9, stop=["\n\n"])

    reply = llm.invoke(QUESTION)
    streamed = "".join(str(chunk.content) for chunk in llm.stream(QUESTION))
    structured = ChatOpenAI(**settings, max_tokens=256, temperature=0).with_structured_output(
        Answer
    )
    as_json = ChatOpenAI(**settings, max_tokens=64, temperature=0).with_structured_output(
        method="json_mode"
    )

    assert reply.content and reply.response_metadata["finish_reason"] in ("stop", "length")
    assert streamed == reply.content  # greedy: the stream is the same answer
    assert isinstance(structured.invoke(QUESTION), Answer)
    # json_mode: any JSON object, which the test reader may nest until max_tokens cuts it
    # (LangChain then raises); so the answer is JSON from its first character, and parsed
    # whole unless cut at the cap.
    try:
        assert isinstance(as_json.invoke(f"{QUESTION} Answer in JSON."), dict)
    except openai.LengthFinishReasonError as cut:
        assert cut.completion.choices[0].message.content.startswith("{")


def test_llamaindex_openai_like_chats_and_streams(service, model):
    from llama_index.core.llms import ChatMessage
    from llama_index.llms.openai_like import OpenAILike

    llm = OpenAILike(
        model=model, api_base=f"{service.base_url}/v1", api_key=service.api_key,
        is_chat_model=True, context_window=2048, max_tokens=24, temperature=0,
    )  # fmt: skip
    messages = [ChatMessage(role="user", content=QUESTION)]

    reply = llm.chat(messages)
    streamed = list(llm.stream_chat(messages))

    assert reply.message.content
    assert "".join(part.delta or "" for part in streamed) == reply.message.content


def test_an_openai_agents_sdk_turn_runs_through_the_responses_api(service, model):
    import asyncio

    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, set_tracing_disabled

    set_tracing_disabled(True)  # the SDK would send traces to OpenAI's servers

    def agent() -> Agent:
        # A client per event loop. A typed output, so the answer ends inside max_tokens
        # (the schema bounds its string): the SDK raises on a response cut at max_tokens,
        # and the test reader rambles.
        client = openai.AsyncOpenAI(base_url=f"{service.base_url}/v1", api_key=service.api_key)
        return Agent(
            name="docs",
            instructions="Answer from the documents.",
            model=OpenAIResponsesModel(model=model, openai_client=client),
            model_settings=ModelSettings(max_tokens=160, temperature=0),
            output_type=Answer,
        )

    result = Runner.run_sync(agent(), QUESTION)

    async def streamed() -> tuple[object, list[str]]:
        run = Runner.run_streamed(agent(), QUESTION)
        kinds = [event.type async for event in run.stream_events()]
        return run.final_output, kinds

    final, kinds = asyncio.run(streamed())
    assert isinstance(result.final_output, Answer) and result.final_output.answer
    [response] = result.raw_responses
    assert response.usage.output_tokens >= 1
    assert final == result.final_output  # greedy: the stream gives the same answer
    assert "raw_response_event" in kinds
