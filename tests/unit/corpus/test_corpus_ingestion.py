"""corpus.ingestion: a job's outcome, per-document errors, what a failure leaves served,
and job records that outlive the writer. The embedder is faked (these tests are about the
job's bookkeeping); the catalog tests at the end read what the jobs published, as the
retriever and compressor replicas do."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from crafted_pdfs import slow_pdf
from index_fakes import HashEmbedder

from corpus import ingestion
from corpus.catalog import CollectionEmpty, RetrieverCatalog, SentenceStoreCatalog
from corpus.collection_store import CollectionNotFound, CollectionStore
from corpus.ingestion import Ingestor, JobBook, JobInput, Upload
from corpus.parse_worker import BoundedParser, ParseLimits
from pipeline.messages import DEFAULT_COLLECTION
from retrieval.chunking import ChunkingParams
from retrieval.index import FaissIndex
from retrieval.retriever import Retriever

MODEL = "hash-embedder"
FACTS = (
    {"id": "bees", "text": "Honey bees dance to show where flowers are."},
    {"id": "glass", "title": "Glass", "text": "Glass is made by melting sand."},
)


@pytest.fixture
def store(tmp_path: Path) -> CollectionStore:
    store = CollectionStore(tmp_path / "collections")
    with store.writer():
        store.create("docs")
    return store


@pytest.fixture
def ingestor(store) -> Ingestor:
    return Ingestor(store, HashEmbedder(), MODEL, ChunkingParams(32, 4))


@pytest.fixture
def jobs(store) -> JobBook:
    return JobBook(store.root)


@pytest.fixture
def upload(tmp_path: Path):
    """An uploaded file as the writer's spool holds it: its bytes on disk."""

    def spooled(filename: str, content: bytes) -> Upload:
        path = tmp_path / "spool" / filename
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(content)
        return Upload(filename, path)

    return spooled


def run(ingestor: Ingestor, jobs: JobBook, work: JobInput, collection: str = "docs"):
    job = jobs.new(collection, "delete" if work.deletes else "add")
    ingestor.run(job, work, jobs.save)
    return jobs.get(job.id)


def test_an_add_publishes_a_version_and_the_job_says_what_it_did(ingestor, jobs, store):
    job = run(ingestor, jobs, JobInput(records=FACTS))

    assert job.status == "succeeded" and job.progress == 1.0
    assert job.version == store.current("docs").version
    assert job.counts == {
        "received": 2, "unreadable": 0, "added": 2, "replaced": 0, "deleted": 0,
        "not_found": 0, "documents": 2, "chunks": 2, "embedded_chunks": 2,
    }  # fmt: skip
    assert job.errors == []
    assert job.started_at <= job.finished_at


def test_unreadable_documents_are_reported_and_the_rest_published(ingestor, jobs, upload):
    work = JobInput(
        records=(*FACTS, {"id": "empty", "text": "  "}, {"id": "bees", "text": "Again."}),
        files=(upload("notes.md", b"# Notes\nKept."), upload("x.exe", b"MZ")),
    )

    job = run(ingestor, jobs, work)

    assert job.status == "succeeded"
    assert job.counts["added"] == 3 and job.counts["unreadable"] == 3
    assert [error["document"] for error in job.errors] == ["documents[2]", "documents[3]", "x.exe"]
    assert "more than once" in job.errors[1]["message"]


def test_a_pdf_that_keeps_the_parser_busy_fails_alone_and_the_job_goes_on(store, jobs, upload):
    parse = BoundedParser(ParseLimits(timeout_s=1))
    ingestor = Ingestor(store, HashEmbedder(), MODEL, ChunkingParams(32, 4), parse=parse)
    work = JobInput(files=(upload("slow.pdf", slow_pdf()), upload("notes.md", b"# Notes\nKept.")))

    job = run(ingestor, jobs, work)

    assert job.status == "succeeded" and job.counts["added"] == 1
    assert job.errors == [
        {"document": "slow.pdf", "message": "slow.pdf: parsing took longer than 1 s and was "
         "stopped; the file was skipped"}
    ]  # fmt: skip


def test_a_job_with_nothing_readable_fails_and_publishes_nothing(ingestor, jobs, store, upload):
    job = run(ingestor, jobs, JobInput(files=(upload("x.exe", b"MZ"),)))

    assert job.status == "failed"
    assert job.errors[-1]["message"] == "no document could be read"
    assert store.current("docs") is None


def test_a_build_that_fails_leaves_the_last_version_served(ingestor, jobs, store, monkeypatch):
    first = run(ingestor, jobs, JobInput(records=FACTS))

    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(ingestion, "build_next_version", broken)
    job = run(ingestor, jobs, JobInput(records=({"id": "new", "text": "New text."},)))

    assert job.status == "failed"
    assert job.errors == [{"document": "", "message": "internal error: RuntimeError"}]
    assert store.current("docs").version == first.version
    assert not list((store.root / "docs").glob(".staging-*"))  # nothing half-built left


def test_a_job_for_a_deleted_collection_fails(ingestor, jobs, store):
    with store.writer():
        store.delete("docs")

    job = run(ingestor, jobs, JobInput(records=FACTS))

    assert job.status == "failed"
    assert "docs" in job.errors[-1]["message"]


def test_deleting_an_unknown_id_is_reported_not_fatal(ingestor, jobs):
    run(ingestor, jobs, JobInput(records=FACTS))

    job = run(ingestor, jobs, JobInput(deletes=("bees", "nobody")))

    assert job.status == "succeeded"
    assert job.counts["deleted"] == 1 and job.counts["not_found"] == 1
    assert job.errors == [{"document": "nobody", "message": "no such document"}]


def test_job_records_outlive_the_writer_and_unfinished_ones_fail_on_restart(store):
    book = JobBook(store.root)
    done = book.new("docs", "add")
    done.status = "succeeded"
    book.save(done)
    waiting = book.new("docs", "add")

    reopened = JobBook(store.root)
    failed = reopened.fail_unfinished("the writer restarted")

    assert failed == [waiting.id]
    assert reopened.get(done.id).status == "succeeded"
    assert reopened.get(waiting.id).status == "failed"
    assert reopened.get(waiting.id).errors[-1]["message"] == "the writer restarted"


def test_only_the_latest_finished_jobs_are_kept(store):
    book = JobBook(store.root, keep=2)
    finished = []
    for _ in range(4):
        job = book.new("docs", "add")
        job.status = "failed"
        book.save(job)
        finished.append(job.id)
    queued = book.new("docs", "add")

    assert [book.get(job_id) is not None for job_id in finished] == [False, False, True, True]
    assert book.get(queued.id) is not None
    assert len(list((store.root / ingestion.JOBS_DIR).glob("job-*.json"))) == 3


def test_a_record_read_back_is_a_copy_the_runner_cannot_change_under_the_reader(store):
    book = JobBook(store.root)
    job = book.new("docs", "add")

    job.counts["added"] = 5

    assert book.get(job.id).counts == {}


# --- the catalogs: what the replicas serve after a job -------------------------------------


@pytest.fixture
def default_retriever(tmp_path) -> Retriever:
    """A 'shipped corpus': one version of another store, opened as the default."""
    other = CollectionStore(tmp_path / "shipped")
    with other.writer():
        other.create("corpus")
    Ingestor(other, HashEmbedder(), MODEL, ChunkingParams(32, 4)).run(
        JobBook(other.root).new("corpus", "add"), JobInput(records=FACTS[:1])
    )
    index = other.current("corpus").path
    return Retriever(HashEmbedder(), FaissIndex.load(index, with_sentence_embeddings=False))


def test_the_catalog_follows_current_and_a_query_keeps_its_version(
    ingestor, jobs, store, default_retriever
):
    catalog = RetrieverCatalog(
        default_retriever, store, functools.partial(default_retriever.open_version)
    )
    with pytest.raises(CollectionEmpty):
        catalog.retriever_for("docs")
    first = run(ingestor, jobs, JobInput(records=FACTS))
    before = catalog.retriever_for("docs")

    second = run(ingestor, jobs, JobInput(deletes=("bees",)))
    after = catalog.retriever_for("docs")

    assert catalog.retriever_for(None) is default_retriever
    assert catalog.retriever_for(DEFAULT_COLLECTION) is default_retriever
    assert before.index.version == first.version and before.num_chunks == 2
    assert after.index.version == second.version and after.num_chunks == 1
    assert after.retrieve("bees", 5).collection == "docs"
    assert {c.doc_id for c in after.retrieve("bees dance", 5).chunks} == {"glass"}
    assert catalog.retriever_for("docs") is after  # opened once per version
    with store.writer():
        store.delete("docs")
    with pytest.raises(CollectionNotFound):
        catalog.retriever_for("docs")


def test_the_catalog_reports_each_version_it_opens(ingestor, jobs, store, default_retriever):
    loads: list[tuple[str, float]] = []
    catalog = RetrieverCatalog(
        default_retriever,
        store,
        default_retriever.open_version,
        on_load=lambda collection, ms, path: loads.append((collection, ms)),
    )
    run(ingestor, jobs, JobInput(records=FACTS))
    catalog.retriever_for("docs")
    catalog.retriever_for("docs")
    catalog.retriever_for(None)
    assert [collection for collection, _ in loads] == ["docs"]  # once per version

    run(ingestor, jobs, JobInput(deletes=("bees",)))
    catalog.retriever_for("docs")

    assert [collection for collection, _ in loads] == ["docs", "docs"]
    assert all(ms >= 0 for _, ms in loads)


def test_a_failing_load_hook_does_not_fail_the_query(ingestor, jobs, store, default_retriever):
    def broken(collection: str, ms: float, path: str) -> None:
        raise RuntimeError("metrics down")

    catalog = RetrieverCatalog(
        default_retriever, store, default_retriever.open_version, on_load=broken
    )
    run(ingestor, jobs, JobInput(records=FACTS))

    assert catalog.retriever_for("docs").num_chunks == 2


def test_a_collection_emptied_by_deletes_is_empty(ingestor, jobs, store, default_retriever):
    catalog = RetrieverCatalog(default_retriever, store, default_retriever.open_version)
    run(ingestor, jobs, JobInput(records=FACTS))

    run(ingestor, jobs, JobInput(deletes=("bees", "glass")))

    with pytest.raises(CollectionEmpty):
        catalog.retriever_for("docs")


def test_the_sentence_catalog_reads_the_version_a_retrieval_names(ingestor, jobs, store):
    first = run(ingestor, jobs, JobInput(records=FACTS))
    second = run(ingestor, jobs, JobInput(records=({"id": "new", "text": "New text."},)))
    sentences = SentenceStoreCatalog(store, max_loaded=1)

    old = sentences.store_for("docs", first.version)
    new = sentences.store_for("docs", second.version)

    assert (old.version, len(old)) == (first.version, 2)
    assert (new.version, len(new)) == (second.version, 3)
    assert sentences.store_for("docs", "0123abcd") is None  # collected, or never published
    assert sentences.store_for("gone", first.version) is None


def test_refresh_opens_a_new_version_before_any_query_asks(
    ingestor, jobs, store, default_retriever
):
    loads = []
    opener = default_retriever.open_version
    catalog = RetrieverCatalog(
        default_retriever, store, opener, on_load=lambda c, ms, path: loads.append(path)
    )
    run(ingestor, jobs, JobInput(records=FACTS))
    assert catalog.refresh() == []  # nothing served yet: nothing to watch
    catalog.retriever_for("docs")
    second = run(ingestor, jobs, JobInput(deletes=("bees",)))

    assert catalog.refresh() == ["docs"]
    assert catalog.served_versions() == {"docs": second.version}
    assert catalog.refresh() == []  # already current
    assert catalog.retriever_for("docs").index.version == second.version
    assert loads == ["query", "background"]  # only the first query waited for an opening
    with store.writer():
        store.delete("docs")
    assert catalog.refresh() == [] and catalog.served_versions() == {}


def test_the_sentence_catalog_refresh_loads_the_current_version(ingestor, jobs, store):
    first = run(ingestor, jobs, JobInput(records=FACTS))
    sentences = SentenceStoreCatalog(store)
    sentences.store_for("docs", first.version)
    second = run(ingestor, jobs, JobInput(records=({"id": "new", "text": "New text."},)))

    assert sentences.refresh() == ["docs"]
    assert sentences.refresh() == []
    assert len(sentences.store_for("docs", second.version)) == 3


def test_a_throttled_job_pauses_in_proportion_to_its_work(store, jobs, monkeypatch):
    pauses = []
    monkeypatch.setattr(ingestion.time, "sleep", pauses.append)
    ingestor = Ingestor(store, HashEmbedder(), MODEL, ChunkingParams(32, 4), cpu_share=0.25)
    records = tuple({"id": f"d{n}", "text": f"Document {n} says hello."} for n in range(70))

    job = run(ingestor, jobs, JobInput(records=records))

    assert job.status == "succeeded"
    assert len(pauses) == 2  # 70 one-chunk documents: blocks of 32, 32, 6; none after the last
    assert all(pause > 0 for pause in pauses)
    with pytest.raises(ValueError, match="cpu_share"):
        Ingestor(store, HashEmbedder(), MODEL, ChunkingParams(32, 4), cpu_share=0)


def test_an_opening_never_replaces_a_version_with_an_older_one(
    ingestor, jobs, store, default_retriever
):
    """A refresh that read CURRENT just before a publish (and a query's opening since) opens
    what CURRENT names when its turn comes, not the older version it read."""
    loads = []
    catalog = RetrieverCatalog(
        default_retriever,
        store,
        default_retriever.open_version,
        on_load=lambda collection, ms, path: loads.append(path),
    )
    run(ingestor, jobs, JobInput(records=FACTS))
    catalog.retriever_for("docs")
    run(ingestor, jobs, JobInput(records=({"id": "two", "text": "Second."},)))
    stale = store.current("docs")
    newest = run(ingestor, jobs, JobInput(records=({"id": "three", "text": "Third."},)))
    catalog.retriever_for("docs")  # a query opens the newest
    real_current = store.current
    reads = iter([stale])

    def current(name):  # the refresh's first read happened before the newest publish
        return next(reads, None) or real_current(name)

    store.current = current
    try:
        catalog.refresh()
    finally:
        store.current = real_current

    assert stale.version != newest.version
    assert catalog.served_versions() == {"docs": newest.version}
    assert loads == ["query", "query"]  # the stale read opened nothing
