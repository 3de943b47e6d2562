"""prepare.methods: the registry, each shipped method's own cost, the `auto` decision, and a
method registered by a test reaching every place that reads the registry."""

from __future__ import annotations

import pytest
from compression_fakes import LEAD, LEAD_METHOD, registered_lead_method
from pydantic import ValidationError

from app.schemas import CompressionOptions, RagQueryRequest
from pipeline.messages import CompressionDecision
from prepare.config import CompressionConfig
from prepare.cost_model import CompressionCostModel, CompressorCost, PrefillCost
from prepare.methods import (
    ContextSize,
    decide,
    get_method,
    known_method,
    method_names,
    register,
    unregister,
)

MODEL = CompressionCostModel(
    prefill=PrefillCost(ms_per_token=2.0, ms_per_token_squared=0.001),
    sentences=CompressorCost(ms_per_token=0.01),
    llmlingua=CompressorCost(ms_per_token=5.0, ms_per_chunk=100.0),
)
# 1000 context tokens in 5 chunks, 500 to keep; sentence selection keeps 500 before LLMLingua.
SIZE = ContextSize(tokens_before=1000, tokens_after=500, chunks=5, sentence_prefilter_rate=0.5)


def cost(method: str, size: ContextSize = SIZE) -> float:
    return get_method(method).cost_ms(MODEL, size)


def test_costs_per_method():
    assert cost("none") == 0.0
    assert cost("sentences") == pytest.approx(10.0)
    assert cost("llmlingua") == pytest.approx(5500.0)
    # sentences on all 1000, then LLMLingua on the 500 it kept
    assert cost("sentences+llmlingua") == pytest.approx(3010.0)


def test_the_prefilter_keeps_at_least_the_target():
    assert ContextSize(1000, 800, 5, 0.5).prefilter_tokens == 800
    assert ContextSize(1001, 100, 5, 0.5).prefilter_tokens == 501


def test_each_method_says_what_it_needs():
    needs = {
        name: (get_method(name).needs_sentence_embeddings, get_method(name).needs_chunk_compressor)
        for name in method_names()
    }

    assert needs == {
        "none": (False, False),
        "sentences": (True, False),
        "llmlingua": (False, True),
        "sentences+llmlingua": (True, True),
    }


def test_an_unknown_method_is_an_error_naming_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown compression method 'zip' \(known: none, "):
        get_method("zip")
    with pytest.raises(ValueError, match="unknown compression method"):
        known_method("llmlingua2")  # no substring match: a name is the whole name


def test_a_name_is_registered_once_and_the_identity_stays():
    with pytest.raises(ValueError, match="already registered"):
        register(get_method("sentences"))
    with pytest.raises(ValueError, match="identity"):
        unregister("none")


def test_auto_skips_a_compressor_that_costs_more_than_it_saves():
    decision = decide(MODEL, "llmlingua", SIZE, other_uncached=50)

    assert isinstance(decision, CompressionDecision)  # the type the stages send each other
    assert not decision.compress
    assert decision.predicted_saving_ms == pytest.approx(1800.0)
    assert decision.predicted_cost_ms == pytest.approx(5500.0)


def test_auto_keeps_a_cheap_compressor():
    decision = decide(MODEL, "sentences", SIZE, other_uncached=50)

    assert decision.compress
    assert decision.predicted_cost_ms == pytest.approx(10.0)


def test_auto_compresses_once_the_quadratic_prefill_outgrows_the_compressor():
    # A slow generator (4x the prefill cost) at a long context: the saving wins.
    slow = CompressionCostModel(
        prefill=PrefillCost(ms_per_token=8.0, ms_per_token_squared=0.004),
        sentences=MODEL.sentences,
        llmlingua=MODEL.llmlingua,
    )
    short = decide(slow, "llmlingua", ContextSize(400, 200, 2), other_uncached=50)
    long = decide(slow, "llmlingua", ContextSize(4000, 2000, 20), other_uncached=50)

    assert not short.compress
    assert long.compress
    assert long.predicted_saving_ms > long.predicted_cost_ms


def test_nothing_to_decide_for_none():
    assert not decide(MODEL, "none", ContextSize(1000, 1000, 5), other_uncached=50).compress


def test_a_registered_method_is_accepted_by_the_request_schema_and_the_config():
    with pytest.raises(ValidationError, match="unknown compression method 'lead'"):
        CompressionOptions(method=LEAD)

    with registered_lead_method():
        assert CompressionOptions(method=LEAD).method == LEAD
        assert CompressionConfig(default_method=LEAD).default_method == LEAD
        schema = RagQueryRequest.model_json_schema()
        assert decide(MODEL, LEAD, SIZE, other_uncached=50).predicted_cost_ms == 10.0

    assert LEAD not in method_names()
    assert LEAD_METHOD.name == LEAD
    method_field = schema["$defs"]["CompressionOptions"]["properties"]["method"]
    assert LEAD in method_field["anyOf"][0]["enum"]


def test_the_config_refuses_an_unknown_default_method():
    with pytest.raises(ValidationError, match="unknown compression method 'zip'"):
        CompressionConfig(default_method="zip")


def test_a_default_method_that_needs_llmlingua_needs_it_enabled():
    with pytest.raises(ValidationError, match=r"needs llmlingua\.enabled"):
        CompressionConfig(default_method="sentences+llmlingua", llmlingua={"enabled": False})
