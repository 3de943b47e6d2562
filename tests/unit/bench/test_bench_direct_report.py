"""bench.direct_report: direct.md's tables and its mismatch warning, on hand-made records."""

from __future__ import annotations

from direct_records import rec

from bench.direct_comparison import check_prompts, compare_p50, ttft_breakdown
from bench.direct_report import markdown_report
from bench.stats import summarize


def test_markdown_report_tables_and_warning():
    timings = {"retrieve": 20.0, "compress": 5.0, "ttft": 260.0, "total": 900.0}
    pipeline_records = [rec(0, ttft=300, e2e=1300, timings=timings, prompt=900)]
    vllm_records = [rec(0, ttft=200, e2e=1000, prompt=901, endpoint="chat")]
    pipeline, vllm = summarize(pipeline_records), summarize(vllm_records)
    checks = check_prompts(pipeline_records, vllm_records, [900])

    report = markdown_report(
        "setup line",
        compare_p50(pipeline, vllm),
        ttft_breakdown(pipeline_records, vllm_records),
        checks,
        pipeline,
        vllm,
    )
    assert "setup line" in report
    assert "**PROMPT MISMATCH on 1 of 1 questions" in report
    assert "| TTFT | 300.0 | 200.0 | +100.0 | 1.50x |" in report
    assert "| retrieve stage | +20.0 | 20% |" in report
    # Gap 100 = retrieve 20 + compress 5 + edge 40 + rest 35.
    assert "| HTTP edge | +40.0 | 40% |" in report
    assert "| generator hop | +35.0 | 35% |" in report
    assert "| 0 | question 0 | 900 | 900 | 901 | 256 / 256 | 11 / 11 | **MISMATCH** |" in report
    assert "## Pipeline: /v1/rag/query through Ray Serve" in report
    assert "| server retrieve | 1 |" in report  # the phase's full table


def test_markdown_report_without_mismatch_has_no_warning():
    records = [rec(0)]
    summary = summarize(records)
    checks = check_prompts(records, records, [None])
    report = markdown_report(
        "s", compare_p50(summary, summary), ttft_breakdown(records, records), checks,
        summary, summary,
    )  # fmt: skip
    assert "MISMATCH" not in report and "| 0 | question 0 | - | 900 | 900 |" in report
    assert "| TTFT | 100.0 | 100.0 | +0.0 | 1.00x |" in report
