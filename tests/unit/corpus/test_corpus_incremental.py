"""corpus.incremental: the next version of an index folder from the previous one plus
document changes, with real faiss and bm25s.

The embedder is faked (index_fakes.HashEmbedder) because these tests are about
bookkeeping: which chunks and sentences are embedded again, which stored vectors are reused,
and whether every file of a version still agrees with the others. The FAISS update per kind
is corpus.incremental_faiss, exercised here through build_next_version.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
from index_fakes import DIMENSION, HashEmbedder

from corpus import incremental_faiss
from corpus.incremental import (
    DOCUMENTS_FILE,
    DocumentChanges,
    DocumentInfo,
    build_next_version,
    read_documents,
)
from prepare.sentence_store import SentenceStore
from retrieval.build import build_index
from retrieval.chunking import ChunkingParams
from retrieval.documents import Document
from retrieval.index import FaissIndex, IndexParams, manifest_version
from retrieval.lexical import MANIFEST_KEY, LexicalIndex

CHUNKING = ChunkingParams(chunk_tokens=8, overlap_tokens=3)
ONE = Document(
    "one",
    "One",
    "Alpha is first. Beta is second. Gamma is third. Delta is fourth. Epsilon is fifth.",
)
TWO = Document("two", "Two", "Zeta is sixth. Eta is seventh.")
RECORD = Document("r1", "Record", "Theta is eighth.")
DOCUMENTS = (ONE, TWO, RECORD)


def next_version(previous, output: Path, embedder=None, *, upserts=(), deletes=(), **kwargs):
    output.mkdir(parents=True)
    kwargs.setdefault("embedding_model", "fake-hash-embedder")
    kwargs.setdefault("chunking", CHUNKING)
    return build_next_version(
        previous,
        DocumentChanges(upserts=tuple(upserts), deletes=tuple(deletes)),
        output,
        embedder or HashEmbedder(),
        **kwargs,
    )


@pytest.fixture
def first(tmp_path: Path) -> Path:
    """Version 1 of the three documents, flat."""
    next_version(None, tmp_path / "v1", upserts=DOCUMENTS)
    return tmp_path / "v1"


def stored_vectors(version: Path) -> np.ndarray:
    faiss_index = FaissIndex.load(version).faiss_index
    if hasattr(faiss_index, "make_direct_map"):
        faiss_index.make_direct_map()
    return faiss_index.reconstruct_n(0, faiss_index.ntotal)


def assert_consistent(version: Path) -> None:
    """Every row's vector is its chunk's, found at its own position; every chunk's sentences
    have their own embeddings; BM25 has one row per chunk."""
    index = FaissIndex.load(version)
    store = SentenceStore.load(version)
    vectors = stored_vectors(version)
    assert index.manifest.num_chunks == len(index.chunks) == len(vectors) == len(store)
    assert index.manifest.num_sentences == len(index.sentence_embeddings)
    for position, item in enumerate(index.chunks):
        np.testing.assert_allclose(vectors[position], HashEmbedder.vector(item.chunk.text))
        [hits] = index.search(HashEmbedder.vector(item.chunk.text)[None, :], 1)
        assert hits[0].position == position
        context = store.context_chunk(index.retrieved_chunk(hits[0]))
        expected = [HashEmbedder.vector(s) for s in item.chunk.sentences]
        np.testing.assert_allclose(context.sentence_embeddings, np.stack(expected), atol=1e-6)
    # Sentence rows are dense: each row is used, and a sentence has one row.
    used = {row for item in index.chunks for row in item.sentence_rows}
    assert used == set(range(len(index.sentence_embeddings)))
    if index.chunks:
        assert LexicalIndex.load(version).num_rows == len(index.chunks)


def chunk_ids(version: Path) -> list[str]:
    return [item.chunk.chunk_id for item in FaissIndex.load(version).chunks]


def test_first_version_is_what_build_index_makes_of_the_same_documents(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    lines = [json.dumps({"id": d.doc_id, "title": d.title, "text": d.text}) for d in DOCUMENTS]
    (corpus / "docs.jsonl").write_text("\n".join(lines) + "\n")
    built_embedder, next_embedder = HashEmbedder(), HashEmbedder()
    built = build_index(
        corpus, tmp_path / "built", built_embedder, "fake-hash-embedder", CHUNKING,
        IndexParams(kind="auto"), show_progress=False,
    )  # fmt: skip

    result = next_version(None, tmp_path / "v1", next_embedder, upserts=DOCUMENTS)

    ours = FaissIndex.load(tmp_path / "v1")
    assert ours.chunks == built.chunks
    np.testing.assert_array_equal(ours.sentence_embeddings, built.sentence_embeddings)
    assert next_embedder.encode_calls == built_embedder.encode_calls
    assert ours.manifest.index == built.manifest.index == asdict(IndexParams(kind="flat"))
    assert ours.manifest.extra[MANIFEST_KEY] == built.manifest.extra[MANIFEST_KEY]
    assert ours.manifest.extra["sequence_parent"] is None
    queries = np.stack([HashEmbedder.vector(t) for t in ("Alpha is first.", "Theta", "x y")])
    assert ours.search(queries, 3) == built.search(queries, 3)
    assert (result.added, result.replaced, result.deleted, result.num_documents) == (3, 0, 0, 3)
    assert result.embedded_chunks == result.num_chunks == len(built.chunks)
    assert result.reused_chunks == 0
    assert_consistent(tmp_path / "v1")


def test_adding_a_document_embeds_only_its_chunks_and_its_new_sentences(first, tmp_path):
    embedder = HashEmbedder()
    added = Document("new", "New", "Alpha is first. Iota is ninth.")

    result = next_version(first, tmp_path / "v2", embedder, upserts=[added])

    before, after = FaissIndex.load(first), FaissIndex.load(tmp_path / "v2")
    kept = len(before.chunks)
    new_chunks = [item.chunk for item in after.chunks[kept:]]
    assert [c.doc_id for c in new_chunks] == ["new"]
    assert [item.chunk for item in after.chunks[:kept]] == [item.chunk for item in before.chunks]
    # "Alpha is first." was stored already: only the chunk and the unseen sentence are embedded.
    assert embedder.encode_calls == [[new_chunks[0].text], ["Iota is ninth."]]
    np.testing.assert_array_equal(stored_vectors(tmp_path / "v2")[:kept], stored_vectors(first))
    assert (result.added, result.replaced, result.embedded_chunks) == (1, 0, 1)
    assert (result.reused_chunks, result.embedded_sentences) == (kept, 1)
    assert after.manifest.extra["sequence_parent"] == manifest_version(before.manifest)
    assert after.manifest.extra["build_id"] != before.manifest.extra["build_id"]
    assert_consistent(tmp_path / "v2")


def test_replacing_a_document_drops_its_old_chunks_and_keeps_the_others(first, tmp_path):
    replacement = Document("one", "One again", "Kappa is tenth. Beta is second.")

    result = next_version(first, tmp_path / "v2", upserts=[replacement])

    before = FaissIndex.load(first).chunks
    after = FaissIndex.load(tmp_path / "v2").chunks
    others = [item.chunk for item in before if item.chunk.doc_id != "one"]
    assert [item.chunk for item in after[: len(others)]] == others
    replaced = [item.chunk for item in after[len(others) :]]
    assert [(c.chunk_id, c.title, c.text) for c in replaced] == [
        ("one#0", "One again", "Kappa is tenth. Beta is second.")
    ]
    assert not any("Alpha" in item.chunk.text for item in after)
    assert (result.added, result.replaced, result.reused_chunks) == (0, 1, len(others))
    assert_consistent(tmp_path / "v2")


def test_deleting_a_document_removes_it_from_every_part(first, tmp_path):
    embedder = HashEmbedder()

    result = next_version(first, tmp_path / "v2", embedder, deletes=["two"])

    version = tmp_path / "v2"
    assert "two" not in {item.chunk.doc_id for item in FaissIndex.load(version).chunks}
    assert chunk_ids(version) == [c for c in chunk_ids(first) if not c.startswith("two#")]
    assert LexicalIndex.load(first).search("zeta", 5)
    assert LexicalIndex.load(version).search("zeta", 5) == []
    assert "Zeta is sixth." not in SentenceStore.load(version).embeddings_of(chunk_ids(first))
    assert embedder.encode_calls == []
    assert (result.deleted, result.not_found, result.embedded_chunks) == (1, (), 0)
    assert_consistent(version)


def test_deleting_everything_leaves_an_empty_version_that_loads(first, tmp_path):
    result = next_version(first, tmp_path / "v2", deletes=[d.doc_id for d in DOCUMENTS])

    version = tmp_path / "v2"
    index = FaissIndex.load(version)
    assert (result.num_chunks, result.num_documents, index.faiss_index.ntotal) == (0, 0, 0)
    assert index.search(HashEmbedder.vector("Alpha")[None, :], 5) == [[]]
    assert index.sentence_embeddings.shape == (0, DIMENSION)
    assert len(SentenceStore.load(version)) == 0
    assert MANIFEST_KEY not in index.manifest.extra
    assert not (version / "lexical").exists()
    assert read_documents(version) == []
    # And a collection can grow again from nothing.
    next_version(version, tmp_path / "v3", upserts=[TWO])
    assert chunk_ids(tmp_path / "v3") == ["two#0"]
    assert_consistent(tmp_path / "v3")


def test_deletes_naming_no_document_are_reported(first, tmp_path):
    result = next_version(first, tmp_path / "v2", deletes=["nope", "two", "nope"])

    assert (result.deleted, result.not_found) == (1, ("nope",))


@pytest.mark.parametrize(
    ("upserts", "deletes", "message"),
    [((TWO,), ("two",), "both upserted and deleted"), ((TWO, TWO), (), "upserted twice")],
)
def test_contradictory_changes_are_refused(upserts, deletes, message):
    with pytest.raises(ValueError, match=message):
        DocumentChanges(upserts=upserts, deletes=deletes)


def test_a_document_without_text_is_refused_by_its_id(first, tmp_path):
    with pytest.raises(ValueError, match="'blank'"):
        next_version(first, tmp_path / "v2", upserts=[Document("blank", "Blank", "  ")])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"embedding_model": "another-model"}, "another-model"), ({}, "8 dims")],
)
def test_a_previous_version_of_another_embedder_is_refused(first, tmp_path, kwargs, message):
    embedder = HashEmbedder()
    if not kwargs:
        embedder.dimension = 16  # the same model name, another size

    with pytest.raises(ValueError, match=message):
        next_version(first, tmp_path / "v2", embedder, upserts=[RECORD], **kwargs)


def test_a_folder_that_is_not_empty_is_refused(first, tmp_path):
    (tmp_path / "v2").mkdir()
    (tmp_path / "v2" / "stray").write_text("")

    with pytest.raises(ValueError, match="not empty"):
        build_next_version(
            first, DocumentChanges(deletes=("two",)), tmp_path / "v2", HashEmbedder(),
            embedding_model="fake-hash-embedder", chunking=CHUNKING,
        )  # fmt: skip


def test_the_previous_chunking_wins(first, tmp_path):
    next_version(first, tmp_path / "v2", upserts=[RECORD], chunking=ChunkingParams(50, 10))

    assert FaissIndex.load(tmp_path / "v2").manifest.chunking == asdict(CHUNKING)


def many_documents(count: int, tag: str) -> list[Document]:
    return [
        Document(f"{tag}{i}", f"{tag} {i}", f"{tag} {i} opens here. Then {tag} {i} goes on.")
        for i in range(count)
    ]


@pytest.mark.parametrize(
    "params",
    [
        IndexParams(kind="flat"),
        IndexParams(kind="hnsw", hnsw_m=4, ef_search=20),
        IndexParams(kind="ivf", ivf_nlist=2, nprobe=2),
    ],
    ids=lambda p: p.kind,
)
def test_each_kind_survives_adds_replacements_and_deletes(tmp_path, monkeypatch, params):
    """Only HNSW with rows removed is built anew; the others update the previous index."""
    base = many_documents(80, "doc")
    versions = [tmp_path / f"v{i}" for i in range(4)]
    next_version(None, versions[0], upserts=base, index_params=params)
    built_anew = []
    real_new_faiss_index = incremental_faiss.new_faiss_index
    monkeypatch.setattr(
        incremental_faiss,
        "new_faiss_index",
        lambda vectors, p: built_anew.append(len(vectors)) or real_new_faiss_index(vectors, p),
    )
    added = Document("added", "Added", "Omicron is new here.")
    next_version(versions[0], versions[1], upserts=[added], index_params=params)
    replaced = Document("doc3", "Doc 3", "Sigma replaces it.")
    next_version(versions[1], versions[2], upserts=[replaced], index_params=params)
    next_version(versions[2], versions[3], deletes=["doc5", "added"], index_params=params)

    assert len(built_anew) == (2 if params.kind == "hnsw" else 0)
    for version in versions:
        index = FaissIndex.load(version)
        assert index.manifest.index == asdict(params)
        assert index.search_params == {
            "flat": {}, "hnsw": {"ef_search": 20}, "ivf": {"nprobe": 2}
        }[params.kind]  # fmt: skip
        assert_consistent(version)
    [hits] = FaissIndex.load(versions[1]).search(HashEmbedder.vector(added.text)[None, :], 1)
    assert FaissIndex.load(versions[1]).chunks[hits[0].position].chunk.doc_id == "added"
    assert chunk_ids(versions[3])[-1] == "doc3#0"
    assert "doc5#0" not in chunk_ids(versions[3])


def test_ivf_keeps_its_trained_quantizer(tmp_path):
    params = IndexParams(kind="ivf", ivf_nlist=2)
    next_version(None, tmp_path / "v1", upserts=many_documents(80, "doc"), index_params=params)
    next_version(tmp_path / "v1", tmp_path / "v2", upserts=many_documents(40, "more"),
                 deletes=["doc1"], index_params=params)  # fmt: skip

    def centroids(version: Path) -> np.ndarray:
        ivf = FaissIndex.load(version).faiss_index  # held: the quantizer belongs to it
        return ivf.quantizer.reconstruct_n(0, ivf.quantizer.ntotal)

    assert len(centroids(tmp_path / "v1")) == 2
    np.testing.assert_array_equal(centroids(tmp_path / "v2"), centroids(tmp_path / "v1"))


def test_ivf_is_trained_anew_once_the_collection_outgrows_its_lists(tmp_path):
    params = IndexParams(kind="ivf", ivf_nlist=2)
    next_version(None, tmp_path / "v1", upserts=many_documents(10, "doc"), index_params=params)
    next_version(tmp_path / "v1", tmp_path / "v2", upserts=many_documents(80, "more"),
                 index_params=params)  # fmt: skip

    assert FaissIndex.load(tmp_path / "v1").faiss_index.nlist == 1
    assert FaissIndex.load(tmp_path / "v2").faiss_index.nlist == 2
    assert_consistent(tmp_path / "v2")


def test_an_auto_tier_change_builds_the_new_kind(first, tmp_path):
    chunks = len(chunk_ids(first))
    hnsw = IndexParams(kind="hnsw", hnsw_m=4, ef_search=30)
    tiers = [(chunks, IndexParams(kind="flat")), (None, hnsw)]

    next_version(first, tmp_path / "v2", upserts=[Document("x", "X", "Pi is more.")],
                 index_params=IndexParams(kind="auto"), auto_tiers=tiers)  # fmt: skip

    assert FaissIndex.load(tmp_path / "v2").manifest.index == asdict(hnsw)
    assert_consistent(tmp_path / "v2")


def test_documents_file_lists_each_document_with_its_sizes(first, tmp_path, monkeypatch):
    v1 = {info.doc_id: info for info in read_documents(first)}
    one_chunks = sum(chunk_id.startswith("one#") for chunk_id in chunk_ids(first))
    assert v1["one"] == DocumentInfo("one", "One", one_chunks, len(ONE.text), v1["one"].updated_at)
    monkeypatch.setattr("time.time", lambda: v1["one"].updated_at + 60)
    replacement = Document("two", "Two again", "Zeta returns.")

    next_version(first, tmp_path / "v2", upserts=[replacement], deletes=["r1"])

    lines = (tmp_path / "v2" / DOCUMENTS_FILE).read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"id": "one", "title": "One", "chunks": one_chunks, "chars": len(ONE.text),
         "updated_at": v1["one"].updated_at},
        {"id": "two", "title": "Two again", "chunks": 1, "chars": len(replacement.text),
         "updated_at": v1["one"].updated_at + 60},
    ]  # fmt: skip
    assert FaissIndex.load(tmp_path / "v2").manifest.extra["num_documents"] == 2


def test_a_folder_without_a_documents_file_lists_none_but_can_precede_a_version(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "two.txt").write_text(TWO.text)
    build_index(corpus, tmp_path / "built", HashEmbedder(), "fake-hash-embedder", CHUNKING,
                IndexParams(), show_progress=False)  # fmt: skip
    assert read_documents(tmp_path / "built") == []

    result = next_version(tmp_path / "built", tmp_path / "v2", upserts=[RECORD])

    assert (result.added, result.num_documents) == (1, 2)
    [two, record] = read_documents(tmp_path / "v2")
    assert (two.doc_id, two.chunks, two.chars) == ("two", 1, len(TWO.text))
    assert record.doc_id == "r1"


def test_progress_runs_from_nothing_to_every_upserted_document(first, tmp_path):
    calls: list[tuple[int, int]] = []

    next_version(first, tmp_path / "v2", upserts=many_documents(3, "p"),
                 progress=lambda done, total: calls.append((done, total)))  # fmt: skip

    assert calls[0] == (0, 3)
    assert calls[-1] == (3, 3)
    assert calls == sorted(calls)
