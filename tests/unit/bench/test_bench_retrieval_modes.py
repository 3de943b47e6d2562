"""bench.retrieval_modes: the split, the runs, the choice of weighting, the summary and the
Markdown on a fake ranker, and one real run of the command on a tiny SQuAD-format set
(real BM25 and FAISS, a hash embedder in place of sentence-transformers)."""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest

from bench import retrieval_modes as modes
from bench.retrieval_modes import Variant
from bench.squad import SquadQuestion, load_squad, write_corpus_jsonl
from retrieval import retriever as retriever_module
from retrieval.build import build_index
from retrieval.chunking import ChunkingParams
from retrieval.index import IndexParams


def question(i: int, gold: str) -> SquadQuestion:
    return SquadQuestion(f"q{i}", f"question {i}?", ("answer",), gold)


class FakeRanker(modes.Ranker):
    """Dense finds the gold at rank 2 for even questions only; lexical at rank 1 for all;
    hybrid with more lexical weight behaves as lexical, otherwise as dense."""

    def rank_doc_ids(self, question, embedding, top_k, variant):
        number = int(question.split()[1].rstrip("?"))
        gold = f"p{number}"
        if variant.mode == "lexical" or (
            variant.mode == "hybrid" and variant.lexical_weight > variant.dense_weight
        ):
            return [gold, "other"][:top_k]
        return ["other", gold][:top_k] if number % 2 == 0 else ["other", "else"][:top_k]


QUESTIONS = [question(i, f"p{i}") for i in range(40)]
VARIANTS = modes.variants_for([(1, 1), (1, 2)])


def test_weighting_parses_dense_to_lexical():
    assert modes.weighting("2:1") == (2.0, 1.0)
    for bad in ("2", "a:b", "0:0", "-1:1"):
        with pytest.raises(argparse.ArgumentTypeError):
            modes.weighting(bad)


def test_variants_and_names():
    assert [v.name for v in VARIANTS] == ["dense", "lexical", "hybrid 1:1", "hybrid 1:2"]


def test_halves_are_disjoint_seeded_and_cover_every_question():
    selection, report = modes.split_halves(QUESTIONS[:9], seed=3)

    assert (len(selection), len(report)) == (4, 5)
    assert {q.question_id for q in selection + report} == {q.question_id for q in QUESTIONS[:9]}
    assert (selection, report) == modes.split_halves(QUESTIONS[:9], seed=3)
    assert modes.split_halves(QUESTIONS, seed=4) != modes.split_halves(QUESTIONS, seed=3)


def test_runs_recalls_choice_and_summary():
    embeddings = np.zeros((len(QUESTIONS), 4), dtype=np.float32)
    runs = modes.run_variants(FakeRanker(), QUESTIONS, embeddings, VARIANTS, top_k=2)

    assert runs["dense"].recalls(QUESTIONS, 1) == [0.0] * 40
    assert runs["dense"].recalls(QUESTIONS, 2) == [float(i % 2 == 0) for i in range(40)]
    assert modes.choose_weighting(runs, QUESTIONS) == "hybrid 1:2"
    rows = modes.summarize(runs, QUESTIONS, {"dense": 0.5})
    by_name = {row["variant"]: row for row in rows}
    assert by_name["dense"]["recall@5"] == 0.5
    assert by_name["lexical"]["recall@1"] == 1.0
    assert "minus_dense_recall@5" not in by_name["dense"]
    interval = by_name["hybrid 1:2"]["minus_dense_recall@5"]
    assert interval["estimate"] == pytest.approx(0.5)
    assert interval["low"] > 0 and interval["n"] == 40
    assert by_name["hybrid 1:1"]["minus_dense_recall@5"]["estimate"] == 0
    assert modes.verdict(interval) == "better"
    assert modes.verdict(by_name["hybrid 1:1"]["minus_dense_recall@5"]) == (
        "no detectable difference"
    )
    assert by_name["dense"]["search_ms_p50"] >= 0


def test_choosing_needs_a_hybrid_variant():
    runs = {"dense": modes.VariantRun(Variant("dense"), [], [])}
    with pytest.raises(ValueError, match="no hybrid"):
        modes.choose_weighting(runs, [])


# --- one real run ------------------------------------------------------------------------

DIMENSION = 8


class HashEmbedder:
    dimension = DIMENSION

    def encode(self, texts, show_progress: bool = False) -> np.ndarray:
        if not len(texts):
            return np.zeros((0, DIMENSION), dtype=np.float32)
        rows = []
        for text in texts:
            seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
            vector = np.random.default_rng(seed).standard_normal(DIMENSION)
            rows.append(vector / np.linalg.norm(vector))
        return np.asarray(rows, dtype=np.float32)

    def token_offsets(self, text: str) -> list[tuple[int, int]]:
        return [m.span() for m in re.finditer(r"\S+", text)]


TOPICS = ["normans", "amazon", "oxygen", "warsaw", "huguenots", "steam", "rhine", "kenya"]


@pytest.fixture
def squad_file(tmp_path: Path) -> Path:
    paragraphs = []
    for topic in TOPICS:
        qas = [
            {
                "id": f"{topic}-{n}",
                "question": f"What about {topic} number {n}?",
                "answers": [{"text": topic, "answer_start": 0}],
            }
            for n in range(3)
        ]
        paragraphs.append({"context": f"{topic} is described here at length.", "qas": qas})
    data = {"data": [{"title": "Tiny", "paragraphs": paragraphs}]}
    path = tmp_path / "squad.json"
    path.write_text(json.dumps(data))
    return path


def test_the_command_runs_on_a_tiny_index(squad_file, tmp_path, monkeypatch, capsys):
    squad = load_squad(squad_file)
    write_corpus_jsonl(squad, tmp_path / "corpus" / "c.jsonl")
    build_index(
        tmp_path / "corpus",
        tmp_path / "index",
        HashEmbedder(),
        "fake-hash-embedder",
        ChunkingParams(chunk_tokens=32, overlap_tokens=4),
        IndexParams(kind="flat"),
        show_progress=False,
    )
    monkeypatch.setattr(
        retriever_module.Embedder, "load", staticmethod(lambda *a, **k: HashEmbedder())
    )
    out = tmp_path / "out"

    code = modes.main(
        [
            "--index",
            str(tmp_path / "index"),
            "--squad-file",
            str(squad_file),
            "--weights",
            "1:1",
            "2:1",
            "--candidates",
            "4",
            "--timing-questions",
            "3",
            "--out",
            str(out),
            "--label",
            "tiny",
        ]
    )

    assert code == 0
    document = json.loads((out / "tiny.json").read_text())
    summary = document["summary"]
    assert (summary["questions"], summary["selection_n"], summary["report_n"]) == (24, 12, 12)
    rows = {row["variant"]: row for row in summary["rows"]}
    assert set(rows) == {"dense", "lexical", "hybrid 1:1", "hybrid 2:1"}
    # Each question names its paragraph's one distinctive word: BM25 finds every gold first.
    assert rows["lexical"]["recall@1"] == 1.0
    assert summary["chosen"] in {"hybrid 1:1", "hybrid 2:1"}
    assert summary["embedding_ms"]["n"] == 3
    assert summary["lexical"]["kind"] == "bm25"
    report = (out / "tiny.md").read_text()
    assert "| lexical |" in report and "(chosen)" in report
    assert document["command"].startswith("python -m bench.retrieval_modes --index")
