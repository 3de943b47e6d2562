"""app.keys and the scope checks over HTTP: which key may read or change which collection,
on every collections, documents, jobs and query route (fakes behind the HTTP layer)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from app_fakes import FakeStages, make_state
from fastapi.testclient import TestClient

from app.api import create_api
from app.config import RagAppConfig
from app.keys import ADMIN, Grant, KeyFileError, grant_of, load_key_file, path_refusal
from app.settings import Settings, UnsafeSettingsError, load_settings

ADMIN_KEY = "admin-key-0123456789"
TEAM_KEY = "team-key-0123456789ab"  # read and write "notes"
READER_KEY = "reader-key-0123456789"  # read "notes"
JOB = {"id": "job-1", "object": "job", "collection": "notes", "action": "add",
       "status": "queued", "created_at": 1.0, "progress": 0.0}  # fmt: skip


class Collections:
    """A writer backend holding the collections notes and secret, recording each call."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def create_collection(self, name):
        self.calls.append(f"create {name}")
        return {"name": name, "object": "collection"}

    async def delete_collection(self, name):
        self.calls.append(f"delete {name}")
        return {"name": name, "object": "collection", "deleted": True}

    async def list_collections(self):
        data = [{"name": n, "object": "collection"} for n in ("notes", "secret")]
        return {"object": "list", "data": data}

    async def list_documents(self, name, offset, limit):
        self.calls.append(f"documents {name}")
        return {"object": "list", "data": [], "total": 0, "offset": offset}

    async def submit(self, name, action, records, files, deletes):
        self.calls.append(f"{action} {name}")
        return JOB | {"collection": name, "action": action}

    async def job(self, job_id):
        return JOB | {"id": job_id, "collection": "secret" if job_id == "job-s" else "notes"}


def settings() -> Settings:
    return Settings(
        environment="production",
        api_keys=(ADMIN_KEY, TEAM_KEY, READER_KEY),
        grants={
            TEAM_KEY: grant_of(["read:notes", "write:notes"]),
            READER_KEY: grant_of(["read:notes"]),
        },
    )


@pytest.fixture
def backend() -> Collections:
    return Collections()


@pytest.fixture
def http(backend) -> TestClient:
    state = make_state(stages=FakeStages(), settings=settings(), collections=backend)
    return TestClient(create_api(state), raise_server_exceptions=False)


def as_(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def assert_forbidden(response, action: str, collection: str) -> None:
    assert response.status_code == 403, response.text
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("permission_error", "insufficient_scope")
    assert f"may not {action} collection '{collection}'" in error["message"]


# --- scopes ---------------------------------------------------------------------------------


def test_scopes_make_grants():
    team = grant_of(["read:notes", "write:drafts"])

    assert team.can_read("notes") and team.can_read("drafts") and team.can_read("default")
    assert team.can_write("drafts") and not team.can_write("notes")
    assert not team.can_read("secret")
    assert grant_of(["read:*"]).can_read("anything") and not grant_of(["read:*"]).can_write("x")
    assert grant_of(["write:*"]).can_write("anything")
    assert grant_of(["read:notes", "admin"]) == ADMIN
    assert Grant().can_read("default") and not Grant().can_write("default")


@pytest.mark.parametrize("scope", ["reader", "read:", "read:Notes", "delete:notes", "read:a b"])
def test_an_unknown_scope_is_refused_by_name(scope):
    with pytest.raises(KeyFileError, match="unknown scope"):
        grant_of([scope])


def test_a_key_file_is_read_and_refused_when_malformed(tmp_path: Path):
    good = tmp_path / "keys.yaml"
    good.write_text(f"- key: {TEAM_KEY}\n  scopes: [read:notes, write:notes]\n")

    assert load_key_file(good) == {TEAM_KEY: grant_of(["read:notes", "write:notes"])}
    for text, match in [
        ("key: x", "a list"),
        ("- key: x\n", "exactly key and scopes"),
        ("- {key: x, scopes: [read:a], extra: 1}", "exactly key and scopes"),
        ("- {key: x, scopes: read:a}", "scopes a list"),
        ("- {key: x, scopes: []}\n- {key: x, scopes: []}", "appears twice"),
        ("- [", "cannot read"),
    ]:
        good.write_text(text)
        with pytest.raises(KeyFileError, match=match):
            load_key_file(good)


def test_settings_join_both_kinds_of_key(tmp_path: Path):
    keys = tmp_path / "keys.yaml"
    keys.write_text(f"- {{key: {TEAM_KEY}, scopes: [write:notes]}}\n")

    loaded = load_settings({"RAG_API_KEYS": ADMIN_KEY, "RAG_API_KEYS_FILE": str(keys)})

    assert loaded.api_keys == (ADMIN_KEY, TEAM_KEY)
    assert loaded.grant(ADMIN_KEY) == ADMIN
    assert loaded.grant(TEAM_KEY).can_write("notes") and not loaded.grant(TEAM_KEY).admin


def test_settings_refuse_a_bad_key_file_a_key_in_both_and_short_keys_in_production(tmp_path):
    keys = tmp_path / "keys.yaml"
    keys.write_text("- {key: short, scopes: [read:notes]}\n")
    file_only = {"RAG_ENV": "production", "RAG_API_KEYS_FILE": str(keys)}

    with pytest.raises(UnsafeSettingsError, match="at least 16 characters"):
        load_settings(file_only)
    with pytest.raises(UnsafeSettingsError, match="both in RAG_API_KEYS"):
        load_settings({"RAG_API_KEYS": "short", "RAG_API_KEYS_FILE": str(keys)})
    with pytest.raises(UnsafeSettingsError, match="RAG_API_KEYS_FILE: cannot read"):
        load_settings({"RAG_API_KEYS_FILE": str(tmp_path / "missing.yaml")})


def test_the_path_says_which_collection_and_the_method_what_is_done():
    reader = grant_of(["read:notes"])

    assert path_refusal(reader, "GET", "/v1/collections/notes/documents") is None
    assert path_refusal(reader, "POST", "/v1/collections/notes/documents") is not None
    assert path_refusal(reader, "GET", "/v1/collections/secret/documents") is not None
    assert path_refusal(reader, "DELETE", "/v1/collections/notes") is not None
    assert path_refusal(reader, "GET", "/v1/collections") is None  # filtered by the route
    assert path_refusal(reader, "POST", "/v1/rag/query") is None  # the body names it


# --- every route over HTTP ------------------------------------------------------------------


def test_creating_a_collection_needs_write_on_its_name(http, backend):
    created = http.post("/v1/collections", json={"name": "notes"}, headers=as_(TEAM_KEY))

    assert created.status_code == 201
    assert_forbidden(
        http.post("/v1/collections", json={"name": "secret"}, headers=as_(TEAM_KEY)),
        "change",
        "secret",
    )
    assert_forbidden(
        http.post("/v1/collections", json={"name": "notes"}, headers=as_(READER_KEY)),
        "change",
        "notes",
    )
    assert backend.calls == ["create notes"]


def test_the_list_shows_only_the_collections_a_key_may_read(http):
    def names(key: str) -> list[str]:
        response = http.get("/v1/collections", headers=as_(key))
        assert response.status_code == 200
        return [c["name"] for c in response.json()["data"]]

    assert names(ADMIN_KEY) == ["notes", "secret"]
    assert names(TEAM_KEY) == names(READER_KEY) == ["notes"]


def test_deleting_a_collection_needs_write(http, backend):
    assert http.delete("/v1/collections/notes", headers=as_(TEAM_KEY)).status_code == 200
    assert_forbidden(
        http.delete("/v1/collections/notes", headers=as_(READER_KEY)), "change", "notes"
    )
    assert_forbidden(
        http.delete("/v1/collections/secret", headers=as_(TEAM_KEY)), "change", "secret"
    )
    assert backend.calls == ["delete notes"]


def test_documents_are_listed_with_read_and_changed_with_write(http, backend):
    path = "/v1/collections/{}/documents"
    body = {"documents": [{"id": "a", "text": "A."}]}

    assert http.get(path.format("notes"), headers=as_(READER_KEY)).status_code == 200
    assert http.post(path.format("notes"), json=body, headers=as_(TEAM_KEY)).status_code == 202
    assert_forbidden(
        http.post(path.format("notes"), json=body, headers=as_(READER_KEY)), "change", "notes"
    )
    assert_forbidden(http.get(path.format("secret"), headers=as_(TEAM_KEY)), "read", "secret")
    assert_forbidden(
        http.delete(f"{path.format('notes')}/a", headers=as_(READER_KEY)), "change", "notes"
    )
    assert backend.calls == ["documents notes", "add notes"]


def test_an_upload_the_key_may_not_make_is_refused_before_its_body_is_read(backend):
    api = create_api(make_state(settings=settings(), collections=backend))
    status, asked = asyncio.run(
        _post_without_reading(api, "/v1/collections/secret/documents", TEAM_KEY)
    )

    assert (status, asked) == (403, 0)


def test_a_job_is_read_with_read_on_its_collection(http):
    assert http.get("/v1/jobs/job-1", headers=as_(READER_KEY)).status_code == 200
    assert_forbidden(http.get("/v1/jobs/job-s", headers=as_(READER_KEY)), "read", "secret")
    assert http.get("/v1/jobs/job-s", headers=as_(ADMIN_KEY)).status_code == 200


def test_queries_need_read_on_the_collection_and_every_key_reads_the_default(http):
    def ask(key: str, **extra) -> object:
        return http.post("/v1/rag/query", json={"question": "Q?", **extra}, headers=as_(key))

    assert ask(READER_KEY).status_code == 200  # the shipped corpus
    assert ask(READER_KEY, collection="notes").status_code == 200
    assert_forbidden(ask(READER_KEY, collection="secret"), "read", "secret")
    assert ask(ADMIN_KEY, collection="secret").status_code == 200
    chat = http.post(
        "/v1/chat/completions",
        json={
            "model": RagAppConfig().generator.model_id,
            "messages": [{"role": "user", "content": "Q?"}],
            "rag": {"collection": "secret"},
        },
        headers=as_(TEAM_KEY),
    )
    assert_forbidden(chat, "read", "secret")


async def _post_without_reading(api, path: str, key: str) -> tuple[int, int]:
    asked = 0
    sent: list[dict] = []

    async def receive():
        nonlocal asked
        asked += 1
        return {"type": "http.request", "body": b"x" * 65536, "more_body": True}

    async def send(message):
        sent.append(message)

    auth = f"Bearer {key}".encode()
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8000),
        "headers": [(b"transfer-encoding", b"chunked"), (b"authorization", auth)],
    }  # fmt: skip
    await api(scope, receive, send)
    return sent[0]["status"], asked
