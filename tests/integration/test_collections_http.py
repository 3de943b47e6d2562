"""Collections over HTTP against the real application: create a collection, add documents
(JSON and uploaded .md/.html/.pdf files), ask questions answered from them, replace and
delete them, while queries run, with two retriever and two compressor replicas, so every
replica has to switch to each new version.

The session's shared service (vLLM inside Ray, real FAISS, BM25, sentence-transformers and
LLMLingua; tests/services.py), its collections in a temp dir; every test works on
collections of its own. Answers are kept short (a few tokens):
these tests are about what is retrieved, which the response's sources show.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from crafted_pdfs import slow_pdf
from services import PARSE_TIMEOUT_S, SECOND_KEY

from corpus.spool import SPOOL_DIR

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "data/examples"
JOB_TIMEOUT_S = 180

FILLER = [
    {"id": f"filler-{n}", "title": f"Filler {n}", "text": text}
    for n, text in enumerate(
        [
            "Glass is made by melting sand with soda ash and lime in a furnace.",
            "Honey bees communicate the direction of flowers with a waggle dance.",
            "The violin has four strings tuned in perfect fifths.",
            "Sourdough bread rises with wild yeast and lactic acid bacteria.",
            "Granite forms when magma cools slowly deep below the surface.",
        ]
    )
]


@pytest.fixture(scope="module")
def service(shared_service):
    """The shared service runs two retrievers and two compressors (tests/services.py)."""
    assert shared_service.config["retriever"]["deployment"]["num_replicas"] == 2
    assert shared_service.config["compression"]["deployment"]["num_replicas"] == 2
    return shared_service


@pytest.fixture(scope="module")
def client(service) -> Iterator[httpx.Client]:
    with service.client() as http:
        yield http


def create(client: httpx.Client, name: str) -> dict:
    response = client.post("/v1/collections", json={"name": name})
    assert response.status_code == 201, response.text
    return response.json()


def finished(client: httpx.Client, job: dict) -> dict:
    """Poll the job until it ends; its last status."""
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while time.monotonic() < deadline:
        response = client.get(f"/v1/jobs/{job['id']}")
        assert response.status_code == 200, response.text
        job = response.json()
        if job["status"] in ("succeeded", "failed"):
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {job['id']} still {job['status']} after {JOB_TIMEOUT_S} s")


def add(client: httpx.Client, name: str, documents: list[dict]) -> dict:
    response = client.post(f"/v1/collections/{name}/documents", json={"documents": documents})
    assert response.status_code == 202, response.text
    job = finished(client, response.json())
    assert job["status"] == "succeeded", job
    return job


def delete_document(client: httpx.Client, name: str, doc_id: str) -> dict:
    response = client.delete(f"/v1/collections/{name}/documents/{doc_id}")
    assert response.status_code == 202, response.text
    job = finished(client, response.json())
    assert job["status"] == "succeeded", job
    return job


def query(client: httpx.Client, name: str, question: str, **options) -> dict:
    body = {"question": question, "collection": name, "max_tokens": 4, **options}
    response = client.post("/v1/rag/query", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def documents_of(answer: dict) -> set[str]:
    return {source["id"].split("#")[0] for source in answer["sources"]}


def assert_error(response: httpx.Response, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    if code is not None:
        assert error["code"] == code
    return error


def test_readiness_lists_the_writer(service):
    ready = httpx.get(f"{service.base_url}/readyz").json()

    assert ready["stages"]["writer"] == "ready"
    assert ready["degraded"] == []


def test_a_collection_is_created_listed_and_deleted(client):
    created = create(client, "lifecycle")

    assert created == {
        "name": "lifecycle",
        "object": "collection",
        "read_only": False,
        "documents": 0,
        "chunks": 0,
        "version": None,
        "updated_at": None,
    }
    listed = {c["name"]: c for c in client.get("/v1/collections").json()["data"]}
    assert listed["lifecycle"] == created
    assert listed["default"]["read_only"] is True and listed["default"]["chunks"] > 0
    assert_error(client.post("/v1/collections", json={"name": "lifecycle"}), 409)
    deleted = client.delete("/v1/collections/lifecycle")
    assert deleted.status_code == 200, deleted.text
    assert deleted.json() == {"name": "lifecycle", "object": "collection", "deleted": True}
    assert "lifecycle" not in {c["name"] for c in client.get("/v1/collections").json()["data"]}
    assert_error(client.delete("/v1/collections/lifecycle"), 404, "collection_not_found")


@pytest.mark.parametrize(
    "body", [{"name": "Upper"}, {"name": "../up"}, {"name": ""}, {}, {"name": "a", "x": 1}]
)
def test_a_bad_collection_name_is_a_400(client, body):
    error = assert_error(client.post("/v1/collections", json=body), 400)

    assert error["type"] == "invalid_request_error"


def test_the_default_collection_is_read_only(client):
    documents = {"documents": [{"id": "x", "text": "Some text."}]}

    assert_error(
        client.post("/v1/collections/default/documents", json=documents),
        403,
        "collection_read_only",
    )
    assert_error(client.delete("/v1/collections/default"), 403, "collection_read_only")
    listed = client.get("/v1/collections/default/documents", params={"limit": 1000}).json()
    assert listed["total"] == len(listed["data"]) > 0


def test_queries_name_collections_that_exist_and_hold_documents(client):
    create(client, "empty")
    asked = {"question": "What is in it?", "max_tokens": 4}

    assert_error(client.post("/v1/rag/query", json={**asked, "collection": "empty"}), 409,
                 "collection_empty")  # fmt: skip
    error = assert_error(
        client.post("/v1/rag/query", json={**asked, "collection": "nowhere"}),
        404,
        "collection_not_found",
    )
    assert error["param"] == "collection"
    assert_error(client.post("/v1/rag/query", json={**asked, "collection": "Bad Name"}), 400)
    assert_error(
        client.post("/v1/collections/nowhere/documents", json={"documents": [{"id": 1,
                    "text": "x"}]}), 404, "collection_not_found",
    )  # fmt: skip
    assert_error(client.get("/v1/jobs/job-0000"), 404, "job_not_found")


def test_the_collection_routes_need_the_api_key(service):
    response = httpx.get(f"{service.base_url}/v1/collections")

    assert_error(response, 401)


FERRIES = {"id": "ferries", "title": "Ferries", "text": (
    "Tessaly Station runs three orbital ferries to the moon Karsk. The largest, the Amber "
    "Heron, carries 340 passengers.")}  # fmt: skip


@pytest.fixture(scope="module")
def facts(client) -> dict:
    """The collection "facts" with the filler and the ferries; the job that filled it."""
    create(client, "facts")
    return add(client, "facts", [*FILLER, FERRIES])


def test_added_documents_are_retrieved_on_the_next_query(client, facts):
    job = facts

    answer = query(client, "facts", "How many passengers does the Amber Heron carry?")

    assert job["counts"]["added"] == 6 and job["counts"]["documents"] == 6
    assert job["version"] and job["progress"] == 1.0
    assert answer["collection"] == "facts"
    assert answer["index_version"] == job["version"]
    assert answer["sources"][0]["id"].startswith("ferries#")
    assert answer["degraded"] is None  # the compressor read the same version's sentences


def test_the_chat_endpoint_answers_from_a_collection(service, client, facts):
    question = "How many passengers does the Amber Heron carry?"
    chat = client.post("/v1/chat/completions", json={
        "model": service.config["generator"]["model_id"],
        "messages": [{"role": "user", "content": question}],
        "max_tokens": 4,
        "rag": {"collection": "facts"},
    })  # fmt: skip

    assert chat.status_code == 200, chat.text
    assert chat.json()["sources"][0]["id"].startswith("ferries#")


def test_uploaded_files_become_documents_and_unreadable_ones_are_reported(client):
    create(client, "uploads")
    files = [
        ("files", (path.name, path.read_bytes(), content_type))
        for path, content_type in [
            (EXAMPLES / "lantern-festival.pdf", "application/pdf"),
            (EXAMPLES / "kelp-farms.html", "text/html"),
            (EXAMPLES / "orbital-ferries.md", "text/markdown"),
        ]
    ] + [("files", ("broken.pdf", b"%PDF-1.4 not really", "application/pdf"))]

    response = client.post("/v1/collections/uploads/documents", files=files)

    assert response.status_code == 202, response.text
    job = finished(client, response.json())
    assert job["status"] == "succeeded", job
    assert job["counts"]["added"] == 3 and job["counts"]["unreadable"] == 1
    assert [error["document"] for error in job["errors"]] == ["broken.pdf"]
    listed = client.get("/v1/collections/uploads/documents").json()
    titles = {document["id"]: document["title"] for document in listed["data"]}
    assert titles == {
        "lantern-festival": "Quennevic lantern festival",
        "kelp-farms": "Pelmarra kelp farms",
        "orbital-ferries": "Orbital ferries of Tessaly Station",
    }
    answer = query(client, "uploads", "How many paper lanterns are lit at the festival?")
    assert answer["sources"][0]["id"].startswith("lantern-festival#")
    answer = query(client, "uploads", "What is the name of the kelp harvesting barge?")
    assert answer["sources"][0]["id"].startswith("kelp-farms#")


def test_a_file_of_several_pieces_arrives_whole_and_leaves_nothing_in_the_spool(service, client):
    # 2.5 MiB of script (hidden text) with the one visible sentence after it: the file crosses
    # to the writer in three pieces (deployments.collection_handles), and the sentence is
    # found only if the last piece arrived in order. The job removes its spooled file.
    create(client, "pieces")
    script = "<script>" + "var x = 0;\n" * (5 * (1 << 20) // 22) + "</script>"
    page = f"<html><body>{script}<p>The glass bridge of Omberlin sings at dawn.</p></body></html>"

    response = client.post(
        "/v1/collections/pieces/documents",
        files=[("files", ("glass-bridge.html", page.encode(), "text/html"))],
    )

    assert response.status_code == 202, response.text
    assert len(page) > 2 * (1 << 20)
    job = finished(client, response.json())
    assert job["status"] == "succeeded" and job["counts"]["added"] == 1, job
    answer = query(client, "pieces", "What sings at dawn in Omberlin?")
    assert answer["sources"][0]["id"].startswith("glass-bridge#")
    spool = Path(service.config["collections"]["root"]) / SPOOL_DIR
    assert spool.is_dir() and list(spool.iterdir()) == []


def test_a_pdf_that_keeps_the_parser_busy_fails_alone_and_other_jobs_go_on(client):
    # Four pages whose 4 KB streams inflate to 5 MB of operators that show nothing: pypdf would
    # walk them for 20 s here (many such pages: for hours). The writer parses it in a child
    # process stopped at the parse limit; the job's other file and the next job are served.
    create(client, "crafted")
    create(client, "bystander")
    files = [
        ("files", ("slow.pdf", slow_pdf(pages=4), "application/pdf")),
        ("files", ("notes.md", b"# Notes\nThe crafted file did not stop this one.", None)),
    ]

    crafted = client.post("/v1/collections/crafted/documents", files=files)
    bystander = client.post(
        "/v1/collections/bystander/documents",
        json={"documents": [{"id": "calm", "text": "Nothing here is crafted."}]},
    )

    assert crafted.status_code == bystander.status_code == 202
    job = finished(client, crafted.json())
    assert job["status"] == "succeeded" and job["counts"]["added"] == 1, job
    assert job["errors"] == [
        {"document": "slow.pdf", "message": f"slow.pdf: parsing took longer than "
         f"{PARSE_TIMEOUT_S:g} s and was stopped; the file was skipped"}
    ]  # fmt: skip
    assert finished(client, bystander.json())["status"] == "succeeded"
    assert query(client, "crafted", "What did the crafted file not stop?")["sources"]


def test_an_upload_past_the_keys_bytes_in_flight_is_refused_while_another_streams(service, client):
    # The shared service lets one key hold one largest upload in flight (tests/services.py):
    # a chunked upload reserves that much until it ends, so the key's next one is refused
    # unread, while another key's goes through.
    create(client, "upload-budget")
    url = "/v1/collections/upload-budget/documents"
    done = threading.Event()
    sending = threading.Event()
    answers: list[httpx.Response] = []

    def slow_body() -> Iterator[bytes]:
        yield b'{"documents": ['
        sending.set()  # its headers are sent: the next probe comes after them
        while not done.is_set():
            yield b" "
            time.sleep(0.05)
        yield b'{"id": "slow", "text": "A body sent slowly."}]}'

    def hold() -> None:
        with service.client() as streaming:
            answers.append(streaming.post(url, content=slow_body()))

    def start_holding() -> threading.Thread:
        sending.clear()
        answers.clear()
        thread = threading.Thread(target=hold)
        thread.start()
        return thread

    holder = start_holding()
    try:
        for _ in range(3):
            # Probe only once the held upload is on its way.
            assert sending.wait(timeout=30)
            # Until the chunked upload has reached the ingress and holds its share. The holder
            # must still be sending then: if it was answered, its answer says why (a CI run once
            # polled 30 s here without seeing the reservation and never showed the holder's).
            deadline = time.monotonic() + 60
            while holder.is_alive():
                refused = client.post(url, json={"documents": [FILLER[0]]})
                if refused.status_code != 202 or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            if holder.is_alive() or [a.status_code for a in answers] != [429]:
                break
            # A probe still in flight when the held upload arrived took part of the key's
            # budget, and the held one was refused (CI runs, 2026-12-06 and 2026-12-07): the
            # race is the test's own, not what it checks. Hold again.
            holder.join(timeout=60)
            holder = start_holding()
        assert holder.is_alive(), [(answer.status_code, answer.text) for answer in answers]
        assert_error(refused, 429, "upload_budget_exceeded")
        assert refused.headers["retry-after"]
        other_key = {"Authorization": f"Bearer {SECOND_KEY}"}
        other = httpx.post(
            f"{service.base_url}{url}", json={"documents": [FILLER[1]]}, headers=other_key
        )
        assert other.status_code == 202, other.text
    finally:
        done.set()
        holder.join(timeout=60)
    assert [answer.status_code for answer in answers] == [202]
    # Its reservation ended with it: the key may upload again.
    assert client.post(url, json={"documents": [FILLER[2]]}).status_code == 202
    client.delete("/v1/collections/upload-budget")


def test_a_replaced_document_is_served_only_in_its_new_text(client):
    create(client, "replace")
    add(client, "replace", [*FILLER, {"id": "refunds", "text": "The refund window is 14 days."}])

    job = add(client, "replace", [{"id": "refunds", "text": "The refund window is 45 days."}])
    answer = query(client, "replace", "How long is the refund window?", include_context=True)

    assert job["counts"]["replaced"] == 1 and job["counts"]["documents"] == 6
    assert job["counts"]["embedded_chunks"] == 1  # the other documents kept their vectors
    context = " ".join(passage["text"] for passage in answer["context"])
    assert "45 days" in context and "14 days" not in context


def test_a_deleted_document_is_never_retrieved_again(client):
    create(client, "deletes")
    secret = {"id": "secret", "text": "The vault code of the Orlan bank is 7731."}
    add(client, "deletes", [*FILLER, secret])
    assert "secret" in documents_of(query(client, "deletes", "What is the vault code?"))

    job = delete_document(client, "deletes", "secret")
    questions = [
        "What is the vault code?", "Orlan bank vault code", "7731", "Which bank has a vault?",
        "Tell me about glass.", "What does the code open?",
    ]  # fmt: skip
    answers = [query(client, "deletes", questions[i % len(questions)], top_k=20) for i in range(30)]

    assert job["counts"]["deleted"] == 1 and job["counts"]["documents"] == 5
    assert all("secret" not in documents_of(answer) for answer in answers)
    assert {answer["index_version"] for answer in answers} == {job["version"]}
    listed = client.get("/v1/collections/deletes/documents").json()
    assert "secret" not in {document["id"] for document in listed["data"]}
    missing = client.delete("/v1/collections/deletes/documents/secret")
    assert finished(client, missing.json())["counts"]["not_found"] == 1


def test_updates_while_queries_run_fail_none_and_each_query_reads_one_version(client, service):
    """Two clients query the collection without pause while documents are added, replaced
    and deleted; every answer must be a 200 whose sources all exist in the version it names,
    and no query that starts after a job succeeded may name an older version."""
    create(client, "live")
    first = add(client, "live", FILLER)
    contents = {first["version"]: {d["id"] for d in FILLER}}
    succeeded_at = {first["version"]: time.monotonic()}
    answers: list[tuple[float, int, dict]] = []
    stop = threading.Event()

    def keep_asking(seed: int) -> None:
        rng = random.Random(seed)
        with service.client() as http:
            while not stop.is_set():
                started = time.monotonic()
                question = rng.choice(["What is item three?", "Tell me about bees.", "glass"])
                body = {"question": question, "collection": "live", "max_tokens": 2, "top_k": 8}
                response = http.post("/v1/rag/query", json=body)
                answers.append((started, response.status_code, response.json()))

    def answered_since(count: int, more: int = 3, timeout_s: float = 60) -> None:
        """Let `more` answers arrive after the first `count`, so queries straddle each job."""
        deadline = time.monotonic() + timeout_s
        while len(answers) < count + more and time.monotonic() < deadline:
            time.sleep(0.1)

    askers = [threading.Thread(target=keep_asking, args=(seed,)) for seed in (1, 2)]
    for asker in askers:
        asker.start()
    try:
        held = {d["id"] for d in FILLER}
        for n in range(4):
            answered_since(len(answers))
            item = {"id": f"item-{n}", "text": f"Item {n} of the catalogue is a brass compass."}
            job = add(client, "live", [item])
            held = held | {item["id"]}
            contents[job["version"]], succeeded_at[job["version"]] = set(held), time.monotonic()
        answered_since(len(answers))
        job = delete_document(client, "live", "item-0")
        held = held - {"item-0"}
        contents[job["version"]], succeeded_at[job["version"]] = set(held), time.monotonic()
        answered_since(len(answers))
    finally:
        stop.set()
        for asker in askers:
            asker.join(timeout=120)

    assert len(answers) >= 15
    assert [status for _, status, _ in answers if status != 200] == []
    order = list(succeeded_at)  # versions in publish order
    for started, _, answer in answers:
        version = answer["index_version"]
        assert version in contents, version
        assert documents_of(answer) <= contents[version]
        assert answer["degraded"] is None
        newest_known = max(
            (order.index(v) for v, at in succeeded_at.items() if at <= started), default=0
        )
        assert order.index(version) >= newest_known, (
            "a query read a version older than one published before it started"
        )


def test_deleting_a_collection_ends_its_queries(client):
    create(client, "gone")
    add(client, "gone", FILLER[:2])

    assert client.delete("/v1/collections/gone").status_code == 200
    response = client.post("/v1/rag/query", json={"question": "glass", "collection": "gone"})

    assert_error(response, 404, "collection_not_found")
