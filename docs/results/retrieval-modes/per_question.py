"""Hybrid retrieval's recall with every question's result stored.

The run in squad-dev.json (bench.retrieval_modes, retired at 4d0d0cc, all 10,565 SQuAD v1.1
dev questions) kept its summary only, so its intervals cannot be recomputed and hybrid
against BM25 alone had none. That set is no longer in the tree: `bench.quality prepare` now
takes SQuAD from a wheel that ships a random 1,000 of its dev questions (bench/squad.py).
This script measures the same comparison again on that sample, with today's retriever and
index: the questions shuffled and split as that run did (seed 0, twice; the second half
reports), ranked in the three modes the service offers (dense, lexical, hybrid at the
shipped 1:1, rrf_k 60, 50 candidates). It stores the gold paragraph's rank per question and
mode (per_question.json) and computes recall@k and the paired bootstrap intervals from those
records alone (summary.json).

    .venv/bin/python docs/results/retrieval-modes/per_question.py
    .venv/bin/python docs/results/retrieval-modes/per_question.py --summarize-only

Needs `python -m bench.quality prepare` (the SQuAD sample and its index, with the lexical
part). Run from the repository root with PYTHONPATH=. so the tree's own modules load.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RECORDS = HERE / "per_question.json"
SUMMARY = HERE / "summary.json"
MODES = ("dense", "lexical", "hybrid")
KS = (1, 3, 5, 10)
PAIRS = (("hybrid", "dense"), ("lexical", "dense"), ("hybrid", "lexical"))


def rank_all(index: Path, squad_file: Path, seed: int) -> dict:
    import faiss
    import torch

    from bench.labs import machine
    from bench.squad import load_squad
    from retrieval.fusion import HybridParams
    from retrieval.index import read_manifest
    from retrieval.models import resolve_model_reference
    from retrieval.retriever import Retriever

    torch.set_num_threads(1)
    faiss.omp_set_num_threads(1)
    questions = list(load_squad(squad_file).questions)
    random.Random(seed).shuffle(questions)  # as bench.retrieval_modes did, then its split:
    random.Random(seed).shuffle(questions)
    report = questions[len(questions) // 2 :]
    manifest = read_manifest(index)
    hybrid = HybridParams(mode="hybrid", dense_weight=1.0, lexical_weight=1.0)
    retriever = Retriever.load(
        index, resolve_model_reference(manifest.embedding_model), hybrid=hybrid
    )
    embeddings = retriever.embed([q.question for q in report])
    chunks = retriever.index.chunks
    rows = []
    for question, embedding in zip(report, embeddings, strict=True):
        row: dict = {"question_id": question.question_id, "paragraph_id": question.paragraph_id}
        for mode in MODES:
            hits = retriever.rank(embedding, max(KS), question=question.question, mode=mode)
            found = [chunks[hit.position].chunk.doc_id for hit in hits]
            row[mode] = (
                found.index(question.paragraph_id) + 1 if question.paragraph_id in found else None
            )
        rows.append(row)
    return {
        "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpu": machine(),
        "index": str(index),
        "index_version": retriever.index.version,
        "squad_file": str(squad_file),
        "seed": seed,
        "split": "all dev questions shuffled twice with Random(seed); the second half",
        "hybrid": {
            "dense_weight": 1.0,
            "lexical_weight": 1.0,
            "rrf_k": hybrid.rrf_k,
            "candidates": hybrid.candidates,
        },
        "rank_of_gold": "1-based rank of the first chunk of the gold paragraph in the top 10, "
        "null when none",
        "questions": rows,
    }


def summarize(records: dict) -> dict:
    from bench.stats import interval_dict, one_sample, paired_difference, sample_mean

    rows = records["questions"]

    def hit(row: dict, mode: str, k: int) -> float:
        return 1.0 if row[mode] is not None and row[mode] <= k else 0.0

    recall = {
        mode: {f"@{k}": interval_dict(one_sample([hit(r, mode, k) for r in rows], sample_mean))
               for k in KS}
        for mode in MODES
    }  # fmt: skip
    differences = {
        f"{a} - {b} @5": interval_dict(
            paired_difference((hit(r, a, 5), hit(r, b, 5)) for r in rows)
        )
        for a, b in PAIRS
    }
    return {"n": len(rows), "measured_at": records["measured_at"], "cpu": records["cpu"],
            "recall": recall, "paired_differences": differences}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index", type=Path, default=Path("indexes/squad-dev"))
    parser.add_argument(
        "--squad-file", type=Path, default=Path(".cache/squad/squad-v1.1-dev-sample1000.json")
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--summarize-only", action="store_true")
    args = parser.parse_args()
    if not args.summarize_only:
        RECORDS.write_text(json.dumps(rank_all(args.index, args.squad_file, args.seed)))
    summary = summarize(json.loads(RECORDS.read_text()))
    SUMMARY.write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
