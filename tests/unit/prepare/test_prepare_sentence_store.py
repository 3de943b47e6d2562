"""prepare.sentence_store: the compressor's copy of every chunk's sentences and embeddings.

The index is real (FaissIndex.build + save on a handful of hand-made chunks); the store is
loaded from the saved folder as the compressor loads it.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np
import pytest
from index_fakes import HashEmbedder

from pipeline.messages import RetrievedChunk
from prepare.sentence_store import SentenceStore
from retrieval.build import build_index
from retrieval.chunking import Chunk, ChunkingParams
from retrieval.index import (
    FaissIndex,
    IndexedChunk,
    IndexParams,
    Manifest,
    SearchHit,
    manifest_version,
    read_manifest,
)

DIMENSION = 8
SENTENCES = (
    "Paged attention stores keys.",  # row 0
    "Blocks hold sixteen tokens.",  # row 1
    "Prefix caching reuses blocks.",  # row 2
    "Batching shares decode steps.",  # row 3
    "A scheduler admits requests.",  # row 4
)
# (chunk id, sentence rows): chunks 0 and 1 overlap on row 1; chunk 3 reuses row 0 after row 4.
LAYOUT = (
    ("kv#0", (0, 1)),
    ("kv#1", (1, 2)),
    ("batch#0", (3,)),
    ("sched#0", (4, 0)),
)


def unit_rows(n: int, seed: int) -> np.ndarray:
    rows = np.random.default_rng(seed).standard_normal((n, DIMENSION)).astype(np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def chunk_of(chunk_id: str, sentences: tuple[str, ...]) -> Chunk:
    spans, start = [], 0
    for sentence in sentences:
        spans.append((start, start + len(sentence)))
        start += len(sentence) + 1
    return Chunk(
        chunk_id=chunk_id,
        doc_id=chunk_id.split("#")[0],
        title=chunk_id.split("#")[0].upper(),
        text=" ".join(sentences),
        sentence_spans=tuple(spans),
    )


def save_index(directory: Path, built_at: str = "2026-01-01T00:00:00Z") -> FaissIndex:
    chunks = [
        IndexedChunk(chunk_of(chunk_id, tuple(SENTENCES[r] for r in rows)), rows)
        for chunk_id, rows in LAYOUT
    ]
    manifest = Manifest(
        embedding_model="fake-model",
        dimension=DIMENSION,
        num_chunks=len(chunks),
        num_sentences=len(SENTENCES),
        index={},
        chunking={"chunk_tokens": 16, "overlap_tokens": 4},
        extra={"built_at": built_at},
    )
    index = FaissIndex.build(
        unit_rows(len(chunks), seed=3),
        chunks,
        unit_rows(len(SENTENCES), seed=4),
        manifest,
        IndexParams(kind="flat"),
    )
    index.save(directory)
    return index


@pytest.fixture
def saved(tmp_path: Path) -> tuple[Path, FaissIndex]:
    directory = tmp_path / "index"
    return directory, save_index(directory)


def test_load_holds_every_chunk_under_the_index_version(saved):
    directory, index = saved

    store = SentenceStore.load(directory)

    assert len(store) == len(LAYOUT)
    assert re.fullmatch(r"[0-9a-f]{16}", store.version)
    assert store.version == index.version == FaissIndex.load(directory).version
    assert store.version == manifest_version(read_manifest(directory))
    assert SentenceStore.load(directory).version == store.version


@pytest.mark.parametrize(
    ("row", "sentences", "embedding_rows"),
    [
        (0, ("Paged attention stores keys.", "Blocks hold sixteen tokens."), [0, 1]),
        (1, ("Blocks hold sixteen tokens.", "Prefix caching reuses blocks."), [1, 2]),
        (2, ("Batching shares decode steps.",), [3]),
        (3, ("A scheduler admits requests.", "Paged attention stores keys."), [4, 0]),
    ],
)
def test_context_chunk_has_the_stored_sentences_and_their_embedding_rows(
    saved, row, sentences, embedding_rows
):
    directory, index = saved
    store = SentenceStore.load(directory)
    retrieved = index.retrieved_chunk(SearchHit(position=row, score=0.25 + row / 10))

    chunk = store.context_chunk(retrieved)

    assert chunk.sentences == sentences
    expected = unit_rows(len(SENTENCES), seed=4)[embedding_rows]
    assert chunk.sentence_embeddings is not None
    np.testing.assert_array_equal(chunk.sentence_embeddings, expected)
    # Identity, text and score are the retrieval's, not the store's.
    assert (chunk.chunk_id, chunk.doc_id, chunk.title, chunk.text) == (
        retrieved.chunk_id,
        retrieved.doc_id,
        retrieved.title,
        retrieved.text,
    )
    assert chunk.score == pytest.approx(0.25 + row / 10)


def test_overlapping_chunks_share_the_embedding_of_their_shared_sentence(saved):
    directory, index = saved
    store = SentenceStore.load(directory)

    first = store.context_chunk(index.retrieved_chunk(SearchHit(0, 0.9)))
    second = store.context_chunk(index.retrieved_chunk(SearchHit(1, 0.8)))

    assert first.sentences[1] == second.sentences[0]
    assert first.sentence_embeddings is not None and second.sentence_embeddings is not None
    np.testing.assert_array_equal(first.sentence_embeddings[1], second.sentence_embeddings[0])
    assert not np.array_equal(first.sentence_embeddings[0], second.sentence_embeddings[1])


def test_a_store_built_in_memory_answers_the_same(saved):
    _, index = saved
    store = SentenceStore(index.chunks, index.sentence_embeddings, version="v-test")

    chunk = store.context_chunk(index.retrieved_chunk(SearchHit(2, 0.5)))

    assert store.version == "v-test"
    assert chunk.sentences == ("Batching shares decode steps.",)
    assert chunk.sentence_embeddings is not None
    np.testing.assert_array_equal(chunk.sentence_embeddings, index.sentence_embeddings[[3]])


@pytest.mark.parametrize("row", [4, 100, -1])
def test_a_row_outside_the_index_is_a_key_error(saved, row):
    directory, _ = saved
    store = SentenceStore.load(directory)
    stray = RetrievedChunk("kv#0", "kv", "KV", "Paged attention stores keys.", 0.9, row=row)

    with pytest.raises(KeyError, match=f"row {row} is not in this index"):
        store.context_chunk(stray)


def test_a_row_that_holds_another_chunk_is_a_key_error(saved):
    directory, index = saved
    store = SentenceStore.load(directory)
    moved = index.retrieved_chunk(SearchHit(1, 0.9))
    moved = RetrievedChunk(
        moved.chunk_id, moved.doc_id, moved.title, moved.text, moved.score, row=2
    )

    with pytest.raises(KeyError, match="row 2 holds batch#0, not kv#1"):
        store.context_chunk(moved)


def test_missing_folder_names_the_build_command(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"retrieval\.build"):
        SentenceStore.load(tmp_path / "missing")


def test_a_rebuilt_index_has_another_version(saved):
    directory, _ = saved
    before = SentenceStore.load(directory)

    rebuilt = save_index(directory, built_at="2026-01-01T00:00:07Z")

    after = SentenceStore.load(directory)
    assert after.version == rebuilt.version == FaissIndex.load(directory).version
    assert after.version != before.version


# --- versions of indexes written by retrieval.build ---------------------------------------


REAL_GMTIME = time.gmtime


def build_at(monkeypatch, corpus: Path, output: Path, unix_time: int) -> FaissIndex:
    """retrieval.build.build_index with the clock that stamps `built_at` fixed."""
    stamp = REAL_GMTIME(unix_time)
    monkeypatch.setattr(time, "gmtime", lambda *args: stamp)
    return build_index(
        corpus,
        output,
        HashEmbedder(),
        "fake-hash-embedder",
        ChunkingParams(chunk_tokens=8, overlap_tokens=3),
        IndexParams(),
        show_progress=False,
    )


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    root = tmp_path / "corpus"
    root.mkdir()
    (root / "one.txt").write_text("Alpha is first. Beta is second. Gamma is third.")
    (root / "two.txt").write_text("Delta is fourth.")
    return root


def test_rebuilding_the_same_corpus_later_gives_a_new_version(monkeypatch, corpus, tmp_path):
    output = tmp_path / "index"
    build_at(monkeypatch, corpus, output, 1_700_000_000)
    old_store = SentenceStore.load(output)

    build_at(monkeypatch, corpus, output, 1_700_000_001)

    assert SentenceStore.load(output).version == FaissIndex.load(output).version
    assert old_store.version != FaissIndex.load(output).version


def test_rebuilding_edited_text_in_the_same_second_gives_a_new_version(
    monkeypatch, corpus, tmp_path
):
    output = tmp_path / "index"
    build_at(monkeypatch, corpus, output, 1_700_000_000)
    old_store = SentenceStore.load(output)
    (corpus / "one.txt").write_text("Alpha is last. Beta is second. Gamma is third.")

    build_at(monkeypatch, corpus, output, 1_700_000_000)

    assert old_store.version != FaissIndex.load(output).version


# --- the sentence embeddings of given chunks (for attribution) ------------------------------


def test_embeddings_of_maps_each_stored_sentence_of_the_chunks_to_its_row(saved):
    directory, _ = saved
    store = SentenceStore.load(directory)
    rows = unit_rows(len(SENTENCES), seed=4)

    known = store.embeddings_of(iter(["kv#0", "batch#0"]))  # any iterable, e.g. a generator

    assert set(known) == {SENTENCES[0], SENTENCES[1], SENTENCES[3]}
    for row in (0, 1, 3):
        np.testing.assert_array_equal(known[SENTENCES[row]], rows[row])


def test_embeddings_of_overlapping_chunks_holds_each_sentence_once(saved):
    directory, _ = saved
    store = SentenceStore.load(directory)

    known = store.embeddings_of(["kv#0", "kv#1", "sched#0"])

    assert list(known) == [SENTENCES[0], SENTENCES[1], SENTENCES[2], SENTENCES[4]]
    np.testing.assert_array_equal(known[SENTENCES[0]], unit_rows(len(SENTENCES), seed=4)[0])


def test_embeddings_of_skips_ids_the_index_does_not_hold(saved):
    directory, _ = saved
    store = SentenceStore.load(directory)

    assert store.embeddings_of(["missing#0", "kv#9"]) == {}
    assert store.embeddings_of([]) == {}
    assert set(store.embeddings_of(["missing#0", "batch#0"])) == {SENTENCES[3]}
