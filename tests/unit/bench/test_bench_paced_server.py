"""bench.paced_server: the null engine alone behind an OpenAI streaming chat endpoint, read
as raw SSE lines, through bench.loadgen's chat reader, and by a whole load run in-process."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
from fastapi.testclient import TestClient

from bench import overhead
from bench.loadgen import _read_chat, _sse_events, _Stream, make_client, run_load
from bench.paced_server import create_app
from generation.paced_engine import TOKEN_TEXT, PacedEngine

MESSAGES = [
    {"role": "system", "content": "Answer from the sources."},
    {"role": "user", "content": "What is paged attention?"},
]
PROMPT_WORDS = 8  # the engine counts whitespace-separated words


def chat_lines(body: dict) -> list[str]:
    with (
        TestClient(create_app(PacedEngine(ttft_ms=1, tpot_ms=1))) as client,
        client.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        return list(response.iter_lines())


def data_of(lines: list[str]) -> list[str]:
    assert all(line.startswith("data: ") for line in lines if line)
    return [line.removeprefix("data: ") for line in lines if line]


def test_a_streaming_chat_answers_openai_chunks_then_usage_then_done():
    body = {"model": "paced", "messages": MESSAGES, "max_tokens": 5, "stream": True}

    data = data_of(chat_lines(body))

    assert data[-1] == "[DONE]"
    chunks = [json.loads(item) for item in data[:-1]]
    assert len(chunks) == 1 + 5 + 1 + 1  # role, tokens, finish, usage
    assert {chunk["object"] for chunk in chunks} == {"chat.completion.chunk"}
    assert len({chunk["id"] for chunk in chunks}) == 1
    assert chunks[0]["id"].startswith("chatcmpl-")
    assert {chunk["model"] for chunk in chunks} == {"paced"}
    assert chunks[0]["choices"] == [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
    ]
    content = [chunk["choices"][0]["delta"]["content"] for chunk in chunks[1:6]]
    assert content == [TOKEN_TEXT] * 5
    assert chunks[6]["choices"] == [{"index": 0, "delta": {}, "finish_reason": "length"}]
    assert chunks[7]["choices"] == []
    assert chunks[7]["usage"] == {
        "prompt_tokens": PROMPT_WORDS,
        "completion_tokens": 5,
        "total_tokens": PROMPT_WORDS + 5,
    }


def test_the_model_name_is_echoed_and_max_tokens_defaults_to_16():
    data = data_of(chat_lines({"model": "smollm2", "messages": MESSAGES[1:]}))

    chunks = [json.loads(item) for item in data[:-1]]
    assert {chunk["model"] for chunk in chunks} == {"smollm2"}
    assert chunks[-1]["usage"]["completion_tokens"] == 16
    assert chunks[-1]["usage"]["prompt_tokens"] == 4


def test_health():
    with TestClient(create_app(PacedEngine(1, 1))) as client:
        response = client.get("/health")
    assert response.status_code == 200 and response.json() == {"status": "ok"}


async def lines_of(lines: list[str]):
    for line in lines:
        yield line


def test_loadgens_chat_reader_reads_the_stream_as_complete():
    lines = chat_lines({"model": "paced", "messages": MESSAGES, "max_tokens": 7, "stream": True})
    stream = _Stream(time.perf_counter())

    asyncio.run(_read_chat(_sse_events(lines_of(lines)), stream))

    assert stream.complete and stream.error is None
    assert stream.deltas == 7  # the role-only first chunk is not content
    assert stream.usage_tokens == 7
    assert stream.prompt_tokens == PROMPT_WORDS
    assert stream.first_at is not None and len(stream.gaps_s) == 6


def test_a_load_run_of_overheads_alone_side_succeeds_with_every_token():
    app = create_app(PacedEngine(ttft_ms=1, tpot_ms=1))
    specs = overhead.direct_specs(overhead.chat_specs(6, 4, "smollm2-135m-instruct"), "paced")

    async def go():
        transport = httpx.ASGITransport(app=app)
        async with make_client("http://paced", transport=transport, request_timeout_s=30) as c:
            return await run_load(c, specs, rate_per_s=None, concurrency=3, seed=0)

    records = asyncio.run(go())

    assert [r.index for r in records] == list(range(6))
    assert all(r.ok and r.status == 200 and r.error_kind is None for r in records), [
        (r.error_kind, r.error) for r in records
    ]
    assert [r.output_tokens for r in records] == [4] * 6
    assert [r.content_deltas for r in records] == [4] * 6
    # One user message: the question's words.
    assert [r.usage_prompt_tokens for r in records] == [len(s.question.split()) for s in specs]
    assert all(r.ttft_ms is not None and r.e2e_ms >= r.ttft_ms for r in records)
    assert overhead.tpot(records[0]) is not None
