"""bench.context_sweep: planning, the cost-model fit and the verdicts, on hand-made records."""

from __future__ import annotations

import json

import httpx
import pytest

from bench.context_sweep import (
    OracleRow,
    SweepRecord,
    SweepRequest,
    auto_verdicts,
    cost_model_overrides,
    fit_compressor,
    fit_prefill,
    oracle_rows,
    plan_requests,
    render_oracle,
    request_body,
    run_phase,
    summarize,
    summarize_oracle,
    top_k_for_length,
    wilson_interval,
)
from prepare.cost_model import CompressionCostModel, CompressorCost, PrefillCost


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


def test_paired_plans_ask_each_question_under_every_policy_in_rotating_order():
    questions = [f"q{i}" for i in range(4)]
    policies = ("never", "always", "auto")
    requests = plan_requests(questions, [512, 1024], policies, 2, "m", _k, paired=True)

    assert len(requests) == 12
    by_question = {q: [r for r in requests if r.question == q] for q in questions}
    assert all(sorted(r.policy for r in rs) == sorted(policies) for rs in by_question.values())
    assert all(len({(r.length, r.top_k, r.repeat) for r in rs}) == 1 for rs in by_question.values())
    firsts = [rs[0].policy for rs in by_question.values()]
    assert firsts == ["never", "always", "auto", "never"]
    assert [r.policy for r in by_question["q1"]] == ["always", "auto", "never"]
    with pytest.raises(ValueError, match="4 distinct questions needed"):
        plan_requests(questions[:3], [512, 1024], policies, 2, "m", _k, paired=True)


def test_request_bodies_per_policy():
    never = request_body(_request("never"), "llmlingua", 0.5, 8)
    auto = request_body(_request("auto"), "llmlingua", 0.5, 8)

    assert never["compression"] == {"method": "none"}
    assert auto["compression"] == {"method": "llmlingua", "rate": 0.5, "policy": "auto"}
    assert auto["top_k"] == 7
    assert auto["max_tokens"] == 8


def test_a_reply_becomes_a_record_and_an_error_keeps_the_services_message():
    reply = {
        "id": "r1",
        "answer": "An answer.",
        "sources": [
            {"id": "a", "doc_id": "d1", "title": "A", "score": 0.9},
            {"id": "b", "doc_id": "d2", "title": "B", "score": 0.8},
        ],
        "context_truncated": False,
        "finish_reason": "length",
        "tpot_ms": 110.0,
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
    }
    sent: list[dict] = []

    def service(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        if len(sent) == 1:
            return httpx.Response(200, json=reply)
        return httpx.Response(400, json={"error": {"message": "too long"}})

    client = httpx.Client(base_url="http://s.test", transport=httpx.MockTransport(service))
    requests = [_request("auto"), _request("never")]
    record, failed = run_phase("http://s.test", requests, "llmlingua", 0.5, 8, client=client)

    assert sent == [request_body(r, "llmlingua", 0.5, 8) for r in requests]
    assert record.ok
    assert record.uncached_prompt_tokens == 1044
    assert record.prefill_ms == pytest.approx(5980.0)
    assert record.chunks == 2
    assert record.method_applied == "llmlingua"
    assert record.predicted_cost_ms == 3100.0
    assert not failed.ok
    assert failed.error == "HTTP 400: too long"


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
    # One request a side: a ratio needs two, so no verdict is claimed.
    assert (
        auto_verdicts(records)[512]
        == "auto / `never` (the faster fixed policy): n = 1: no interval"
    )


def test_auto_verdict_is_a_ratio_with_an_interval():
    records = [
        _timed(policy, length, ttft + step, applied)
        for length, policy, ttft, applied in (
            (512, "never", 3000.0, "none"),
            (512, "always", 6000.0, "llmlingua"),
            (512, "auto", 3050.0, "none"),
            (4096, "never", 40000.0, "none"),
            (4096, "always", 30000.0, "llmlingua"),
            (4096, "auto", 45000.0, "llmlingua"),
        )
        for step in (0.0, 100.0, 200.0)
    ]
    records.append(_timed("auto", 512, 1.0, "none", phase="calibrate"))  # not measured
    verdicts = auto_verdicts(records)

    assert verdicts[512].startswith("auto / `never` (the faster fixed policy): 1.02x [")
    assert verdicts[512].endswith("no detectable difference")
    assert verdicts[4096].startswith("auto / `always` (the faster fixed policy): 1.50x [")
    assert "no detectable difference" not in verdicts[4096]


def test_no_verdict_without_all_three_policies():
    assert auto_verdicts([_timed("never", 512, 1.0, "none")]) == {}


def test_oracle_rows_pair_a_questions_three_requests_and_judge_autos_pick():
    records = [
        _timed("never", 512, 3000.0, "none", "a"),
        _timed("always", 512, 2000.0, "sentences", "a"),
        _timed("auto", 512, 2100.0, "sentences", "a"),
        _timed("auto", 512, 5000.0, "none", "b"),
        _timed("never", 512, 4000.0, "none", "b"),
        _timed("always", 512, 4500.0, "sentences", "b"),
        # Incomplete or failed: left out.
        _timed("never", 512, 1.0, "none", "c"),
        _timed("always", 512, 1.0, "sentences", "c"),
        SweepRecord(SweepRequest("c", 512, "auto", 7, "measure"), ok=False, error="500"),
        _timed("never", 512, 1.0, "none", "d", phase="calibrate"),
        _timed("always", 512, 1.0, "sentences", "d", phase="calibrate"),
        _timed("auto", 512, 1.0, "sentences", "d", phase="calibrate"),
    ]
    rows = oracle_rows(records)

    assert [r.question for r in rows] == ["a", "b"]
    first, second = rows
    assert (first.faster, first.auto_choice, first.right) == ("always", "always", True)
    assert first.oracle_ms == 2000.0
    assert (second.faster, second.auto_choice, second.right) == ("never", "never", True)
    assert second.oracle_ms == 4000.0
    assert OracleRow(512, "e", 3000.0, 2000.0, 3000.0, False).right is False
    assert OracleRow(512, "f", 3000.0, 3000.0, 3000.0, False).faster == "never"


def test_oracle_summary_per_length_and_overall():
    rows = [
        OracleRow(512, "a", 3000.0, 2000.0, 2200.0, True),
        OracleRow(512, "b", 3300.0, 2100.0, 2100.0, True),
        OracleRow(512, "c", 2900.0, 3100.0, 3100.0, True),
        OracleRow(4096, "d", 50000.0, 20000.0, 21000.0, True),
    ]
    by_length = {s.length: s for s in summarize_oracle(rows)}

    short = by_length[512]
    assert (short.questions, short.always_faster, short.auto_compressed, short.right) == (
        3,
        2,
        3,
        2,
    )
    assert short.right_share is not None
    assert short.right_share.estimate == pytest.approx(2 / 3)
    assert short.always_over_never is not None and short.always_over_never.n == 3
    assert short.auto_over_oracle is not None
    assert short.auto_over_oracle.estimate == pytest.approx(1.0689655, rel=1e-6)  # 3100 / 2900
    assert short.total_ratio == pytest.approx((2200 + 2100 + 3100) / (2000 + 2100 + 2900))
    single = by_length[4096]
    assert single.right_share is None and single.auto_over_oracle is None
    assert by_length[None].questions == 4 and by_length[None].right == 3
    assert len(summarize_oracle(rows[:3])) == 1  # no overall row for one length
    text = render_oracle(rows, summarize_oracle(rows))
    assert "| 512 | c | 2,900 | 3,100 | never | always | NO | 3,100 | 1.07x |" in text
    assert "| 4,096 | 1 | 1/1 | 1/1 | 1/1: n = 1: no interval; [" in text
    assert "| all | 4 |" in text


def test_wilson_interval_is_not_degenerate_when_every_pick_is_right():
    low, high = wilson_interval(16, 16)
    assert low == pytest.approx(0.806, abs=1e-3)
    assert high == 1.0
    low, high = wilson_interval(5, 10)
    assert low == pytest.approx(0.2366, abs=1e-3) and high == pytest.approx(0.7634, abs=1e-3)
    with pytest.raises(ValueError):
        wilson_interval(0, 0)


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


def _timed(
    policy: str,
    length: int,
    ttft_ms: float,
    applied: str,
    question: str = "Q?",
    phase: str = "measure",
) -> SweepRecord:
    return SweepRecord(
        SweepRequest(question, length, policy, 7, phase),
        ok=True,
        ttft_ms=ttft_ms,
        compress_ms=0.0,
        context_tokens_before=length,
        context_tokens_after=length,
        cached_prompt_tokens=256,
        method_applied=applied,
    )
