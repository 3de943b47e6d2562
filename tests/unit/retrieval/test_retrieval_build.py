"""retrieval.build.build_index end to end on a tiny corpus, with a fake embedder.

The embedder is faked (index_fakes.HashEmbedder) because these tests are about chunking,
sentence-row bookkeeping and the atomic swap; the real sentence-transformers embedder is
exercised by the integration tests.
"""

from __future__ import annotations

import calendar
import os
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
from index_fakes import DIMENSION, HashEmbedder

from retrieval.build import build_index
from retrieval.chunking import ChunkingParams
from retrieval.index import AUTO_TIERS, FaissIndex, IndexParams


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    root = tmp_path / "corpus"
    root.mkdir()
    (root / "one.md").write_text(
        "# One\n\nAlpha is first. Beta is second. Gamma is third. Delta is fourth. "
        "Epsilon is fifth.\n"
    )
    (root / "two.txt").write_text("Zeta is sixth. Eta is seventh.")
    (root / "more.jsonl").write_text(
        '{"id": "r1", "title": "Record", "text": "Theta is eighth."}\n'
    )
    return root


def _build(corpus: Path, output: Path, embedder=None, auto_tiers=AUTO_TIERS, **params):
    return build_index(
        corpus,
        output,
        embedder or HashEmbedder(),
        "fake-hash-embedder",
        ChunkingParams(chunk_tokens=8, overlap_tokens=3),
        IndexParams(**params),
        show_progress=False,
        auto_tiers=auto_tiers,
    )


def test_build_writes_a_loadable_index_with_a_complete_manifest(corpus, tmp_path):
    output = tmp_path / "indexes" / "default"

    built = _build(corpus, output)
    loaded = FaissIndex.load(output)

    manifest = loaded.manifest
    assert manifest.embedding_model == "fake-hash-embedder"
    assert manifest.dimension == DIMENSION
    assert manifest.num_chunks == len(loaded.chunks) == len(built.chunks)
    assert manifest.chunking == {"chunk_tokens": 8, "overlap_tokens": 3}
    assert manifest.index["kind"] == "flat"
    assert manifest.extra["num_documents"] == 3
    assert {c.chunk.doc_id for c in loaded.chunks} == {"one", "two", "r1"}
    assert all(len(c.chunk.text.split()) <= 8 for c in loaded.chunks)


def test_each_chunk_is_found_by_its_own_embedding(corpus, tmp_path):
    index = _build(corpus, tmp_path / "out")

    for position, item in enumerate(index.chunks):
        [hits] = index.search(HashEmbedder.vector(item.chunk.text)[None, :], 1)
        assert hits[0].position == position
        assert hits[0].score == pytest.approx(1.0, abs=1e-5)


def test_sentence_rows_are_shared_by_overlapping_chunks_and_hold_their_embeddings(corpus, tmp_path):
    embedder = HashEmbedder()
    index = _build(corpus, tmp_path / "out", embedder)

    row_of: dict[str, int] = {}
    for item in index.chunks:
        assert len(item.sentence_rows) == len(item.chunk.sentences)
        for sentence, row in zip(item.chunk.sentences, item.sentence_rows, strict=True):
            assert row_of.setdefault(sentence, row) == row
            np.testing.assert_allclose(index.sentence_embeddings[row], embedder.vector(sentence))
    # One row per distinct sentence, and the overlap really shared some.
    assert sorted(row_of.values()) == list(range(len(row_of)))
    assert index.manifest.num_sentences == len(row_of) == len(index.sentence_embeddings)
    total_references = sum(len(item.sentence_rows) for item in index.chunks)
    assert total_references > len(row_of)
    # Sentences were embedded once each, not once per chunk that holds them.
    assert embedder.encode_calls[1] == list(row_of)


def test_rebuild_swaps_the_index_and_leaves_no_staging_or_retired_folders(corpus, tmp_path):
    parent = tmp_path / "indexes"
    output = parent / "default"
    _build(corpus, output)
    (corpus / "three.txt").write_text("Iota is ninth.")

    _build(corpus, output, kind="hnsw", hnsw_m=4)

    assert [p.name for p in parent.iterdir()] == ["default"]
    reloaded = FaissIndex.load(output)
    assert reloaded.manifest.extra["num_documents"] == 4
    assert reloaded.manifest.index["kind"] == "hnsw"


def test_failed_save_keeps_the_old_index_and_cleans_up(corpus, tmp_path, monkeypatch):
    parent = tmp_path / "indexes"
    output = parent / "default"
    old = _build(corpus, output)

    def broken_save(self, directory: Path) -> None:
        (directory / "index.faiss").write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(FaissIndex, "save", broken_save)
    (corpus / "three.txt").write_text("Iota is ninth.")
    with pytest.raises(OSError, match="disk full"):
        _build(corpus, output)

    assert [p.name for p in parent.iterdir()] == ["default"]
    assert FaissIndex.load(output).manifest.num_chunks == old.manifest.num_chunks


def test_empty_corpus_is_refused_before_anything_is_written(tmp_path):
    (tmp_path / "empty").mkdir()

    with pytest.raises(ValueError, match=r"no \.txt, \.md or \.jsonl documents"):
        _build(tmp_path / "empty", tmp_path / "out")

    assert not (tmp_path / "out").exists()


def test_published_index_folder_has_the_usual_permissions(corpus, tmp_path):
    (tmp_path / "reference").mkdir()
    expected = (tmp_path / "reference").stat().st_mode & 0o777

    _build(corpus, tmp_path / "out")

    assert (tmp_path / "out").stat().st_mode & 0o777 == expected


@pytest.fixture
def non_utc_timezone(monkeypatch):
    monkeypatch.setenv("TZ", "EST5")  # POSIX rule, no tz database needed: UTC-5 all year
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_built_at_is_utc(corpus, tmp_path, non_utc_timezone):
    index = _build(corpus, tmp_path / "out")

    stamp = time.strptime(index.manifest.extra["built_at"], "%Y-%m-%dT%H:%M:%SZ")
    assert abs(calendar.timegm(stamp) - time.time()) < 120
    assert os.environ["TZ"] == "EST5"


def test_command_line_builds_the_requested_index(corpus, tmp_path, monkeypatch):
    from retrieval import build as build_module

    loaded_with = []

    def fake_load(model_path: str, device: str = "cpu", batch_size: int = 64) -> HashEmbedder:
        loaded_with.append((model_path, device, batch_size))
        return HashEmbedder()

    monkeypatch.setattr(build_module.Embedder, "load", staticmethod(fake_load))
    output = tmp_path / "cli-index"

    status = build_module.main(
        [
            "--input", str(corpus), "--output", str(output), "--embedding-model", "org/embedder",
            "--batch-size", "7", "--chunk-tokens", "8", "--overlap-tokens", "3",
            "--index-kind", "hnsw", "--hnsw-m", "4", "--hnsw-ef-construction", "20",
            "--ef-search", "50", "--quiet",
        ]
    )  # fmt: skip

    assert status == 0
    assert loaded_with == [("org/embedder", "cpu", 7)]
    manifest = FaissIndex.load(output).manifest
    assert manifest.embedding_model == "org/embedder"
    assert manifest.index == {
        "kind": "hnsw", "hnsw_m": 4, "ivf_nlist": 1024, "hnsw_ef_construction": 20,
        "nprobe": None, "ef_search": 50,
    }  # fmt: skip
    assert manifest.chunking == {"chunk_tokens": 8, "overlap_tokens": 3}
    assert FaissIndex.load(output).search_params == {"ef_search": 50}


@pytest.fixture
def fake_embedder(monkeypatch):
    from retrieval import build as build_module

    monkeypatch.setattr(build_module.Embedder, "load", staticmethod(lambda *a, **k: HashEmbedder()))
    return build_module


def test_command_line_defaults_to_auto_which_keeps_a_small_collection_exact(
    corpus, tmp_path, fake_embedder
):
    output = tmp_path / "cli-index"

    assert fake_embedder.main(["--input", str(corpus), "--output", str(output), "--quiet"]) == 0

    loaded = FaissIndex.load(output)
    assert loaded.manifest.index == asdict(IndexParams(kind="flat"))
    assert loaded.search_params == {}


def test_command_line_ivf_keeps_its_nprobe(corpus, tmp_path, fake_embedder):
    output = tmp_path / "cli-index"
    argv = ["--input", str(corpus), "--output", str(output), "--quiet"]

    assert fake_embedder.main([*argv, "--index-kind", "ivf", "--nprobe", "2"]) == 0

    loaded = FaissIndex.load(output)
    assert (loaded.manifest.index["kind"], loaded.manifest.index["nprobe"]) == ("ivf", 2)
    assert loaded.search_params == {"nprobe": 2}


def test_auto_picks_by_the_number_of_chunks_against_the_tiers_given(corpus, tmp_path):
    hnsw = IndexParams(kind="hnsw", hnsw_m=4, ef_search=40)
    few = _build(
        corpus, tmp_path / "a", auto_tiers=[(1000, IndexParams()), (None, hnsw)], kind="auto"
    )
    chunks = few.manifest.num_chunks
    many = _build(
        corpus, tmp_path / "b", auto_tiers=[(chunks - 1, IndexParams()), (None, hnsw)], kind="auto"
    )

    assert few.manifest.index["kind"] == "flat"
    assert FaissIndex.load(tmp_path / "b").manifest.index == asdict(hnsw)
    assert FaissIndex.load(tmp_path / "b").search_params == many.search_params == {"ef_search": 40}
