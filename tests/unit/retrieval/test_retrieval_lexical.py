"""retrieval.lexical with the real bm25s on a tiny corpus, its place in retrieval.build's
output, and lexical / hybrid retrieval through retrieval.retriever.Retriever.

The embedder is faked (hash vectors) because these tests are about the lexical part and the
fusion's wiring; BM25 itself is real.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from index_fakes import HashEmbedder

from retrieval import retriever as retriever_module
from retrieval.build import build_index
from retrieval.chunking import ChunkingParams
from retrieval.fusion import HybridParams, reciprocal_rank_fusion
from retrieval.index import MANIFEST_FILE, FaissIndex, IndexParams, manifest_version
from retrieval.lexical import (
    LEXICAL_DIR,
    LexicalIndex,
    LexicalIndexMissing,
    has_lexical,
)
from retrieval.retriever import Retriever

TEXTS = [
    "The Normans settled in Normandy in the tenth century.",
    "Photosynthesis converts light energy into chemical energy in chloroplasts.",
    "The Amazon rainforest covers much of the Amazon basin of South America.",
    "Oxygen is released as a by-product of photosynthesis.",
    "The of and a to in",
]


@pytest.fixture
def lexical() -> LexicalIndex:
    return LexicalIndex.build(TEXTS)


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    root = tmp_path / "corpus"
    root.mkdir()
    records = [{"id": f"p{i}", "title": f"P{i}", "text": text} for i, text in enumerate(TEXTS)]
    (root / "paragraphs.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return root


def build(corpus: Path, output: Path) -> FaissIndex:
    return build_index(
        corpus,
        output,
        HashEmbedder(),
        "fake-hash-embedder",
        ChunkingParams(chunk_tokens=64, overlap_tokens=4),
        IndexParams(kind="flat"),
        show_progress=False,
    )


def load_retriever(
    index_dir: Path, monkeypatch, hybrid: HybridParams | None = None, dense_fallback=False
):
    monkeypatch.setattr(
        retriever_module.Embedder, "load", staticmethod(lambda *a, **k: HashEmbedder())
    )
    return Retriever.load(index_dir, "fake", hybrid=hybrid, dense_fallback=dense_fallback)


# --- LexicalIndex ------------------------------------------------------------------------


def test_an_exact_term_finds_its_chunk_first(lexical):
    hits = lexical.search("Who settled in Normandy?", top_k=3)

    assert hits[0].position == 0
    assert hits[0].score > 0
    # Two chunks say "photosynthesis": both, and nothing without the word.
    assert {hit.position for hit in lexical.search("photosynthesis", 5)} == {1, 3}


def test_hits_are_best_first_and_cut_to_top_k(lexical):
    hits = lexical.search("photosynthesis chemical energy chloroplasts", top_k=1)

    assert [hit.position for hit in hits] == [1]
    scores = [hit.score for hit in lexical.search("amazon energy photosynthesis", 5)]
    assert scores == sorted(scores, reverse=True)


def test_stopwords_and_unknown_words_find_nothing(lexical):
    assert lexical.tokenize("Is the Amazon in it?") == ["amazon"]
    assert lexical.search("is it the", 5) == []
    assert lexical.search("zeppelin", 5) == []
    assert lexical.search("amazon", 0) == []


def test_save_and_load_give_the_same_hits(lexical, tmp_path):
    lexical.save(tmp_path)
    loaded = LexicalIndex.load(tmp_path)

    assert (tmp_path / LEXICAL_DIR).is_dir()
    assert loaded.num_rows == len(TEXTS)
    assert loaded.describe() == lexical.describe()
    for query in ("normandy", "light energy", "amazon basin", "oxygen photosynthesis"):
        assert loaded.search(query, 5) == lexical.search(query, 5)


def test_loading_a_folder_without_a_lexical_part_says_so(tmp_path):
    with pytest.raises(LexicalIndexMissing, match="no lexical index"):
        LexicalIndex.load(tmp_path)


def test_build_refuses_an_empty_collection():
    with pytest.raises(ValueError, match="at least one text"):
        LexicalIndex.build([])


# --- built and versioned with the dense index ----------------------------------------------


def test_build_writes_the_lexical_part_and_the_manifest_records_it(corpus, tmp_path):
    output = tmp_path / "index"
    index = build(corpus, output)

    manifest = json.loads((output / MANIFEST_FILE).read_text())
    assert manifest["extra"]["lexical"]["kind"] == "bm25"
    assert manifest["extra"]["lexical"]["num_rows"] == len(index.chunks) == len(TEXTS)
    assert manifest["extra"]["lexical"]["library"].startswith("bm25s==")
    loaded = FaissIndex.load(output)
    assert has_lexical(loaded.manifest)
    lexical = LexicalIndex.load(output)
    # Rows are the FAISS rows: chunk i's text is lexical document i.
    for row, item in enumerate(loaded.chunks):
        for word in lexical.tokenize(item.chunk.text):
            assert row in {hit.position for hit in lexical.search(word, len(TEXTS))}
    # The version digests the manifest, the lexical entry included.
    without = dataclasses.replace(loaded.manifest, extra=dict(loaded.manifest.extra))
    without.extra.pop("lexical")
    assert manifest_version(without) != loaded.version


def make_old_index(corpus: Path, output: Path) -> None:
    """An index as built before the lexical part existed: no folder, no manifest entry."""
    build(corpus, output)
    shutil.rmtree(output / LEXICAL_DIR)
    manifest = json.loads((output / MANIFEST_FILE).read_text())
    del manifest["extra"]["lexical"]
    (output / MANIFEST_FILE).write_text(json.dumps(manifest))


def test_an_old_index_without_a_lexical_part_still_serves_dense(corpus, tmp_path, monkeypatch):
    output = tmp_path / "old"
    make_old_index(corpus, output)

    retriever = load_retriever(output, monkeypatch)

    assert not retriever.has_lexical
    assert retriever.retrieve("Who settled in Normandy?", top_k=2).chunks
    with pytest.raises(LexicalIndexMissing, match="built without one"):
        retriever.retrieve("Who settled in Normandy?", top_k=2, mode="hybrid")


def test_an_old_index_refuses_a_hybrid_default_at_startup(corpus, tmp_path, monkeypatch):
    output = tmp_path / "old"
    make_old_index(corpus, output)

    with pytest.raises(LexicalIndexMissing, match=r"retriever\.hybrid\.mode is 'hybrid'"):
        load_retriever(output, monkeypatch, HybridParams(mode="hybrid"))


def test_an_old_index_falls_back_to_dense_when_allowed(corpus, tmp_path, monkeypatch, caplog):
    output = tmp_path / "old"
    make_old_index(corpus, output)

    retriever = load_retriever(output, monkeypatch, HybridParams(mode="hybrid"), True)

    assert retriever.hybrid.mode == "dense"
    assert "built without a lexical index: retrieving densely" in caplog.text
    assert retriever.retrieve("Who settled in Normandy?", top_k=2).chunks


# --- lexical and hybrid through the Retriever ----------------------------------------------


def test_retriever_modes_rank_as_their_parts(corpus, tmp_path, monkeypatch):
    output = tmp_path / "index"
    build(corpus, output)
    retriever = load_retriever(output, monkeypatch, HybridParams(mode="hybrid", candidates=5))
    question = "What does photosynthesis release?"
    embedding = retriever.embed([question])[0]

    dense = retriever.rank(embedding, 5, mode="dense")
    lexical = retriever.rank(embedding, 5, question=question, mode="lexical")
    hybrid = retriever.rank(embedding, 3, question=question, mode="hybrid", lexical_weight=2)

    assert [hit.position for hit in lexical] == [
        hit.position for hit in retriever.lexical.search(question, 5)
    ]
    expected = reciprocal_rank_fusion(
        [[h.position for h in dense], [h.position for h in lexical]], [1.0, 2.0], 60, 3
    )
    assert [(h.position, h.score) for h in hybrid] == [(f.row, f.score) for f in expected]
    # The configured default (hybrid) is what retrieve uses; the chunks carry fused scores.
    retrieval = retriever.retrieve(question, top_k=3)
    default = retriever.rank(embedding, 3, question=question)
    assert [c.row for c in retrieval.chunks] == [h.position for h in default]
    assert retrieval.chunks[0].score == pytest.approx(default[0].score)


def test_lexical_and_hybrid_need_the_question_text(corpus, tmp_path, monkeypatch):
    build(corpus, tmp_path / "index")
    retriever = load_retriever(tmp_path / "index", monkeypatch)
    embedding = retriever.embed(["anything"])[0]

    with pytest.raises(ValueError, match="needs the question's text"):
        retriever.rank(embedding, 2, mode="hybrid")
    with pytest.raises(ValueError, match="at least one fusion weight"):
        retriever.rank(embedding, 2, question="x", mode="hybrid", dense_weight=0, lexical_weight=0)
