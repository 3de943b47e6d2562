"""The collections routes' HTTP behaviour, over a fake writer backend: what they pass on,
how they refuse, and the larger body limit of uploads. The real writer is exercised over
HTTP by tests/integration/test_collections_http.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from app_fakes import make_state
from fastapi.testclient import TestClient

from app.api import create_api
from app.config import RagAppConfig
from app.settings import Settings
from pipeline.messages import StageError
from pipeline.stages import StageUnavailable

JOB = {
    "id": "job-1",
    "collection": "docs",
    "action": "add",
    "status": "queued",
    "created_at": 1.0,
    "progress": 0.0,
}


@dataclass
class FakeCollections:
    """A CollectionsBackend answering `result` (or raising it) and recording each call."""

    result: Any = None
    calls: list[tuple[str, tuple]] = field(default_factory=list)

    def _answer(self, name: str, *args: Any, default: Any = None) -> Any:
        self.calls.append((name, args))
        if isinstance(self.result, Exception):
            raise self.result
        return self.result if self.result is not None else default

    async def create_collection(self, name):
        return self._answer("create", name, default={"name": name, "object": "collection"})

    async def delete_collection(self, name):
        return self._answer("delete", name, default={"name": name, "deleted": True})

    async def list_collections(self):
        return self._answer("list", default={"object": "list", "data": []})

    async def list_documents(self, name, offset, limit):
        default = {"object": "list", "data": [], "total": 0, "offset": offset}
        return self._answer("documents", name, offset, limit, default=default)

    async def submit(self, name, action, records, files, deletes):
        read = [(filename, await reader.read(), kind) for filename, reader, kind in files]
        return self._answer("submit", name, action, records, read, deletes, default=JOB)

    async def job(self, job_id):
        return self._answer("job", job_id, default=JOB | {"id": job_id})


@pytest.fixture
def backend() -> FakeCollections:
    return FakeCollections()


def client_of(backend: FakeCollections, config: RagAppConfig | None = None) -> TestClient:
    state = make_state(collections=backend, config=config)
    return TestClient(create_api(state), raise_server_exceptions=False)


@pytest.fixture
def client(backend) -> TestClient:
    return client_of(backend)


def error_of(response, status: int) -> dict:
    assert response.status_code == status, response.text
    return response.json()["error"]


def test_without_a_backend_the_routes_do_not_exist():
    client = TestClient(create_api(make_state()), raise_server_exceptions=False)

    assert client.get("/v1/collections").status_code == 404


def test_create_passes_the_name_and_answers_201(client, backend):
    response = client.post("/v1/collections", json={"name": "docs"})

    assert response.status_code == 201
    assert response.json()["name"] == "docs"
    assert backend.calls == [("create", ("docs",))]


@pytest.mark.parametrize("name", ["Docs", "a b", "-x", "x" * 64, "../etc"])
def test_a_bad_name_is_a_400_before_the_writer_is_called(client, backend, name):
    error = error_of(client.post("/v1/collections", json={"name": name}), 400)

    assert error["param"] == "name"
    assert backend.calls == []


def test_a_refusal_of_the_writer_keeps_its_status_and_code(backend):
    backend.result = StageError(409, "exists", param="name", code="collection_exists")

    error = error_of(client_of(backend).post("/v1/collections", json={"name": "docs"}), 409)

    assert error == {
        "message": error["message"],
        "type": "invalid_request_error",
        "param": "name",
        "code": "collection_exists",
    }
    assert error["message"].startswith("exists (request ")


def test_a_writer_at_capacity_is_a_503_with_retry_after(backend):
    backend.result = StageError(503, "queue full", "service_unavailable", code="overloaded")

    response = client_of(backend).get("/v1/jobs/job-9")

    assert error_of(response, 503)["code"] == "overloaded"
    assert response.headers["retry-after"] == "1"


def test_a_writer_without_a_replica_is_a_503_writer_unavailable(backend):
    backend.result = StageUnavailable("writer", "unavailable", "no running replica")

    response = client_of(backend).get("/v1/collections")

    assert error_of(response, 503)["code"] == "writer_unavailable"
    assert "retry-after" in response.headers


def test_json_documents_are_passed_on_as_records(client, backend):
    documents = [{"id": 7, "text": "Seven."}, {"id": "b", "title": "B", "text": "Bee."}]

    response = client.post("/v1/collections/docs/documents", json={"documents": documents})

    assert response.status_code == 202
    assert response.json()["id"] == "job-1"
    assert backend.calls == [(
        "submit",
        ("docs", "add", [{"id": 7, "title": None, "text": "Seven."},
                         {"id": "b", "title": "B", "text": "Bee."}], [], []),
    )]  # fmt: skip


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"documents": []}, "documents"),
        ({"documents": [{"id": "a"}]}, "documents.0.text"),
        ({"documents": [{"id": "a", "text": "x", "extra": 1}]}, "documents.0.extra"),
        ({"docs": []}, "documents"),
    ],
)
def test_malformed_documents_are_a_400_naming_the_field(client, backend, body, param):
    error = error_of(client.post("/v1/collections/docs/documents", json=body), 400)

    assert error["param"] == param
    assert backend.calls == []


def test_a_body_that_is_not_json_is_a_400(client):
    response = client.post(
        "/v1/collections/docs/documents",
        content=b"{nope",
        headers={"content-type": "application/json"},
    )

    assert error_of(response, 400)["code"] == "invalid_json"


def test_uploaded_files_are_passed_on_with_name_and_type(client, backend):
    files = [
        ("files", ("a.md", b"# A\nText.", "text/markdown")),
        ("other", ("b.pdf", b"%PDF-1.4", "application/pdf")),
    ]

    response = client.post("/v1/collections/docs/documents", files=files)

    assert response.status_code == 202
    [(_, (name, action, records, uploaded, deletes))] = backend.calls
    assert (name, action, records, deletes) == ("docs", "add", [], [])
    assert uploaded == [
        ("a.md", b"# A\nText.", "text/markdown"),
        ("b.pdf", b"%PDF-1.4", "application/pdf"),
    ]


def test_a_form_field_that_is_not_a_file_is_a_400(client, backend):
    response = client.post(
        "/v1/collections/docs/documents",
        data={"note": "hello"},
        files=[("files", ("a.txt", b"A.", "text/plain"))],
    )

    assert error_of(response, 400)["param"] == "note"
    assert backend.calls == []


def test_uploads_have_their_own_body_limit():
    config = RagAppConfig.model_validate(
        {"ingress": {"max_body_bytes": 1024}, "collections": {"max_upload_bytes": 4096}}
    )
    backend = FakeCollections()
    client = client_of(backend, config)
    text = "x" * 2000
    upload = {"documents": [{"id": "a", "text": text}]}

    assert client.post("/v1/collections/docs/documents", json=upload).status_code == 202
    too_big = {"documents": [{"id": "a", "text": text * 3}]}
    error = error_of(client.post("/v1/collections/docs/documents", json=too_big), 413)
    assert "4096 bytes" in error["message"]
    query = {"question": text}
    assert "1024 bytes" in error_of(client.post("/v1/rag/query", json=query), 413)["message"]


def test_an_upload_past_the_callers_bytes_in_flight_is_a_429_the_writer_never_sees():
    config = RagAppConfig.model_validate(
        {
            "collections": {
                "max_upload_bytes": 4096,
                "upload_bytes_in_flight_per_caller": 4096,
                "upload_bytes_in_flight": 8192,
            }
        }
    )
    backend = FakeCollections()
    client = client_of(backend, config)
    budget = client.app.state.upload_budget
    upload = {"documents": [{"id": "a", "text": "x" * 200}]}
    # An earlier upload of this caller (TestClient's address) still in flight.
    assert budget.reserve("address:testclient", 4000)

    refused = client.post("/v1/collections/docs/documents", json=upload)

    assert error_of(refused, 429)["code"] == "upload_budget_exceeded"
    assert refused.headers["retry-after"] == "1"
    assert backend.calls == []
    budget.release("address:testclient", 4000)
    assert client.post("/v1/collections/docs/documents", json=upload).status_code == 202
    assert budget.total_held == 0
    # Other routes never reserve: a query passes whatever uploads hold.
    assert budget.reserve("address:testclient", 4096)
    assert client.post("/v1/collections", json={"name": "more"}).status_code == 201


def test_with_keys_each_key_has_its_own_upload_budget():
    config = RagAppConfig.model_validate(
        {"collections": {"max_upload_bytes": 4096, "upload_bytes_in_flight_per_caller": 4096}}
    )
    backend = FakeCollections()
    state = make_state(
        collections=backend,
        config=config,
        settings=Settings(environment="development", api_keys=("key-a", "key-b")),
    )
    client = TestClient(create_api(state), raise_server_exceptions=False)
    upload = {"documents": [{"id": "a", "text": "x" * 200}]}
    assert client.app.state.upload_budget.reserve("key-a", 4000)

    def post(key: str):
        headers = {"Authorization": f"Bearer {key}"}
        return client.post("/v1/collections/docs/documents", json=upload, headers=headers)

    assert error_of(post("key-a"), 429)["code"] == "upload_budget_exceeded"
    assert post("key-b").status_code == 202
    # Without a valid key nothing is reserved: the guard answers 401 first.
    assert post("wrong").status_code == 401
    assert client.app.state.upload_budget.total_held == 4000


@pytest.mark.parametrize(
    ("collections", "message"),
    [
        ({"upload_bytes_in_flight_per_caller": 2048}, "at least max_upload_bytes"),
        (
            {"upload_bytes_in_flight_per_caller": 8192, "upload_bytes_in_flight": 4096},
            "at least upload_bytes_in_flight_per_caller",
        ),
    ],
)
def test_upload_budgets_below_the_largest_upload_are_refused(collections, message):
    with pytest.raises(ValueError, match=message):
        RagAppConfig.model_validate({"collections": {"max_upload_bytes": 4096, **collections}})


def test_a_document_id_with_slashes_is_deleted_by_its_whole_id(client, backend):
    response = client.delete("/v1/collections/docs/documents/guides/setup")

    assert response.status_code == 202
    assert backend.calls == [("submit", ("docs", "delete", [], [], ["guides/setup"]))]


def test_document_pages_are_bounded(client, backend):
    assert error_of(client.get("/v1/collections/docs/documents?limit=0"), 400)
    assert error_of(client.get("/v1/collections/docs/documents?offset=-1"), 400)

    response = client.get("/v1/collections/docs/documents?offset=5&limit=10")

    assert response.status_code == 200
    assert backend.calls == [("documents", ("docs", 5, 10))]


def test_a_query_names_its_collection_to_the_retriever(client_for, stages):
    client = client_for(stages=stages)

    response = client.post("/v1/rag/query", json={"question": "q?", "collection": "docs"})

    assert response.status_code == 200, response.text
    assert [search.collection for search in stages.searches] == ["docs"]
    assert response.json()["collection"] == "default"  # what the (fake) retrieval searched


def test_a_query_without_a_collection_searches_the_default(client_for, stages):
    client_for(stages=stages).post("/v1/rag/query", json={"question": "q?"})

    assert [search.collection for search in stages.searches] == [None]
