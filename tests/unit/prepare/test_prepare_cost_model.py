"""prepare.cost_model: the arithmetic of the `auto` compression policy, by hand."""

from __future__ import annotations

import pytest

from pipeline.messages import CompressionDecision
from prepare.cost_model import CompressionCostModel, CompressorCost, PrefillCost

MODEL = CompressionCostModel(
    prefill=PrefillCost(ms_per_token=2.0, ms_per_token_squared=0.001),
    sentences=CompressorCost(ms_per_token=0.01),
    llmlingua=CompressorCost(ms_per_token=5.0, ms_per_chunk=100.0),
)


def test_prefill_is_linear_plus_quadratic():
    # 2 * 1000 + 0.001 * 1000^2
    assert PrefillCost(2.0, 0.001).predict_ms(1000) == pytest.approx(3000.0)


def test_the_saving_is_the_prefill_difference_with_the_uncached_rest_in_front():
    # prefill(50 + 1000) - prefill(50 + 500)
    # = (2100 + 1102.5) - (1100 + 302.5) = 1800
    assert MODEL.saving_ms(50, 1000, 500) == pytest.approx(1800.0)


def test_costs_per_method():
    assert MODEL.cost_ms("none", 1000, 5, 500) == 0.0
    assert MODEL.cost_ms("sentences", 1000, 5, 500) == pytest.approx(10.0)
    assert MODEL.cost_ms("llmlingua", 1000, 5, 500) == pytest.approx(5500.0)
    # sentences on all 1000, then LLMLingua on the 500 it kept
    assert MODEL.cost_ms("sentences+llmlingua", 1000, 5, 500) == pytest.approx(3010.0)


def test_unknown_method_is_an_error():
    with pytest.raises(ValueError, match="unknown compression method"):
        MODEL.cost_ms("zip", 10, 1, 5)


def test_auto_skips_a_compressor_that_costs_more_than_it_saves():
    decision = MODEL.decide("llmlingua", 1000, 500, 5, 50)
    assert isinstance(decision, CompressionDecision)  # the type the stages send each other
    assert not decision.compress
    assert decision.predicted_saving_ms == pytest.approx(1800.0)
    assert decision.predicted_cost_ms == pytest.approx(5500.0)


def test_auto_keeps_a_cheap_compressor():
    decision = MODEL.decide("sentences", 1000, 500, 5, 50)
    assert decision.compress
    assert decision.predicted_cost_ms == pytest.approx(10.0)


def test_auto_compresses_once_the_quadratic_prefill_outgrows_the_compressor():
    # A slow generator (4x the prefill cost) at a long context: the saving wins.
    slow = CompressionCostModel(
        prefill=PrefillCost(ms_per_token=8.0, ms_per_token_squared=0.004),
        sentences=MODEL.sentences,
        llmlingua=MODEL.llmlingua,
    )
    short = slow.decide("llmlingua", 400, 200, 2, 50)
    long = slow.decide("llmlingua", 4000, 2000, 20, 50)
    assert not short.compress
    assert long.compress
    assert long.predicted_saving_ms > long.predicted_cost_ms


def test_nothing_to_decide_for_none():
    assert not MODEL.decide("none", 1000, 1000, 5, 50).compress
