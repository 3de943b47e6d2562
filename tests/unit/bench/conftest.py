"""A fake /readyz server for the tests of the tools that poll it (bench.chaos)."""

from __future__ import annotations

import http.server
import json
import threading

import pytest


class ReadyzServer:
    """Answers GET /readyz with `answers[i]` on the i-th GET (the last one repeats), 404
    elsewhere. An answer is (status, body): a dict body is sent as JSON, a str as it is."""

    def __init__(self, answers: list[tuple[int, object]]) -> None:
        self.answers = answers
        self.gets = 0
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path != "/readyz":
                    status, body = 404, "{}"
                else:
                    status, answer = server.answers[min(server.gets, len(server.answers) - 1)]
                    server.gets += 1
                    body = answer if isinstance(answer, str) else json.dumps(answer)
                data = body.encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self.httpd = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def readyz():
    servers: list[ReadyzServer] = []

    def start(answers: list[tuple[int, object]]) -> ReadyzServer:
        servers.append(ReadyzServer(answers))
        return servers[-1]

    yield start
    for server in servers:
        server.close()
