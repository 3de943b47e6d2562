"""retrieval.fusion: weighted reciprocal rank fusion on hand-made rankings, its settings, and
the config block that feeds them (app.config.HybridRetrievalConfig)."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from retrieval.config import HybridRetrievalConfig, RetrieverConfig
from retrieval.fusion import FusedRow, HybridParams, reciprocal_rank_fusion


def scores(fused: list[FusedRow]) -> dict[int, float]:
    return {item.row: item.score for item in fused}


def test_scores_are_weighted_reciprocal_ranks_counted_from_one():
    fused = reciprocal_rank_fusion([[10, 20, 30], [30, 10]], rrf_k=60)

    assert scores(fused) == pytest.approx(
        {10: 1 / 61 + 1 / 62, 20: 1 / 62, 30: 1 / 63 + 1 / 61}, rel=1e-12
    )
    assert [item.row for item in fused] == [10, 30, 20]
    assert fused[1].ranks == (3, 1)
    # A row one ranking lacks adds nothing from it.
    assert fused[2].ranks == (2, None)


def test_weights_scale_each_rankings_share():
    rankings = [[1, 2], [2, 1]]

    # Equal weights: a tie; more weight on the second ranking puts its first row first.
    assert [r.row for r in reciprocal_rank_fusion(rankings, [1, 3], rrf_k=60)] == [2, 1]
    fused = reciprocal_rank_fusion(rankings, [2.0, 1.0], rrf_k=0)
    assert scores(fused) == pytest.approx({1: 2 / 1 + 1 / 2, 2: 2 / 2 + 1 / 1})
    assert [r.row for r in fused] == [1, 2]


def test_rrf_k_sets_how_much_the_top_rank_dominates():
    # Row 1 is first in one ranking only; row 3 is third in both.
    rankings = [[1, 2, 3], [4, 5, 3]]

    def order(rrf_k: float) -> list[int]:
        return [r.row for r in reciprocal_rank_fusion(rankings, rrf_k=rrf_k)]

    assert order(0).index(1) < order(0).index(3)  # 1/1 beats 1/3 + 1/3
    assert order(60).index(3) < order(60).index(1)  # 2/63 beats 1/61


def test_ties_go_to_the_first_ranking_then_the_lower_row():
    # Rows 5 and 7 tie in score; the first ranking prefers 7.
    assert [r.row for r in reciprocal_rank_fusion([[7, 5], [5, 7]])] == [7, 5]
    # Same ranks everywhere (each row in one ranking at rank 1): first ranking's row first.
    assert [r.row for r in reciprocal_rank_fusion([[9], [4]])] == [9, 4]


def test_a_zero_weight_ranking_adds_nothing_but_still_breaks_ties():
    fused = reciprocal_rank_fusion([[1, 2], [2, 1], [2]], [1, 1, 0])

    assert scores(fused)[1] == pytest.approx(scores(fused)[2])
    assert [r.row for r in fused] == [1, 2]  # the first ranking breaks the tie first


def test_top_k_cuts_the_fused_list():
    fused = reciprocal_rank_fusion([[1, 2, 3, 4], [4, 3]], top_k=2)

    assert [r.row for r in fused] == [4, 3]
    assert reciprocal_rank_fusion([[1, 2]], top_k=0) == []


@pytest.mark.parametrize(
    ("rankings", "weights", "rrf_k", "message"),
    [
        ([[1], [2]], [1.0], 60, "2 rankings but 1 weights"),
        ([[1], [2]], [-1.0, 1.0], 60, "non-negative"),
        ([[1], [2]], [0.0, 0.0], 60, "at least one fusion weight"),
        ([[1], [2]], [math.nan, 1.0], 60, "finite"),
        ([[1], [2]], [1.0, 1.0], -1, "rrf_k"),
        ([[1, 1]], None, 60, "row 1 appears twice"),
    ],
)
def test_bad_input_is_refused(rankings, weights, rrf_k, message):
    with pytest.raises(ValueError, match=message):
        reciprocal_rank_fusion(rankings, weights, rrf_k)


def test_hybrid_params_validate():
    assert HybridParams().mode == "dense"
    with pytest.raises(ValueError, match="mode"):
        HybridParams(mode="sparse")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="candidates"):
        HybridParams(candidates=0)
    with pytest.raises(ValueError, match="at least one"):
        HybridParams(dense_weight=0, lexical_weight=0)


def test_config_block_defaults_and_conversion():
    config = RetrieverConfig.model_validate(
        {"hybrid": {"mode": "hybrid", "dense_weight": 2, "lexical_weight": 1, "rrf_k": 10}}
    )

    assert RetrieverConfig().hybrid.mode == "hybrid"
    # An index without a lexical part may fall back to dense only when the mode is the
    # default; a mode the config names is required.
    assert RetrieverConfig().hybrid.dense_fallback
    assert not config.hybrid.dense_fallback
    assert not RetrieverConfig.model_validate({"hybrid": {"mode": "dense"}}).hybrid.dense_fallback
    assert config.hybrid.to_params() == HybridParams(
        mode="hybrid", dense_weight=2.0, lexical_weight=1.0, rrf_k=10.0, candidates=50
    )
    # Every field says what it is for.
    assert all(field.description for field in HybridRetrievalConfig.model_fields.values())


@pytest.mark.parametrize(
    ("block", "where"),
    [
        ({"mode": "sparse"}, "hybrid.mode"),
        ({"dense_weight": -1}, "hybrid.dense_weight"),
        ({"rrf_k": float("inf")}, "hybrid.rrf_k"),
        ({"candidates": 0}, "hybrid.candidates"),
        ({"dense_weight": 0, "lexical_weight": 0}, "at least one"),
        ({"weights": [1, 1]}, "hybrid.weights"),
    ],
)
def test_config_block_refuses_bad_values_naming_them(block, where):
    with pytest.raises(ValidationError, match=where.replace(".", r"\.")):
        RetrieverConfig.model_validate({"hybrid": block})
