"""Dense, lexical (BM25) and hybrid (RRF) retrieval on SQuAD dev: recall@k and what each costs.

    python -m bench.retrieval_modes [--index indexes/squad-dev] [--questions 0] [--seed 0] \\
        [--weights 1:1 2:1 1:2 3:1] [--out docs/results/retrieval-modes]

Needs the index `python -m bench.quality prepare` builds (with its lexical part). Questions are
drawn with a seed (`--questions 0`: all of them) and split at random into two halves: the
weighting (dense:lexical) with the best hybrid recall@5 on the *selection* half is chosen, and
every figure in the table is measured on the other, *report* half, so the chosen weighting's
advantage is not fitted to the questions it is judged on. Gold is the question's paragraph: a
hit counts when a retrieved chunk's doc id is that paragraph's id (as bench.quality scores it).

Each question is searched one at a time in every mode in turn (modes interleaved, so load on
the shared machine falls on all of them alike), with one thread for torch and faiss. Search
ms is the ranking alone (tokenizing included for BM25, the fusion included for hybrid) from a
precomputed question embedding; the embedding's own ms is measured separately, one question
at a time, over `--timing-questions` questions. Hybrid - dense recall@5 carries a paired
bootstrap 95% interval (bench.bootstrap); one that holds 0 is no detectable difference.
Writes OUT/<label>.json (config, summary) and OUT/<label>.md.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.bootstrap import mean, paired_ci
from bench.outputs import label, positive_int, write_json_and_markdown
from bench.squad import DEFAULT_CACHE_DIR, SQUAD_DEV_FILENAME, SquadQuestion, load_squad
from bench.squad_metrics import recall_at_k
from bench.stats import format_ms, percentile
from pipeline.messages import RetrievalMode
from retrieval.fusion import HybridParams

logger = logging.getLogger(__name__)

KS = (1, 3, 5, 10)
REPORT_K = 5
DEFAULT_WEIGHTS = ("1:1", "2:1", "1:2", "3:1")
DEFAULT_INDEX = Path("indexes/squad-dev")
DEFAULT_OUT = Path("docs/results/retrieval-modes")


@dataclass(frozen=True)
class Variant:
    """One way to rank: a mode, and for hybrid its dense and lexical weights."""

    mode: RetrievalMode
    dense_weight: float = 1.0
    lexical_weight: float = 1.0

    @property
    def name(self) -> str:
        if self.mode != "hybrid":
            return self.mode
        return f"hybrid {self.dense_weight:g}:{self.lexical_weight:g}"


def weighting(text: str) -> tuple[float, float]:
    """argparse type: `dense:lexical` weights such as `2:1`."""
    try:
        dense, lexical = (float(part) for part in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected dense:lexical, e.g. 2:1") from None
    if dense < 0 or lexical < 0 or dense + lexical == 0:
        raise argparse.ArgumentTypeError(f"{text!r}: weights must be >= 0, one of them > 0")
    return dense, lexical


def variants_for(weights: Sequence[tuple[float, float]]) -> list[Variant]:
    """Dense, lexical, then one hybrid variant per weighting."""
    return [
        Variant("dense"),
        Variant("lexical"),
        *(Variant("hybrid", dense, lexical) for dense, lexical in weights),
    ]


def split_halves(
    questions: Sequence[SquadQuestion], seed: int
) -> tuple[list[SquadQuestion], list[SquadQuestion]]:
    """(selection, report): a seeded random split, the report half taking the odd one."""
    shuffled = list(questions)
    random.Random(seed).shuffle(shuffled)
    half = len(shuffled) // 2
    return shuffled[:half], shuffled[half:]


@dataclass
class VariantRun:
    """One variant over some questions: per question its retrieved doc ids and search ms."""

    variant: Variant
    doc_ids: list[list[str]]
    search_ms: list[float]

    def recalls(self, questions: Sequence[SquadQuestion], k: int) -> list[float]:
        """Per-question recall@k (1.0 when the gold paragraph is in the top k)."""
        return [
            recall_at_k(found, question.paragraph_id, k)
            for found, question in zip(self.doc_ids, questions, strict=True)
        ]


class Ranker:
    """What the benchmark needs of retrieval.retriever.Retriever (a fake in the tests)."""

    def rank_doc_ids(
        self, question: str, embedding: np.ndarray, top_k: int, variant: Variant
    ) -> list[str]:
        raise NotImplementedError


class RetrieverRanker(Ranker):
    def __init__(self, retriever: Any) -> None:
        self._retriever = retriever

    def rank_doc_ids(
        self, question: str, embedding: np.ndarray, top_k: int, variant: Variant
    ) -> list[str]:
        hits = self._retriever.rank(
            embedding,
            top_k,
            question=question,
            mode=variant.mode,
            dense_weight=variant.dense_weight,
            lexical_weight=variant.lexical_weight,
        )
        chunks = self._retriever.index.chunks
        return [chunks[hit.position].chunk.doc_id for hit in hits]


def run_variants(
    ranker: Ranker,
    questions: Sequence[SquadQuestion],
    embeddings: np.ndarray,
    variants: Sequence[Variant],
    top_k: int = max(KS),
) -> dict[str, VariantRun]:
    """Every question through every variant, one at a time, variants interleaved."""
    runs = {v.name: VariantRun(v, [], []) for v in variants}
    for number, (question, embedding) in enumerate(zip(questions, embeddings, strict=True)):
        for variant in variants:
            started = time.perf_counter()
            found = ranker.rank_doc_ids(question.question, embedding, top_k, variant)
            elapsed_ms = (time.perf_counter() - started) * 1000
            run = runs[variant.name]
            run.doc_ids.append(found)
            run.search_ms.append(elapsed_ms)
        if (number + 1) % 1000 == 0:
            logger.info("searched %d/%d questions", number + 1, len(questions))
    return runs


def choose_weighting(
    runs: dict[str, VariantRun], questions: Sequence[SquadQuestion], k: int = REPORT_K
) -> str:
    """The hybrid variant with the best mean recall@k on `questions` (the first listed wins
    a tie)."""
    hybrids = [run for run in runs.values() if run.variant.mode == "hybrid"]
    if not hybrids:
        raise ValueError("no hybrid variant to choose from")
    best = max(hybrids, key=lambda run: mean(np.asarray(run.recalls(questions, k))))
    return best.variant.name


def summarize(
    runs: dict[str, VariantRun],
    questions: Sequence[SquadQuestion],
    selection_recall: dict[str, float],
) -> list[dict[str, Any]]:
    """One row per variant: recall@k for each k on `questions`, the selection half's
    recall@5, search ms p50/p99/mean, and hybrid or lexical minus dense recall@5 with its
    paired 95% interval."""
    dense = runs["dense"].recalls(questions, REPORT_K)
    rows = []
    for name, run in runs.items():
        row: dict[str, Any] = {"variant": name, **asdict(run.variant), "n": len(questions)}
        for k in KS:
            row[f"recall@{k}"] = mean(np.asarray(run.recalls(questions, k)))
        row["selection_recall@5"] = selection_recall.get(name)
        row["search_ms_p50"] = percentile(run.search_ms, 50)
        row["search_ms_p99"] = percentile(run.search_ms, 99)
        row["search_ms_mean"] = float(np.mean(run.search_ms))
        if name != "dense":
            interval = paired_ci(run.recalls(questions, REPORT_K), dense, stat=mean)
            row["minus_dense_recall@5"] = asdict(interval)
        rows.append(row)
    return rows


def time_embeddings(retriever: Any, questions: Sequence[SquadQuestion]) -> list[float]:
    """ms to embed each question alone (a batch of one, as an unbatched request)."""
    timings = []
    for question in questions:
        started = time.perf_counter()
        retriever.embed([question.question])
        timings.append((time.perf_counter() - started) * 1000)
    return timings


def verdict(interval: dict[str, float]) -> str:
    """How a difference's 95% interval reads."""
    if interval["low"] <= 0 <= interval["high"]:
        return "no detectable difference"
    return "better" if interval["low"] > 0 else "worse"


def markdown(document: dict[str, Any]) -> str:
    """The report: the recall table, the chosen weighting's verdict, the costs."""
    summary = document["summary"]
    config = document["config"]
    chosen = summary["chosen"]
    lines = [
        "# Retrieval modes on SQuAD dev: dense, lexical (BM25), hybrid (RRF)",
        "",
        f"Index `{config['index']}` ({summary['num_chunks']:,} chunks, version "
        f"`{summary['index_version']}`), {summary['questions']:,} questions (seed "
        f"{config['seed']}): weighting chosen on {summary['selection_n']:,}, everything below "
        f"measured on the other {summary['report_n']:,}. RRF rrf_k {config['rrf_k']:g}, "
        f"{config['candidates']} candidates per ranker. Gold: the question's paragraph.",
        "",
        "| variant | recall@1 | recall@3 | recall@5 | recall@10 | - dense recall@5 [95% CI] "
        "| selection half recall@5 | search ms p50 | p99 |",
        "|---|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for row in summary["rows"]:
        interval = row.get("minus_dense_recall@5")
        difference = (
            "-"
            if interval is None
            else f"{interval['estimate']:+.4f} [{interval['low']:+.4f}, {interval['high']:+.4f}]"
        )
        marker = " (chosen)" if row["variant"] == chosen else ""
        selection = row["selection_recall@5"]
        lines.append(
            f"| {row['variant']}{marker} | "
            + " | ".join(f"{row[f'recall@{k}']:.4f}" for k in KS)
            + f" | {difference} | {'-' if selection is None else f'{selection:.4f}'} | "
            f"{row['search_ms_p50']:.3f} | {row['search_ms_p99']:.3f} |"
        )
    chosen_row = next(row for row in summary["rows"] if row["variant"] == chosen)
    interval = chosen_row["minus_dense_recall@5"]
    embed = summary["embedding_ms"]
    lines += [
        "",
        f"Chosen on the selection half: **{chosen}**. On the report half its recall@5 minus "
        f"dense is {interval['estimate']:+.4f} [{interval['low']:+.4f}, "
        f"{interval['high']:+.4f}] (n = {interval['n']:,}): {verdict(interval)}. The other "
        "weightings' intervals are exploratory (several comparisons on one half).",
        "",
        f"Question embedding (needed by dense and hybrid; one question at a time, "
        f"{embed['n']:,} questions): p50 {format_ms(embed['p50'])} ms, p99 "
        f"{format_ms(embed['p99'])} ms. Search ms above exclude it. One thread; load average "
        f"{summary['load_average'][0]:.1f} at the start, "
        f"{summary.get('load_average_end', [math.nan])[0]:.1f} at the end "
        f"({summary['cpu_count']} CPUs, shared with other services).",
        "",
        f"Command: `{document['command']}`",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index", type=Path, default=DEFAULT_INDEX)
    parser.add_argument("--squad-file", type=Path, default=DEFAULT_CACHE_DIR / SQUAD_DEV_FILENAME)
    parser.add_argument(
        "--questions", type=int, default=0, help="questions to draw (0: all of them)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--weights", type=weighting, nargs="+", default=[weighting(w) for w in DEFAULT_WEIGHTS]
    )
    parser.add_argument("--rrf-k", type=float, default=HybridParams.rrf_k)
    parser.add_argument("--candidates", type=positive_int, default=HybridParams.candidates)
    parser.add_argument("--timing-questions", type=positive_int, default=1000)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--label", type=label, default="squad-dev")
    arguments = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(arguments)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    import faiss
    import torch

    from retrieval.index import read_manifest
    from retrieval.models import resolve_model_reference
    from retrieval.retriever import Retriever

    torch.set_num_threads(1)
    faiss.omp_set_num_threads(1)
    squad = load_squad(args.squad_file)
    questions = list(squad.questions)
    random.Random(args.seed).shuffle(questions)
    if args.questions:
        questions = questions[: args.questions]
    selection, report = split_halves(questions, args.seed)
    manifest = read_manifest(args.index)
    hybrid = HybridParams(mode="dense", rrf_k=args.rrf_k, candidates=args.candidates)
    retriever = Retriever.load(
        args.index, resolve_model_reference(manifest.embedding_model), hybrid=hybrid
    )
    if not retriever.has_lexical:
        print(f"error: {args.index} has no lexical index; rebuild it", file=sys.stderr)
        return 1
    load_average = os.getloadavg()
    logger.info("embedding %d questions", len(questions))
    embeddings = retriever.embed([q.question for q in questions])
    by_id = {q.question_id: row for row, q in enumerate(questions)}
    variants = variants_for(args.weights)
    ranker = RetrieverRanker(retriever)

    def run(half: Sequence[SquadQuestion]) -> dict[str, VariantRun]:
        rows = [by_id[q.question_id] for q in half]
        return run_variants(ranker, half, embeddings[rows], variants)

    selection_runs = run(selection)
    selection_recall = {
        name: mean(np.asarray(r.recalls(selection, REPORT_K))) for name, r in selection_runs.items()
    }
    chosen = choose_weighting(selection_runs, selection)
    report_runs = run(report)
    embedding_ms = time_embeddings(retriever, report[: args.timing_questions])
    document = {
        "config": {
            "index": str(args.index),
            "squad_file": str(args.squad_file),
            "questions": args.questions,
            "seed": args.seed,
            "weights": [list(w) for w in args.weights],
            "rrf_k": args.rrf_k,
            "candidates": args.candidates,
            "ks": list(KS),
            "timing_questions": args.timing_questions,
        },
        "command": " ".join(["python -m bench.retrieval_modes", *arguments]),
        "summary": {
            "index_version": retriever.index.version,
            "num_chunks": retriever.num_chunks,
            "lexical": retriever.index.manifest.extra.get("lexical"),
            "questions": len(questions),
            "selection_n": len(selection),
            "report_n": len(report),
            "chosen": chosen,
            "rows": summarize(report_runs, report, selection_recall),
            "embedding_ms": {
                "n": len(embedding_ms),
                "p50": percentile(embedding_ms, 50),
                "p99": percentile(embedding_ms, 99),
                "mean": float(np.mean(embedding_ms)),
            },
            "load_average": list(load_average),
            "load_average_end": list(os.getloadavg()),
            "cpu_count": os.cpu_count(),
        },
    }
    for path in write_json_and_markdown(args.out, args.label, document, markdown(document)):
        print(path)
    print(markdown(document))
    return 0


if __name__ == "__main__":
    sys.exit(main())
