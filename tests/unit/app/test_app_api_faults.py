"""app.api under load and faults: the in-flight gate, rate limits, body size, unavailable
stages and the compressor fallback, over HTTP with fake stages."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from app_fakes import FakeStages, make_state
from fastapi.testclient import TestClient

from app.admission import KeyRateLimiter
from app.api import create_api
from app.config import IngressConfig, RagAppConfig
from app.settings import Settings
from pipeline.messages import (
    CompressionPlan,
    PreparedPrompt,
    PromptSource,
    Retrieval,
    StageTiming,
    TokenEvent,
)
from pipeline.stages import StageUnavailable

QUERY = "/v1/rag/query"


def sse_names(body: str) -> list[str | None]:
    names = []
    for block in filter(str.strip, body.split("\n\n")):
        lines = block.split("\n")
        names.append(next((ln[7:] for ln in lines if ln.startswith("event: ")), None))
    return names


class BlockingStages(FakeStages):
    """Generation waits until released, so requests stay in flight."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    async def generate(self, request):
        while not self.release.is_set():
            await asyncio.sleep(0.005)
        async for batch in super().generate(request):
            yield batch


def test_requests_past_the_in_flight_limit_are_refused_at_once_with_retry_after():
    stages = BlockingStages()
    state = make_state(stages=stages, in_flight_limit=2)
    client = TestClient(create_api(state), raise_server_exceptions=False)
    results: list[int] = []
    workers = [
        threading.Thread(
            target=lambda: results.append(client.post(QUERY, json={"question": "Q"}).status_code)
        )
        for _ in range(2)
    ]
    for worker in workers:
        worker.start()
    while state.gate.in_flight < 2:
        threading.Event().wait(0.005)

    refused = client.post(QUERY, json={"question": "Q"})

    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "overloaded"
    assert refused.headers["retry-after"] == "1"
    assert len(stages.called("retrieve")) == 2  # the refused request reached no stage
    stages.release.set()
    for worker in workers:
        worker.join()
    assert results == [200, 200]
    assert state.gate.in_flight == 0
    assert client.post(QUERY, json={"question": "Q"}).status_code == 200


@pytest.mark.parametrize("stream", [False, True])
def test_the_slot_is_released_however_the_request_ends(stream):
    failures = [
        FakeStages(retrieve_result=RuntimeError("boom")),
        FakeStages(events=(TokenEvent("a"), RuntimeError("late boom"))),
        FakeStages(),
    ]
    for stages in failures:
        state = make_state(stages=stages, in_flight_limit=1)
        client = TestClient(create_api(state), raise_server_exceptions=False)
        client.post(QUERY, json={"question": "Q", "stream": stream})
        assert state.gate.in_flight == 0


def test_a_client_that_leaves_a_stream_releases_its_slot_and_cancels_generation():
    cancelled = threading.Event()

    class Endless(FakeStages):
        async def generate(self, request):
            try:
                while True:
                    yield [TokenEvent("x")]
                    await asyncio.sleep(0.005)
            finally:
                cancelled.set()

    state = make_state(stages=Endless(), in_flight_limit=1)
    client = TestClient(create_api(state))
    with client.stream("POST", QUERY, json={"question": "Q", "stream": True}) as response:
        for line in response.iter_lines():
            if line.startswith("event: delta"):
                break
    assert cancelled.wait(5)
    for _ in range(200):
        if state.gate.in_flight == 0:
            break
        threading.Event().wait(0.01)
    assert state.gate.in_flight == 0


@pytest.mark.parametrize("kind", ["overloaded", "unavailable"])
@pytest.mark.parametrize("stream", [False, True])
def test_generator_unavailable_before_the_first_token_is_503_with_retry_after(kind, stream):
    stages = FakeStages(events=(StageUnavailable("generator", kind, "replica died"),))
    client = TestClient(create_api(make_state(stages=stages)), raise_server_exceptions=False)

    response = client.post(QUERY, json={"question": "Q", "stream": stream})

    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == ("overloaded" if kind == "overloaded" else "generator_unavailable")
    assert error["type"] == "service_unavailable"
    assert response.headers["retry-after"] == "1"


def test_generator_lost_after_the_first_token_ends_the_stream_with_a_503_error_event():
    stages = FakeStages(
        events=(TokenEvent("Partial"), StageUnavailable("generator", "unavailable", "died"))
    )
    client = TestClient(create_api(make_state(stages=stages)))

    response = client.post(QUERY, json={"question": "Q", "stream": True})

    assert response.status_code == 200
    assert sse_names(response.text) == ["sources", "delta", "error", None]
    error_block = response.text.split("event: error\ndata: ")[1].split("\n")[0]
    error = json.loads(error_block)["error"]
    assert error["code"] == "generator_unavailable"
    assert "retry" in error["message"]


@pytest.mark.parametrize("stage", ["retriever", "compressor"])
def test_retriever_unavailable_is_503_and_compressor_unavailable_degrades(stage):
    class Fallback:
        def __init__(self) -> None:
            self.calls: list[tuple] = []

        def cleaned(self, text):
            return text

        def prepare(
            self, conversation, retrieval: Retrieval, plan: CompressionPlan, max_tokens, degraded
        ):
            self.calls.append((plan.method, degraded))
            source = PromptSource("kv#0", "kv", "KV", "full text", 0.9)
            return PreparedPrompt(
                [{"role": "user", "content": conversation.question}], (source,), plan.method,
                40, 40, 0.0,
                False, StageTiming(0.0, 2.0), degraded=degraded,
            )  # fmt: skip

    stages = FakeStages()
    failure = StageUnavailable(stage, "unavailable", "replica died")
    if stage == "retriever":
        stages.retrieve_result = failure
    else:
        stages.prepare_result = failure
    fallback = Fallback()
    client = TestClient(
        create_api(make_state(stages=stages, fallback=fallback)), raise_server_exceptions=False
    )

    response = client.post(QUERY, json={"question": "Q"})

    if stage == "retriever":
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "retriever_unavailable"
        assert response.headers["retry-after"] == "1"
        assert fallback.calls == []
    else:
        assert response.status_code == 200
        body = response.json()
        assert body["degraded"] == "compressor_unavailable"
        assert body["compression_method"] == "none"
        assert fallback.calls == [("none", "compressor_unavailable")]
        assert body["timings_ms"]["compress"] == 2.0


def test_per_key_rate_limit_is_429_with_retry_after_and_spares_other_keys():
    keys = ("a" * 20, "b" * 20)
    state = make_state(
        settings=Settings(environment="production", api_keys=keys),
        rate_limiter=KeyRateLimiter(rate_per_s=0.01, burst=1),
    )
    client = TestClient(create_api(state))

    def ask(key: str):
        return client.post(
            QUERY, json={"question": "Q"}, headers={"Authorization": f"Bearer {key}"}
        )

    assert ask(keys[0]).status_code == 200
    limited = ask(keys[0])
    assert limited.status_code == 429
    assert limited.json()["error"]["code"] == "rate_limit_exceeded"
    assert int(limited.headers["retry-after"]) >= 1
    assert ask(keys[1]).status_code == 200


def test_a_body_over_the_limit_is_413_in_the_error_shape():
    config = RagAppConfig(ingress=IngressConfig(max_body_bytes=2048))
    stages = FakeStages()
    client = TestClient(create_api(make_state(stages=stages, config=config)))

    response = client.post(
        QUERY,
        content=json.dumps({"question": "x" * 4000}),
        headers={"content-type": "application/json"},
    )

    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"
    assert stages.calls == []
    assert client.post(QUERY, json={"question": "small"}).status_code == 200
