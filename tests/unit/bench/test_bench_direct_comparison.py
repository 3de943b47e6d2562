"""bench.direct_comparison: the p50 comparison, the TTFT gap's parts and the per-question
prompt check, on hand-made records; expected figures are worked out in comments."""

from __future__ import annotations

import pytest
from direct_records import rec

from bench.direct_comparison import (
    MetricComparison,
    check_prompts,
    compare_p50,
    mismatch_warning,
    ttft_breakdown,
)
from bench.stats import summarize


def test_compare_p50_differences_and_ratios():
    # Pipeline: TTFT 300, TPOT (1300 - 300) / 10 = 100, E2E 1300.
    # Direct:   TTFT 200, TPOT (1000 - 200) / 10 = 80,  E2E 1000.
    pipeline = summarize([rec(0, ttft=300, e2e=1300), rec(1, ttft=300, e2e=1300)])
    vllm = summarize([rec(0, ttft=200, e2e=1000), rec(1, ttft=200, e2e=1000)])

    rows = {row.metric: row for row in compare_p50(pipeline, vllm)}
    assert list(rows) == ["TTFT", "TPOT", "E2E"]
    assert rows["TTFT"] == MetricComparison("TTFT", 300.0, 200.0, 100.0, 1.5)
    assert rows["TPOT"].diff_ms == pytest.approx(20.0) and rows["TPOT"].ratio == pytest.approx(1.25)
    assert rows["E2E"] == MetricComparison("E2E", 1300.0, 1000.0, 300.0, 1.3)


def test_compare_p50_without_a_side_has_no_difference():
    pipeline = summarize([rec(0)])
    failed = summarize([rec(0, ok=False)])
    ttft = compare_p50(pipeline, failed)[0]
    assert ttft == MetricComparison("TTFT", 100.0, None, None, None)


def test_ttft_breakdown_splits_each_gap_and_takes_medians():
    stages = [
        {"retrieve": 20.0, "compress": 5.0, "ttft": 260.0, "total": 900.0},
        {"retrieve": 30.0, "compress": 7.0, "ttft": 280.0, "total": 900.0},
        {"retrieve": 40.0, "compress": 9.0, "ttft": 330.0, "total": 900.0},
    ]
    pipeline = [
        rec(0, ttft=300, timings=stages[0]),
        rec(1, ttft=310, timings=stages[1]),
        rec(2, ttft=350, timings=stages[2]),
        rec(3, ttft=999, timings=None),  # no server timings: left out
        rec(4, ok=False),  # failed: left out
    ]
    vllm = [rec(i, ttft=200, endpoint="chat") for i in range(5)]

    parts = ttft_breakdown(pipeline, vllm)
    # Gaps 100, 110, 150; edges (client - server TTFT) 40, 30, 20;
    # rests 100-20-5-40 = 35, 110-30-7-30 = 43, 150-40-9-20 = 81.
    assert parts.questions == 3
    assert (parts.gap_ms, parts.retrieve_ms, parts.compress_ms) == (110.0, 30.0, 7.0)
    assert (parts.edge_ms, parts.rest_ms) == (30.0, 43.0)


def test_ttft_breakdown_without_pairs_is_empty():
    parts = ttft_breakdown([rec(0, ok=False)], [rec(0)])
    assert parts.questions == 0 and parts.gap_ms is None and parts.rest_ms is None


def test_prompt_checks_flag_differences_loudly():
    pipeline = [rec(0, prompt=900), rec(1, prompt=912), rec(2, ok=False)]
    vllm = [rec(0, prompt=900, cached=128), rec(1, prompt=911), rec(2, prompt=880)]

    checks = check_prompts(pipeline, vllm, [900, 912, 880])
    assert [check.status for check in checks] == ["ok", "MISMATCH", "unchecked"]
    assert (checks[0].pipeline_cached_tokens, checks[0].direct_cached_tokens) == (256, 128)
    assert checks[1].question == "question 1" and checks[1].local_prompt_tokens == 912
    warning = mismatch_warning(checks)
    assert warning is not None
    assert warning.startswith("PROMPT MISMATCH on 1 of 3 questions")
    assert "#1 (912 vs 911)" in warning
    assert mismatch_warning(checks[:1]) is None
