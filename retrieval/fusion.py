"""Weighted reciprocal rank fusion (RRF) of several rankings of the same rows.

    score(row) = sum_i w_i / (rrf_k + rank_i(row))

`rank_i` counts from 1 in ranking i; a row that ranking i does not hold adds nothing from it.
Ranks, not scores, are fused, so rankers whose scores live on different scales (cosine
similarity, BM25) need no calibration (Cormack, Clarke and Buettcher, SIGIR 2009, with
rrf_k = 60).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.messages import RETRIEVAL_MODES, RetrievalMode

DEFAULT_RRF_K = 60


@dataclass(frozen=True)
class FusedRow:
    """One row of a fused ranking: its fused score and its rank in each input (None: absent)."""

    row: int
    score: float
    ranks: tuple[int | None, ...]


@dataclass(frozen=True)
class HybridParams:
    """How the retriever ranks: `mode`, and for `hybrid` the fusion's weights, `rrf_k` and how
    many `candidates` each ranker contributes (at least top_k is always taken)."""

    mode: RetrievalMode = "dense"
    dense_weight: float = 1.0
    lexical_weight: float = 1.0
    rrf_k: float = DEFAULT_RRF_K
    candidates: int = 50

    def __post_init__(self) -> None:
        if self.mode not in RETRIEVAL_MODES:
            raise ValueError(f"mode must be one of {RETRIEVAL_MODES}, not {self.mode!r}")
        check_fusion_params((self.dense_weight, self.lexical_weight), self.rrf_k)
        if self.candidates < 1:
            raise ValueError(f"candidates must be at least 1, got {self.candidates}")


def check_fusion_params(weights: Sequence[float], rrf_k: float) -> None:
    """Raise ValueError unless every weight is finite and >= 0, one is > 0, and rrf_k >= 0."""
    if any(not math.isfinite(w) or w < 0 for w in weights):
        raise ValueError(f"fusion weights must be finite and non-negative, got {list(weights)}")
    if not any(w > 0 for w in weights):
        raise ValueError("at least one fusion weight must be positive")
    if not math.isfinite(rrf_k) or rrf_k < 0:
        raise ValueError(f"rrf_k must be finite and non-negative, got {rrf_k}")


def reciprocal_rank_fusion(
    rankings: Sequence[Sequence[int]],
    weights: Sequence[float] | None = None,
    rrf_k: float = DEFAULT_RRF_K,
    top_k: int | None = None,
) -> list[FusedRow]:
    """Fuse `rankings` (rows, best first, each row at most once per ranking) into one list,
    best first, cut to `top_k` (None: every row any ranking holds).

    `weights` default to 1 each. A ranking with weight 0 adds nothing to a score, but its
    ranks still break ties. Ties in fused score go to the row ranked better by the first
    ranking, then the second, and so on (a missing rank counts as worse than any), so the
    result is deterministic.
    """
    weights = [1.0] * len(rankings) if weights is None else list(weights)
    if len(weights) != len(rankings):
        raise ValueError(f"{len(rankings)} rankings but {len(weights)} weights")
    check_fusion_params(weights, rrf_k)
    ranks: dict[int, list[int | None]] = {}
    for which, ranking in enumerate(rankings):
        for rank, row in enumerate(ranking, start=1):
            row_ranks = ranks.setdefault(int(row), [None] * len(rankings))
            if row_ranks[which] is not None:
                raise ValueError(f"row {row} appears twice in ranking {which}")
            row_ranks[which] = rank
    fused = [
        FusedRow(
            row=row,
            score=sum(w / (rrf_k + r) for w, r in zip(weights, row_ranks, strict=True) if r),
            ranks=tuple(row_ranks),
        )
        for row, row_ranks in ranks.items()
    ]
    fused.sort(
        key=lambda item: (
            -item.score,
            *(math.inf if r is None else r for r in item.ranks),
        )
    )
    return fused if top_k is None else fused[: max(top_k, 0)]
