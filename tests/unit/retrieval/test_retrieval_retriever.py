"""retrieval.retriever: embed the question, search FAISS, answer with RetrievedChunks.

The embedder is a fake that maps known questions to fixed vectors: these tests are about the
retriever's wiring (what it embeds, what it searches, what it returns). The index is a real
FAISS index built with FaissIndex.build.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from pipeline.messages import Retrieval, RetrievedChunk
from retrieval import retriever as retriever_module
from retrieval.chunking import Chunk
from retrieval.index import FaissIndex, IndexedChunk, IndexParams, Manifest
from retrieval.retriever import Retriever

DIMENSION = 8
NUM_CHUNKS = 12


def unit_rows(n: int, seed: int) -> np.ndarray:
    rows = np.random.default_rng(seed).standard_normal((n, DIMENSION)).astype(np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


CHUNK_VECTORS = unit_rows(NUM_CHUNKS, seed=11)


def near(row: int, seed: int = 0) -> np.ndarray:
    """A unit vector close to chunk `row`'s vector (and to no other)."""
    noise = np.random.default_rng(seed).standard_normal(DIMENSION).astype(np.float32)
    vector = CHUNK_VECTORS[row] + 0.05 * noise
    return (vector / np.linalg.norm(vector)).astype(np.float32)


class FakeEmbedder:
    """Known questions to fixed unit vectors; records every call."""

    def __init__(self, vectors: dict[str, np.ndarray], dimension: int = DIMENSION) -> None:
        self.dimension = dimension
        self._vectors = vectors
        self.calls: list[list[str]] = []

    def encode(self, texts: Sequence[str], show_progress: bool = False) -> np.ndarray:
        self.calls.append(list(texts))
        return np.stack([self._vectors[text] for text in texts]).astype(np.float32)


def manifest(dimension: int = DIMENSION) -> Manifest:
    return Manifest(
        embedding_model="fake-model",
        dimension=dimension,
        num_chunks=NUM_CHUNKS,
        num_sentences=NUM_CHUNKS,
        index={},
        chunking={"chunk_tokens": 16, "overlap_tokens": 4},
        extra={"built_at": "2026-01-01T00:00:00Z"},
    )


def build_index(params: IndexParams | None = None) -> FaissIndex:
    chunks = [
        IndexedChunk(
            Chunk(f"doc{i}#0", f"doc{i}", f"Doc {i}", f"Fact {i}.", ((0, len(f"Fact {i}.")),)),
            (i,),
        )
        for i in range(NUM_CHUNKS)
    ]
    return FaissIndex.build(
        CHUNK_VECTORS, chunks, unit_rows(NUM_CHUNKS, seed=12), manifest(), params or IndexParams()
    )


QUESTIONS = {"Where is fact 4?": near(4), "And fact 9?": near(9, seed=1)}


@pytest.fixture
def embedder() -> FakeEmbedder:
    return FakeEmbedder(QUESTIONS)


@pytest.fixture
def index() -> FaissIndex:
    return build_index()


def test_retrieve_returns_the_best_chunks_first_with_their_rows(embedder, index):
    retriever = Retriever(embedder, index)

    retrieval = retriever.retrieve("Where is fact 4?", top_k=3)

    assert isinstance(retrieval, Retrieval)
    assert embedder.calls == [["Where is fact 4?"]]
    assert len(retrieval.chunks) == 3
    assert all(isinstance(chunk, RetrievedChunk) for chunk in retrieval.chunks)
    best = retrieval.chunks[0]
    assert (best.chunk_id, best.doc_id, best.title, best.text, best.row) == (
        "doc4#0",
        "doc4",
        "Doc 4",
        "Fact 4.",
        4,
    )
    # Exact inner products, best first, and each row names the chunk it came from.
    expected = sorted(
        ((float(CHUNK_VECTORS[r] @ near(4)), r) for r in range(NUM_CHUNKS)), reverse=True
    )[:3]
    assert [chunk.row for chunk in retrieval.chunks] == [row for _, row in expected]
    assert [chunk.score for chunk in retrieval.chunks] == pytest.approx(
        [score for score, _ in expected], abs=1e-5
    )
    assert all(chunk.chunk_id == f"doc{chunk.row}#0" for chunk in retrieval.chunks)


def test_retrieval_carries_the_question_vector_and_the_index_version(embedder, index):
    retrieval = Retriever(embedder, index).retrieve("And fact 9?", top_k=2)

    np.testing.assert_array_equal(retrieval.question_embedding, near(9, seed=1))
    assert retrieval.question_embedding.shape == (DIMENSION,)
    assert retrieval.index_version == index.version
    assert retrieval.chunks[0].row == 9


def test_retrieve_times_its_own_work(embedder, index):
    before = time.time()

    retrieval = Retriever(embedder, index).retrieve("Where is fact 4?", top_k=2)

    assert before <= retrieval.timing.started_at_s <= time.time()
    assert 0 <= retrieval.timing.own_ms < 5_000


def test_search_stamps_the_start_it_is_given(embedder, index):
    retriever = Retriever(embedder, index)
    [vector] = retriever.embed(["And fact 9?"])
    started = time.perf_counter() - 0.25  # the request's work began 250 ms ago

    retrieval = retriever.search(vector, 1, started_at_s=1_700_000_000.0, started=started)

    assert retrieval.timing.started_at_s == 1_700_000_000.0
    assert retrieval.timing.own_ms >= 250
    assert [chunk.row for chunk in retrieval.chunks] == [9]


def test_embed_returns_one_row_per_question_in_order(embedder, index):
    vectors = Retriever(embedder, index).embed(["And fact 9?", "Where is fact 4?"])

    assert embedder.calls == [["And fact 9?", "Where is fact 4?"]]
    np.testing.assert_array_equal(vectors, np.stack([near(9, seed=1), near(4)]))


def test_top_k_beyond_the_collection_returns_every_chunk(embedder, index):
    retriever = Retriever(embedder, index)

    retrieval = retriever.retrieve("Where is fact 4?", top_k=50)

    assert retriever.num_chunks == NUM_CHUNKS
    assert sorted(chunk.row for chunk in retrieval.chunks) == list(range(NUM_CHUNKS))
    scores = [chunk.score for chunk in retrieval.chunks]
    assert scores == sorted(scores, reverse=True)


def test_an_embedder_of_another_dimension_is_refused(index):
    with pytest.raises(ValueError, match=r"fake-model \(8 dims\).*\(16 dims\)"):
        Retriever(FakeEmbedder({}, dimension=16), index)


def test_load_reads_the_index_without_sentence_embeddings(monkeypatch, tmp_path: Path):
    build_index(IndexParams(kind="hnsw", hnsw_m=4)).save(tmp_path)
    loaded_with = []

    def fake_load(model_path: str, device: str = "cpu", batch_size: int = 64) -> FakeEmbedder:
        loaded_with.append((model_path, device, batch_size))
        return FakeEmbedder(QUESTIONS)

    monkeypatch.setattr(retriever_module.Embedder, "load", staticmethod(fake_load))

    retriever = Retriever.load(tmp_path, "org/embedder", batch_size=5, ef_search=77)

    assert loaded_with == [("org/embedder", "cpu", 5)]
    assert retriever.index.sentence_embeddings.shape == (0, DIMENSION)
    assert retriever.index._index.hnsw.efSearch == 77
    retrieval = retriever.retrieve("Where is fact 4?", top_k=1)
    assert [chunk.row for chunk in retrieval.chunks] == [4]
    assert retrieval.index_version == FaissIndex.load(tmp_path).version
