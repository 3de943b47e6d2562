"""corpus.collection_listing: collections and their documents as the API lists them,
for a store's collection (through real ingestion jobs) and for the shipped index (a folder
of retrieval.build). The embedder is faked: listings are about bookkeeping."""

from __future__ import annotations

from pathlib import Path

import pytest
from index_fakes import HashEmbedder

from corpus.collection_listing import (
    collection_documents,
    describe_collection,
    describe_shipped,
    shipped_documents,
)
from corpus.collection_store import CollectionNotFound, CollectionStore
from corpus.ingestion import Ingestor, JobBook, JobInput
from pipeline.messages import DEFAULT_COLLECTION
from retrieval.build import build_index
from retrieval.chunking import ChunkingParams
from retrieval.index import IndexParams

CHUNKING = ChunkingParams(chunk_tokens=8, overlap_tokens=3)
FACTS = (
    {"id": "bees", "title": "Bees", "text": "Honey bees dance to show where flowers are."},
    {"id": "glass", "text": "Glass is made by melting sand. " * 4},
)


@pytest.fixture
def store(tmp_path: Path) -> CollectionStore:
    store = CollectionStore(tmp_path / "collections")
    with store.writer():
        store.create("docs")
    return store


def ingest(store: CollectionStore, work: JobInput) -> None:
    jobs = JobBook(store.root)
    job = jobs.new("docs", "delete" if work.deletes else "add")
    Ingestor(store, HashEmbedder(), "hash-embedder", CHUNKING).run(job, work, jobs.save)
    assert jobs.get(job.id).status == "succeeded"


def test_a_collection_before_its_first_version_is_empty(store):
    assert describe_collection(store, "docs") == {
        "name": "docs", "object": "collection", "read_only": False, "documents": 0,
        "chunks": 0, "version": None, "updated_at": None,
    }  # fmt: skip
    assert collection_documents(store, "docs") == []


def test_a_collection_is_described_by_its_current_version(store):
    ingest(store, JobInput(records=FACTS))
    current = store.current("docs")

    described = describe_collection(store, "docs")
    documents = collection_documents(store, "docs")

    assert described["version"] == current.version
    assert described["updated_at"] == current.published_at
    assert described["documents"] == 2
    assert described["chunks"] == sum(d["chunks"] for d in documents) > 2
    assert [(d["id"], d["title"]) for d in documents] == [("bees", "Bees"), ("glass", "glass")]
    assert all(d["chars"] > 0 and d["updated_at"] for d in documents)


def test_a_deleted_document_leaves_the_listing(store):
    ingest(store, JobInput(records=FACTS))
    ingest(store, JobInput(deletes=("glass",)))

    assert [d["id"] for d in collection_documents(store, "docs")] == ["bees"]
    assert describe_collection(store, "docs")["documents"] == 1


def test_a_collection_gone_is_marked_deleted_and_its_documents_not_found(store):
    with store.writer():
        store.delete("docs")

    assert describe_collection(store, "docs") == {
        "name": "docs", "object": "collection", "deleted": True,
    }  # fmt: skip
    with pytest.raises(CollectionNotFound):
        collection_documents(store, "docs")


def test_the_shipped_index_is_the_read_only_default_collection(tmp_path: Path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "bees.md").write_text("# Bees\n\n" + "Honey bees dance for flowers. " * 6)
    (corpus / "sand.txt").write_text("Glass is made by melting sand.")
    index = tmp_path / "index"
    build_index(corpus, index, HashEmbedder(), "hash-embedder", CHUNKING, IndexParams(),
                show_progress=False)  # fmt: skip

    described = describe_shipped(index)
    documents = shipped_documents(index)

    assert described["name"] == DEFAULT_COLLECTION and described["read_only"] is True
    assert described["version"] and described["updated_at"] is None
    assert sorted((d["id"], d["title"]) for d in documents) == [("bees", "Bees"), ("sand", "sand")]
    assert described["chunks"] == sum(d["chunks"] for d in documents)
    assert all(d["chars"] is None and d["updated_at"] is None for d in documents)
