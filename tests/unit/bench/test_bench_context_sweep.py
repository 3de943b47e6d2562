"""bench.context_sweep: planning, the cost-model fit and the verdicts, on hand-made records."""

from __future__ import annotations

import pytest

from bench.context_sweep import (
    Cell,
    SweepRecord,
    SweepRequest,
    auto_verdicts,
    cost_model_overrides,
    fit_compressor,
    fit_prefill,
    plan_requests,
    record_from_response,
    request_body,
    summarize,
    top_k_for_length,
)
from retrieval.cost_model import CompressionCostModel, CompressorCost, PrefillCost


def test_top_k_is_the_fewest_chunks_that_reach_the_length():
    assert top_k_for_length([100, 200, 300], 250) == 2
    assert top_k_for_length([100, 200, 300], 300) == 2
    assert top_k_for_length([100, 200, 300], 301) == 3
    assert top_k_for_length([100, 200], 10_000) == 2


def test_every_request_gets_its_own_question_and_policies_alternate():
    questions = [f"q{i}" for i in range(12)]
    requests = plan_requests(questions, [512, 1024], ("never", "always", "auto"), 2, "m", _k)

    assert len(requests) == 12
    assert len({r.question for r in requests}) == 12
    assert [r.policy for r in requests[:3]] == ["never", "always", "auto"]
    assert [r.length for r in requests[:6]] == [512] * 3 + [1024] * 3
    assert requests[0].top_k == 512 // 100
    assert {r.repeat for r in requests} == {0, 1}


def test_too_few_questions_is_an_error():
    with pytest.raises(ValueError, match="12 distinct questions needed"):
        plan_requests(["q"] * 5, [512, 1024], ("never", "always", "auto"), 2, "m", _k)


def test_request_bodies_per_policy():
    never = request_body(_request("never"), "llmlingua", 0.5, 8)
    auto = request_body(_request("auto"), "llmlingua", 0.5, 8)

    assert never["compression"] == {"method": "none"}
    assert auto["compression"] == {"method": "llmlingua", "rate": 0.5, "policy": "auto"}
    assert auto["top_k"] == 7
    assert auto["max_tokens"] == 8


def test_a_response_becomes_a_record_and_an_error_keeps_its_message():
    body = {
        "usage": {
            "prompt_tokens": 1300,
            "cached_prompt_tokens": 256,
            "context_tokens_before": 1000,
            "context_tokens_after": 510,
            "completion_tokens": 8,
        },
        "timings_ms": {"retrieve": 20.0, "compress": 3000.0, "ttft": 9000.0, "total": 9900.0},
        "compression_method": "llmlingua",
        "compression_decision": {
            "requested_method": "llmlingua",
            "compressed": True,
            "predicted_saving_ms": 4000.0,
            "predicted_cost_ms": 3100.0,
        },
        "sources": [{"id": "a"}, {"id": "b"}],
    }
    record = record_from_response(_request("auto"), 200, body)

    assert record.ok
    assert record.uncached_prompt_tokens == 1044
    assert record.prefill_ms == pytest.approx(5980.0)
    assert record.chunks == 2
    assert record.predicted_cost_ms == 3100.0

    failed = record_from_response(_request("auto"), 400, {"error": {"message": "too long"}})
    assert not failed.ok
    assert failed.error == "400: too long"


def test_prefill_fit_recovers_a_known_curve_and_drops_the_intercept():
    truth = PrefillCost(ms_per_token=3.0, ms_per_token_squared=0.0005)
    records = [_measured(n, truth.predict_ms(n) + 150.0) for n in (300, 700, 1200, 2500, 4100)]

    fitted = fit_prefill(records)

    assert fitted.ms_per_token == pytest.approx(3.0, rel=1e-6)
    assert fitted.ms_per_token_squared == pytest.approx(0.0005, rel=1e-6)


def test_prefill_fit_never_goes_negative():
    # Concave data: a negative quadratic term is replaced by a straight line.
    records = [_measured(n, 10 * n**0.5 * 30) for n in (100, 400, 900, 1600)]

    fitted = fit_prefill(records)

    assert fitted.ms_per_token_squared == 0.0
    assert fitted.ms_per_token > 0


def test_compressor_fit_per_token_and_per_chunk():
    records = [
        _compressed(tokens, chunks, 6.0 * tokens + 40.0 * chunks)
        for tokens, chunks in ((500, 4), (1000, 7), (2000, 16), (4000, 30))
    ]

    fitted = fit_compressor(records)

    assert fitted.ms_per_token == pytest.approx(6.0)
    assert fitted.ms_per_chunk == pytest.approx(40.0)


def test_overrides_name_the_fitted_method():
    model = CompressionCostModel(
        PrefillCost(3.0, 0.0005), CompressorCost(0.1), CompressorCost(6, 4)
    )
    overrides = cost_model_overrides(model, "llmlingua")

    assert overrides == {
        "compression.cost_model.prefill_ms_per_token": 3.0,
        "compression.cost_model.prefill_ms_per_token_squared": 0.0005,
        "compression.cost_model.llmlingua.ms_per_token": 6.0,
        "compression.cost_model.llmlingua.ms_per_chunk": 4.0,
    }


def test_summary_medians_and_the_auto_verdict():
    records = [
        _timed("never", 512, 3000.0, "none"),
        _timed("never", 512, 3400.0, "none"),
        _timed("always", 512, 6000.0, "llmlingua"),
        _timed("auto", 512, 3300.0, "none"),
        _timed("never", 4096, 40000.0, "none"),
        _timed("always", 4096, 30000.0, "llmlingua"),
        _timed("auto", 4096, 45000.0, "llmlingua"),
    ]
    cells = summarize(records)

    never_512 = next(c for c in cells if c.length == 512 and c.policy == "never")
    assert never_512.ttft_ms == 3200.0
    assert never_512.requests == 2
    assert next(c for c in cells if c.policy == "always").compressed == 1
    verdicts = auto_verdicts(cells)
    assert verdicts[512].startswith("as fast")
    assert verdicts[4096].startswith("SLOWER")


def test_no_verdict_without_all_three_policies():
    cells = [Cell(512, "never", 1, 1.0, 0.0, 500, 500, 256, 0)]
    assert auto_verdicts(cells) == {}


def _k(question: str, length: int) -> int:
    return length // 100


def _request(policy: str, length: int = 512) -> SweepRequest:
    return SweepRequest("Q?", length, policy, 7, "measure")


def _measured(uncached: int, prefill_ms: float) -> SweepRecord:
    return SweepRecord(
        _request("never"),
        ok=True,
        ttft_ms=prefill_ms + 30.0,
        retrieve_ms=20.0,
        compress_ms=10.0,
        prompt_tokens=uncached + 256,
        cached_prompt_tokens=256,
        method_applied="none",
    )


def _compressed(tokens: int, chunks: int, compress_ms: float) -> SweepRecord:
    return SweepRecord(
        _request("always"),
        ok=True,
        compress_ms=compress_ms,
        context_tokens_before=tokens,
        chunks=chunks,
        method_applied="llmlingua",
    )


def _timed(policy: str, length: int, ttft_ms: float, applied: str) -> SweepRecord:
    return SweepRecord(
        _request(policy, length),
        ok=True,
        ttft_ms=ttft_ms,
        compress_ms=0.0,
        context_tokens_before=length,
        context_tokens_after=length,
        cached_prompt_tokens=256,
        method_applied=applied,
    )
