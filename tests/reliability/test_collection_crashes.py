"""Crashes around a collection update, against the real application.

kill -9 of the collection writer in the middle of a job: queries go on being answered
from the last published version, the replacement writer clears the half-built version and
reports the job failed, and the next job publishes. kill -9 of every retriever replica:
their replacements serve the last published version (a restart loses nothing published).
Both run on the shared service, in a collection of this module's own.
"""

from __future__ import annotations

import random
import time

import httpx
import pytest

from harness import processes

pytestmark = pytest.mark.reliability

WORDS = ["amber", "basalt", "cedar", "delta", "ember", "fjord", "garnet", "harbor", "indigo"]


@pytest.fixture(scope="module")
def client(service):
    with httpx.Client(base_url=service.base_url, headers=service.headers, timeout=120) as http:
        yield http


def job_of(client: httpx.Client, response: httpx.Response) -> dict:
    assert response.status_code == 202, response.text
    return response.json()


def wait_job(client: httpx.Client, job_id: str, until: set[str], timeout_s: float = 300) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        response = client.get(f"/v1/jobs/{job_id}")
        if response.status_code == 200 and response.json()["status"] in until:
            return response.json()
        time.sleep(0.2)
    pytest.fail(f"job {job_id} did not reach {until} in {timeout_s} s")


def wait_for_stage(service, stage: str, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        body = httpx.get(f"{service.base_url}/readyz", timeout=10).json()
        if body["stages"].get(stage) == "ready":
            return
        time.sleep(0.5)
    pytest.fail(f"{stage} was not running again after {timeout_s} s")


def long_documents(count: int, seed: int = 0) -> list[dict]:
    """Documents long enough that embedding them takes tens of seconds here."""
    rng = random.Random(seed)
    return [
        {
            "id": f"bulk-{n}",
            "text": " ".join(
                f"The {rng.choice(WORDS)} {rng.choice(WORDS)} record {n}.{k} is {rng.random():.6f}."
                for k in range(60)
            ),
        }
        for n in range(count)
    ]


def retried(send, timeout_s: float = 30) -> httpx.Response:
    """`send()`, again after each 503 as its Retry-After asks: the ingress's view of the
    writer's replicas is refreshed every 2 s, so just after a restart it may still call
    the writer down."""
    deadline = time.monotonic() + timeout_s
    response = send()
    while response.status_code == 503 and time.monotonic() < deadline:
        time.sleep(float(response.headers.get("retry-after", 1)))
        response = send()
    return response


def versions(client: httpx.Client) -> dict[str, str | None]:
    """Collection name -> the version it serves, as GET /v1/collections lists them."""
    response = retried(lambda: client.get("/v1/collections"))
    assert response.status_code == 200, response.text
    return {c["name"]: c["version"] for c in response.json()["data"]}


VAULT = {"documents": [{"id": "vault", "text": "The vault code of the Orlan bank is 7731."}]}


@pytest.fixture(scope="module")
def crash(client) -> dict:
    """The collection "crash", holding the vault document; the job that published it."""
    assert client.post("/v1/collections", json={"name": "crash"}).status_code == 201
    added = job_of(client, client.post("/v1/collections/crash/documents", json=VAULT))
    return wait_job(client, added["id"], {"succeeded"})


def ask(client: httpx.Client) -> dict:
    body = {"question": "What is the vault code?", "collection": "crash", "max_tokens": 4}
    response = client.post("/v1/rag/query", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_a_writer_killed_mid_job_leaves_the_last_version_served(service, client, crash):
    first = versions(client)["crash"]
    [writer] = processes.replica_pids(service.pid, "CollectionWriter")

    bulk = job_of(client, client.post(
        "/v1/collections/crash/documents", json={"documents": long_documents(300)}))  # fmt: skip
    running = wait_job(client, bulk["id"], {"running", "succeeded", "failed"})
    assert running["status"] == "running", "the job ended before it could be interrupted"
    processes.kill(writer)
    answers = [ask(client) for _ in range(5)]  # while no writer runs

    assert {answer["index_version"] for answer in answers} == {first}
    assert all(answer["sources"][0]["id"] == "vault#0" for answer in answers)
    wait_for_stage(service, "writer")
    interrupted = wait_job(client, bulk["id"], {"succeeded", "failed"})
    assert interrupted["status"] == "failed"
    assert "restarted" in interrupted["errors"][-1]["message"]
    assert versions(client)["crash"] == first

    extra = {"documents": [{"id": "after", "text": "The Orlan bank opens at nine."}]}
    added = retried(lambda: client.post("/v1/collections/crash/documents", json=extra))
    after = wait_job(client, job_of(client, added)["id"], {"succeeded", "failed"})
    assert after["status"] == "succeeded", after
    assert ask(client)["index_version"] == after["version"]


def test_restarted_retrievers_serve_the_last_published_version(service, client, crash):
    published = versions(client)
    retrievers = processes.replica_pids(service.pid, "Retriever")
    assert retrievers

    for pid in retrievers:
        processes.kill(pid)
    wait_for_stage(service, "retriever")
    deadline = time.monotonic() + 60
    while True:  # the ingress learns of the new replica within a readiness refresh
        response = client.post(
            "/v1/rag/query", json={"question": "vault", "collection": "crash", "max_tokens": 4}
        )
        if response.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.5)

    assert response.status_code == 200, response.text
    assert response.json()["index_version"] == published["crash"]
