"""prepare.cost_model: the prefill arithmetic of the `auto` compression policy, by hand
(the methods' own costs and the decision: test_prepare_methods.py)."""

from __future__ import annotations

import pytest

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
