"""bench.client.warm_up: a 503 (an ingress replica that has not seen its stages yet) is
retried after its Retry-After; other errors are not. bench.client.burst sends every request
and keeps their order; ready_replicas reads a /readyz answer."""

from __future__ import annotations

import asyncio
import http.server
import threading
from collections.abc import Iterator

import httpx
import pytest

from bench.client import burst, ready_replicas, warm_up


class QueryServer:
    """Answers POST /v1/rag/query with `statuses[i]` on the i-th POST (the last repeats)."""

    def __init__(self, statuses: list[int]) -> None:
        self.posts = 0
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["content-length"]))
                status = statuses[min(server.posts, len(statuses) - 1)]
                server.posts += 1
                self.send_response(status)
                self.send_header("retry-after", "0")
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args) -> None:
                pass

        self.httpd = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"


@pytest.fixture
def serve() -> Iterator:
    servers: list[QueryServer] = []

    def start(statuses: list[int]) -> QueryServer:
        servers.append(QueryServer(statuses))
        return servers[-1]

    yield start
    for server in servers:
        server.httpd.shutdown()
        server.httpd.server_close()


def test_a_503_is_retried_until_the_service_answers(serve):
    server = serve([503, 503, 200])

    warm_up(server.url, questions=["q"], timeout_s=10)

    assert server.posts == 3


def test_other_errors_raise_at_once_and_a_503_past_the_deadline_raises(serve):
    failing = serve([500])
    with pytest.raises(httpx.HTTPStatusError):
        warm_up(failing.url, questions=["q"], timeout_s=10)
    assert failing.posts == 1

    busy = serve([503])
    with pytest.raises(httpx.HTTPStatusError):
        warm_up(busy.url, questions=["q"], timeout_s=0.3)
    assert busy.posts >= 1


def test_a_burst_sends_every_request_and_answers_in_their_order(serve):
    server = serve([503])

    async def send(client: httpx.AsyncClient, i: int) -> tuple[int, int]:
        response = await client.post("/v1/rag/query", json={"question": str(i)})
        return i, response.status_code

    assert asyncio.run(burst(server.url, 5, 10, send)) == [(i, 503) for i in range(5)]
    assert server.posts == 5


def test_ready_replicas_reads_the_counts_and_nothing_else():
    def answer(body: object) -> httpx.Response:
        return httpx.Response(200, json=body)

    assert ready_replicas(answer({"ready": True, "replicas": {"retriever": 2}})) == {"retriever": 2}
    assert ready_replicas(answer({"ready": False})) == {}
    assert ready_replicas(answer(["not", "a", "dict"])) == {}
    with pytest.raises(ValueError):
        ready_replicas(httpx.Response(200, text="not json"))
