"""retrieval.index: FaissIndex build/save/load/search with real faiss on small vectors, the
hits as RetrievedChunks, the version that ties an index to its sentence store, and the `auto`
kind with the search breadth kept in the manifest (small tiers, so the tests stay fast)."""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest

from pipeline.messages import RetrievedChunk
from retrieval.chunking import Chunk
from retrieval.index import (
    AUTO_TIERS,
    CHUNKS_FILE,
    FORMAT_VERSION,
    INDEX_FILE,
    MANIFEST_FILE,
    SENTENCES_FILE,
    FaissIndex,
    IndexedChunk,
    IndexParams,
    Manifest,
    manifest_version,
    new_faiss_index,
    read_chunks,
    read_manifest,
    resolve_index_params,
)

DIMENSION = 16


def unit_vectors(n: int, seed: int = 0) -> np.ndarray:
    vectors = np.random.default_rng(seed).standard_normal((n, DIMENSION)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def indexed_chunk(i: int) -> IndexedChunk:
    """Chunk i: two sentences, "First of i." and "Second of i.", at sentence rows 2i, 2i+1."""
    first, second = f"First of {i}.", f"Second of {i}."
    return IndexedChunk(
        chunk=Chunk(
            chunk_id=f"doc{i % 3}#{i}",
            doc_id=f"doc{i % 3}",
            title=f"Title «{i}»",
            text=f"{first} {second}",
            sentence_spans=((0, len(first)), (len(first) + 1, len(first) + 1 + len(second))),
        ),
        sentence_rows=(2 * i, 2 * i + 1),
    )


def indexed_chunks(n: int) -> list[IndexedChunk]:
    return [indexed_chunk(i) for i in range(n)]


def build(n: int, params: IndexParams, auto_tiers=AUTO_TIERS) -> tuple[FaissIndex, np.ndarray]:
    vectors = unit_vectors(n)
    manifest = Manifest(
        embedding_model="fake-model",
        dimension=DIMENSION,
        num_chunks=n,
        num_sentences=2 * n,
        index={},
        chunking={"chunk_tokens": 20, "overlap_tokens": 4},
    )
    index = FaissIndex.build(
        vectors, indexed_chunks(n), unit_vectors(2 * n, seed=1), manifest, params, auto_tiers
    )
    return index, vectors


KINDS = [
    pytest.param(IndexParams(kind="flat"), 20, id="flat"),
    pytest.param(IndexParams(kind="hnsw", hnsw_m=8), 60, id="hnsw"),
    # 160 vectors support 4 lists of >= 39 training points each.
    pytest.param(IndexParams(kind="ivf", ivf_nlist=4), 160, id="ivf"),
]


@pytest.mark.parametrize(("params", "n"), KINDS)
def test_round_trip_keeps_chunks_sentences_manifest_and_search_results(tmp_path, params, n):
    index, vectors = build(n, params)

    index.save(tmp_path / "idx")
    loaded = FaissIndex.load(tmp_path / "idx")

    assert sorted(p.name for p in (tmp_path / "idx").iterdir()) == sorted(
        [INDEX_FILE, CHUNKS_FILE, SENTENCES_FILE, MANIFEST_FILE]
    )
    assert loaded.chunks == index.chunks
    np.testing.assert_array_equal(loaded.sentence_embeddings, index.sentence_embeddings)
    assert loaded.manifest == index.manifest
    assert loaded.manifest.index["kind"] == params.kind
    assert loaded.manifest.format_version == FORMAT_VERSION
    queries = vectors[:5]
    assert loaded.search(queries, 3) == index.search(queries, 3)


@pytest.mark.parametrize(("params", "n"), KINDS)
def test_each_vector_finds_itself_first_with_cosine_one(tmp_path, params, n):
    index, vectors = build(n, params)
    index.save(tmp_path / "idx")
    loaded = FaissIndex.load(tmp_path / "idx")

    results = loaded.search(vectors, 3)

    assert len(results) == n
    for position, hits in enumerate(results):
        assert hits[0].position == position
        assert hits[0].score == pytest.approx(1.0, abs=1e-5)
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_top_k_larger_than_the_collection_returns_every_chunk_best_first():
    index, vectors = build(5, IndexParams(kind="flat"))

    [hits] = index.search(vectors[2:3], 50)

    assert sorted(h.position for h in hits) == [0, 1, 2, 3, 4]
    assert hits[0].position == 2
    expected = sorted((float(v @ vectors[2]) for v in vectors), reverse=True)
    assert [h.score for h in hits] == pytest.approx(expected, abs=1e-5)


def test_ivf_searching_every_list_matches_exact_search():
    ivf, _ = build(160, IndexParams(kind="ivf", ivf_nlist=4))
    flat, _ = build(160, IndexParams(kind="flat"))
    queries = unit_vectors(10, seed=7)

    ivf.set_search_params(nprobe=4)

    exact = [[h.position for h in hits] for hits in flat.search(queries, 5)]
    assert [[h.position for h in hits] for hits in ivf.search(queries, 5)] == exact


def test_hnsw_search_params_are_accepted_and_flat_ignores_them():
    hnsw, vectors = build(60, IndexParams(kind="hnsw", hnsw_m=8))
    flat, _ = build(60, IndexParams(kind="flat"))

    hnsw.set_search_params(nprobe=3, ef_search=64)
    flat.set_search_params(nprobe=3, ef_search=64)

    assert hnsw.search(vectors[:1], 1)[0][0].position == 0
    assert flat.search(vectors[:1], 1)[0][0].position == 0


def test_build_requires_one_vector_per_chunk():
    manifest = Manifest("m", DIMENSION, 3, 0, {}, {})
    with pytest.raises(ValueError, match="one embedding row per chunk"):
        FaissIndex.build(
            unit_vectors(2), indexed_chunks(3), unit_vectors(0), manifest, IndexParams()
        )


def test_load_rejects_another_format_version(tmp_path):
    index, _ = build(4, IndexParams())
    index.save(tmp_path)
    manifest = json.loads((tmp_path / MANIFEST_FILE).read_text())
    manifest["format_version"] = FORMAT_VERSION + 1
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(manifest))

    with pytest.raises(ValueError, match=f"index format {FORMAT_VERSION + 1}"):
        FaissIndex.load(tmp_path)


def test_load_rejects_chunks_that_do_not_match_the_vectors(tmp_path):
    index, _ = build(4, IndexParams())
    index.save(tmp_path)
    lines = (tmp_path / CHUNKS_FILE).read_text().splitlines(keepends=True)
    (tmp_path / CHUNKS_FILE).write_text("".join(lines[:3]))

    with pytest.raises(ValueError, match="3 chunks but 4 vectors"):
        FaissIndex.load(tmp_path)


def test_missing_index_folder_names_the_build_command(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"retrieval\.build"):
        FaissIndex.load(tmp_path / "missing")


def test_use_gpu_without_gpus_keeps_a_working_cpu_index(tmp_path):
    index, vectors = build(8, IndexParams())
    index.save(tmp_path)

    loaded = FaissIndex.load(tmp_path, use_gpu=True)

    assert loaded.search(vectors[3:4], 1)[0][0].position == 3


def test_ivf_caps_the_number_of_lists_at_what_the_collection_can_train():
    # 1024 lists cannot be trained from 100 vectors; the cap makes it 100 // 39 = 2 lists.
    index, vectors = build(100, IndexParams(kind="ivf"))

    assert index.manifest.index["ivf_nlist"] == 1024
    index.set_search_params(nprobe=2)
    assert [hits[0].position for hits in index.search(vectors, 1)] == list(range(100))


def test_ivf_with_fewer_vectors_than_one_list_needs_still_builds():
    index, vectors = build(5, IndexParams(kind="ivf"))

    assert index.search(vectors[4:5], 1)[0][0].position == 4


def test_search_on_an_empty_index_returns_no_hits():
    index = FaissIndex.build(
        np.zeros((0, DIMENSION), dtype=np.float32),
        [],
        np.zeros((0, DIMENSION), dtype=np.float32),
        Manifest("m", DIMENSION, 0, 0, {}, {}),
        IndexParams(),
    )

    assert index.search(unit_vectors(1), 5) == [[]]


def test_a_hit_becomes_the_retrieved_chunk_at_its_row():
    index, vectors = build(20, IndexParams(kind="flat"))
    [hits] = index.search(vectors[7:8], 2)

    first, second = (index.retrieved_chunk(hit) for hit in hits)

    assert first == RetrievedChunk(
        chunk_id="doc1#7",
        doc_id="doc1",
        title="Title «7»",
        text="First of 7. Second of 7.",
        score=hits[0].score,
        row=7,
    )
    assert first.score == pytest.approx(1.0, abs=1e-5)
    assert second.row == hits[1].position != 7
    assert second.chunk_id == index.chunks[second.row].chunk.chunk_id
    assert second.score == hits[1].score < first.score


def test_version_is_the_manifest_digest_and_survives_save_and_load(tmp_path):
    index, _ = build(6, IndexParams())
    index.save(tmp_path)

    version = index.version

    assert re.fullmatch(r"[0-9a-f]{16}", version)
    assert version == manifest_version(index.manifest)
    assert FaissIndex.load(tmp_path).version == version
    assert FaissIndex.load(tmp_path, with_sentence_embeddings=False).version == version


@pytest.mark.parametrize(
    "change",
    [
        {"extra": {"built_at": "2026-01-01T00:00:01Z"}},
        {"num_chunks": 7},
        {"embedding_model": "other-model"},
        {"chunking": {"chunk_tokens": 21, "overlap_tokens": 4}},
    ],
)
def test_version_changes_with_any_manifest_field(change):
    index, _ = build(6, IndexParams())
    other = dataclasses.replace(index.manifest, **change)

    assert manifest_version(other) != index.version
    assert manifest_version(dataclasses.replace(index.manifest)) == index.version


def test_load_can_skip_the_sentence_embeddings_and_still_search(tmp_path):
    index, vectors = build(8, IndexParams())
    index.save(tmp_path)

    loaded = FaissIndex.load(tmp_path, with_sentence_embeddings=False)

    assert loaded.sentence_embeddings.shape == (0, DIMENSION)
    assert loaded.chunks == index.chunks
    assert loaded.search(vectors[5:6], 1)[0][0].position == 5
    assert FaissIndex.load(tmp_path).sentence_embeddings.shape == (16, DIMENSION)


def test_read_manifest_and_read_chunks_return_what_was_saved(tmp_path):
    index, _ = build(5, IndexParams())
    index.save(tmp_path)

    assert read_manifest(tmp_path) == index.manifest
    chunks = read_chunks(tmp_path)
    assert chunks == index.chunks
    assert chunks[3].sentence_rows == (6, 7)
    assert chunks[3].chunk.sentences == ["First of 3.", "Second of 3."]


def test_read_manifest_explains_a_missing_index(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no index at .*retrieval\.build"):
        read_manifest(tmp_path / "missing")


SMALL_TIERS = (
    (10, IndexParams(kind="flat")),
    (100, IndexParams(kind="ivf", ivf_nlist=4, nprobe=3)),
    (None, IndexParams(kind="hnsw", hnsw_m=8, hnsw_ef_construction=20, ef_search=24)),
)


@pytest.mark.parametrize(
    ("num_chunks", "kind"), [(0, "flat"), (10, "flat"), (11, "ivf"), (100, "ivf"), (101, "hnsw")]
)
def test_auto_takes_the_first_tier_whose_bound_holds_the_collection(num_chunks, kind):
    resolved = resolve_index_params(IndexParams(kind="auto"), num_chunks, SMALL_TIERS)

    assert resolved.kind == kind
    assert resolved in [params for _, params in SMALL_TIERS]


def test_an_explicit_kind_is_kept_whatever_the_size():
    params = IndexParams(kind="ivf", ivf_nlist=7)

    assert resolve_index_params(params, 10**9, SMALL_TIERS) is params


def test_auto_tiers_must_cover_every_size_and_name_a_kind():
    with pytest.raises(ValueError, match="no auto tier holds 11 chunks"):
        resolve_index_params(IndexParams(kind="auto"), 11, SMALL_TIERS[:1])
    with pytest.raises(ValueError, match="must name a kind"):
        resolve_index_params(IndexParams(kind="auto"), 1, [(None, IndexParams(kind="auto"))])
    with pytest.raises(ValueError, match="resolve an auto kind first"):
        new_faiss_index(unit_vectors(3), IndexParams(kind="auto"))


def test_the_shipped_tiers_keep_small_collections_exact_and_end_unbounded():
    assert resolve_index_params(IndexParams(kind="auto"), 122).kind == "flat"
    assert AUTO_TIERS[-1][0] is None
    bounds = [bound for bound, _ in AUTO_TIERS[:-1]]
    assert bounds == sorted(bounds)
    large = resolve_index_params(IndexParams(kind="auto"), 10**7)
    assert large.kind == "hnsw"
    assert large.ef_search is not None  # kept in the manifest, so the retriever uses it


@pytest.mark.parametrize(
    ("n", "kind", "search_params"),
    [(8, "flat", {}), (160, "hnsw", {"ef_search": 24}), (60, "ivf", {"nprobe": 3})],
)
def test_auto_build_records_the_resolved_params_and_search_breadth_survives_load(
    tmp_path, n, kind, search_params
):
    index, vectors = build(n, IndexParams(kind="auto"), SMALL_TIERS)
    index.save(tmp_path)

    loaded = FaissIndex.load(tmp_path)

    assert loaded.manifest.index["kind"] == kind
    assert index.search_params == loaded.search_params == search_params
    assert loaded.search(vectors[:4], 1) == index.search(vectors[:4], 1)


def test_hnsw_build_uses_the_construction_breadth():
    index, _ = build(60, IndexParams(kind="hnsw", hnsw_m=8, hnsw_ef_construction=33))

    assert index._index.hnsw.efConstruction == 33
    assert index.manifest.index["hnsw_ef_construction"] == 33


def test_the_config_overrides_the_manifest_breadth_and_none_leaves_it(tmp_path):
    index, _ = build(60, IndexParams(kind="hnsw", hnsw_m=8, ef_search=24))
    index.save(tmp_path)
    loaded = FaissIndex.load(tmp_path)

    loaded.set_search_params(nprobe=None, ef_search=None)
    assert loaded.search_params == {"ef_search": 24}
    loaded.set_search_params(ef_search=99)
    assert loaded.search_params == {"ef_search": 99}


@pytest.mark.parametrize(
    ("params", "n", "default"),
    [
        (IndexParams(kind="hnsw", hnsw_m=8), 60, {"ef_search": 16}),
        (IndexParams(kind="ivf", ivf_nlist=4), 160, {"nprobe": 1}),
        (IndexParams(kind="flat"), 8, {}),
    ],
)
def test_an_index_whose_manifest_predates_the_search_fields_still_loads(
    tmp_path, params, n, default
):
    index, vectors = build(n, params)
    index.save(tmp_path)
    manifest = json.loads((tmp_path / MANIFEST_FILE).read_text())
    old_fields = {"kind", "hnsw_m", "ivf_nlist"}
    manifest["index"] = {k: v for k, v in manifest["index"].items() if k in old_fields}
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(manifest))

    loaded = FaissIndex.load(tmp_path)

    assert set(loaded.manifest.index) == old_fields
    assert loaded.search_params == default  # faiss's own defaults
    assert loaded.search(vectors[:1], 1)[0][0].position == 0
