"""Scoped API keys on the real service: a key from RAG_API_KEYS_FILE reads and changes its
own collection and the shipped one's answers, and gets a 403 in OpenAI's shape everywhere
else; the admin keys of RAG_API_KEYS reach everything (tests/services.py writes the file)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
from services import API_KEY, TEAM_COLLECTION, TEAM_KEY

pytestmark = pytest.mark.integration

OTHER_COLLECTION = "other-team-notes"
JOB_TIMEOUT_S = 180
DOCUMENT = {"id": "x", "text": "X."}


@pytest.fixture(scope="module")
def http(shared_service) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=shared_service.base_url, timeout=120, trust_env=False) as client:
        yield client
        for name in (TEAM_COLLECTION, OTHER_COLLECTION):
            client.delete(f"/v1/collections/{name}", headers=as_(API_KEY))


def as_(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def assert_forbidden(response: httpx.Response, collection: str) -> None:
    assert response.status_code == 403, response.text
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("permission_error", "insufficient_scope")
    assert repr(collection) in error["message"]


def finished(http: httpx.Client, job: dict, key: str) -> dict:
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while job["status"] not in ("succeeded", "failed") and time.monotonic() < deadline:
        time.sleep(0.1)
        response = http.get(f"/v1/jobs/{job['id']}", headers=as_(key))
        assert response.status_code == 200, response.text
        job = response.json()
    return job


def test_a_scoped_key_works_in_its_collection_and_nowhere_else(http):
    team, admin = as_(TEAM_KEY), as_(API_KEY)
    assert (
        http.post("/v1/collections", json={"name": TEAM_COLLECTION}, headers=team).status_code
        == 201
    )
    added = http.post(
        f"/v1/collections/{TEAM_COLLECTION}/documents",
        json={"documents": [{"id": "kelp", "text": "Kelp farms grow on ropes in cold water."}]},
        headers=team,
    )
    assert added.status_code == 202, added.text
    assert finished(http, added.json(), TEAM_KEY)["status"] == "succeeded"
    asked = http.post(
        "/v1/rag/query",
        json={"question": "Where do kelp farms grow?", "collection": TEAM_COLLECTION,
              "max_tokens": 1, "citations": False},
        headers=team,
    )  # fmt: skip
    assert asked.status_code == 200, asked.text
    assert [s["id"] for s in asked.json()["sources"]] == ["kelp#0"]

    # Another team's collection: the admin key makes it, the scoped key cannot touch it.
    assert (
        http.post("/v1/collections", json={"name": OTHER_COLLECTION}, headers=admin).status_code
        == 201
    )
    other = f"/v1/collections/{OTHER_COLLECTION}"
    assert_forbidden(http.get(f"{other}/documents", headers=team), OTHER_COLLECTION)
    assert_forbidden(
        http.post(
            f"{other}/documents", json={"documents": [{"id": "x", "text": "X."}]}, headers=team
        ),
        OTHER_COLLECTION,
    )
    assert_forbidden(http.delete(other, headers=team), OTHER_COLLECTION)
    assert_forbidden(
        http.post("/v1/collections", json={"name": "a-third-team"}, headers=team), "a-third-team"
    )
    assert_forbidden(
        http.post(
            "/v1/rag/query",
            json={"question": "Anything?", "collection": OTHER_COLLECTION, "max_tokens": 1},
            headers=team,
        ),
        OTHER_COLLECTION,
    )
    listed = http.get("/v1/collections", headers=team).json()["data"]
    # The shipped collection is listed too: every key reads it.
    assert sorted(c["name"] for c in listed) == ["default", TEAM_COLLECTION]
    assert OTHER_COLLECTION in [
        c["name"] for c in http.get("/v1/collections", headers=admin).json()["data"]
    ]


def test_every_key_reads_the_shipped_collection_and_none_changes_it(http):
    default = http.post(
        "/v1/rag/query",
        json={"question": "What is a KV cache?", "max_tokens": 1, "citations": False},
        headers=as_(TEAM_KEY),
    )
    changed = http.post(
        "/v1/collections/default/documents",
        json={"documents": [{"id": "x", "text": "X."}]},
        headers=as_(TEAM_KEY),
    )

    assert default.status_code == 200, default.text
    assert changed.status_code == 403
    assert changed.json()["error"]["code"] != "insufficient_scope"  # read-only for everyone
