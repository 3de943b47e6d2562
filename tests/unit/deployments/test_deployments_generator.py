"""deployments.generator: vLLM's OpenAI stream turned into the plain events the ingress reads.

These are the event shapes the fake stages in tests/unit/app mimic. Importing the module pulls
in ray.serve.llm (slow), so it is imported once for the module.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest


@pytest.fixture(scope="module")
def events_of():
    from deployments.generator import _events_of

    return _events_of


def sse(*chunks: dict | str) -> str:
    return "".join(f"data: {c if isinstance(c, str) else json.dumps(c)}\n\n" for c in chunks)


def test_tokens_finish_and_usage_become_events(events_of):
    text = sse(
        {"choices": [{"delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
        {"choices": [{"delta": {"content": "Hello"}, "finish_reason": None}]},
        {"choices": [{"delta": {"content": " world"}, "finish_reason": "length"}]},
        {
            "choices": [],
            "usage": {
                "prompt_tokens": 300,
                "completion_tokens": 2,
                "prompt_tokens_details": {"cached_tokens": 256},
            },
        },
        "[DONE]",
    )

    assert events_of(text) == [
        {"type": "token", "text": "Hello"},
        {"type": "token", "text": " world"},
        {"type": "finish", "reason": "length"},
        {"type": "usage", "prompt_tokens": 300, "completion_tokens": 2, "cached_tokens": 256},
    ]


def test_usage_without_prompt_details_counts_no_cached_tokens(events_of):
    text = sse({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 1}})

    assert events_of(text) == [
        {"type": "usage", "prompt_tokens": 5, "completion_tokens": 1, "cached_tokens": 0}
    ]


def test_error_chunk_in_the_stream_becomes_an_error_event(events_of):
    text = sse({"error": {"message": "too long", "type": "BadRequestError", "code": 400}})

    assert events_of(text) == [
        {"type": "error", "status": 400, "message": "too long", "error_type": "BadRequestError"}
    ]


def test_error_object_instead_of_text_becomes_an_error_event(events_of):
    response = SimpleNamespace(
        error=SimpleNamespace(message="bad request", type="BadRequestError", code=400)
    )

    assert events_of(response) == [
        {"type": "error", "status": 400, "message": "bad request", "error_type": "BadRequestError"}
    ]
    assert events_of(object())[0]["status"] == 500
