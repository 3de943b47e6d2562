"""bench.direct's report, direct.md: the comparison of the RAG pipeline with vLLM alone
(bench.direct_comparison) and each phase's full latency table (bench.stats), in Markdown."""

from __future__ import annotations

from collections.abc import Sequence

from bench.direct_comparison import MetricComparison, PromptCheck, TtftBreakdown, mismatch_warning
from bench.stats import Summary, markdown_table

# The TTFT gap's parts: row name, TtftBreakdown field, what the part is.
BREAKDOWN_ROWS = (
    ("retrieve stage", "retrieve_ms", "embedding, FAISS search, the hop to the retriever"),
    ("compress stage", "compress_ms", "compression, prompt fit, the hop to the compressor"),
    ("HTTP edge", "edge_ms", "client TTFT − server TTFT: proxy and ingress, in and out"),
    ("generator hop", "rest_ms", "the rest: hop to the generator, LLMServer wrapper, less "
     "vLLM's own HTTP front end"),
    ("TTFT gap", "gap_ms", "pipeline TTFT − direct TTFT"),
)  # fmt: skip


def markdown_report(
    setup: str,
    comparison: Sequence[MetricComparison],
    breakdown: TtftBreakdown,
    checks: Sequence[PromptCheck],
    pipeline: Summary,
    direct: Summary,
) -> str:
    """direct.md: a mismatch warning when there is one, the p50 comparison, the TTFT gap's
    parts, the per-question prompt check and each phase's full table."""
    lines = ["# Pipeline overhead: the RAG chain against vLLM alone", "", setup, ""]
    warning = mismatch_warning(checks)
    if warning:
        lines += [f"**{warning}**", ""]
    lines += [
        "| metric (p50) | pipeline ms | direct ms | pipeline − direct ms | ratio |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in comparison:
        ratio = "-" if row.ratio is None else f"{row.ratio:.2f}x"
        cells = (_ms(row.pipeline_ms), _ms(row.direct_ms), _ms(row.diff_ms, signed=True), ratio)
        lines.append(f"| {row.metric} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Where the TTFT gap goes: medians over the {breakdown.questions} questions answered on "
        "both paths. Each question's parts add up to its gap; the medians need not.",
        "",
        "| part (p50) | ms | share of the gap | what it is |",
        "|---|---:|---:|---|",
    ]
    for name, field_name, meaning in BREAKDOWN_ROWS:
        value = getattr(breakdown, field_name)
        share = _share(value, breakdown.gap_ms)
        lines.append(f"| {name} | {_ms(value, signed=True)} | {share} | {meaning} |")
    lines += [
        "",
        "Same prompt on both paths: usage.prompt_tokens per question (local: the chat "
        "template's count where the prompt was built; p / d: pipeline / direct).",
        "",
        "| # | question | local | pipeline | direct | cached p / d | output p / d | check |",
        "|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for c in checks:
        status = "ok" if c.status == "ok" else f"**{c.status}**"
        lines.append(
            f"| {c.index} | {c.question} | {_int(c.local_prompt_tokens)} | "
            f"{_int(c.pipeline_prompt_tokens)} | {_int(c.direct_prompt_tokens)} | "
            f"{_int(c.pipeline_cached_tokens)} / {_int(c.direct_cached_tokens)} | "
            f"{_int(c.pipeline_output_tokens)} / {_int(c.direct_output_tokens)} | {status} |"
        )
    lines += [
        "",
        "## Pipeline: /v1/rag/query through Ray Serve",
        "",
        markdown_table(pipeline),
        "",
        "## Direct: /v1/chat/completions on vllm serve",
        "",
        markdown_table(direct),
        "",
    ]
    return "\n".join(lines)


def _ms(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+,.1f}" if signed else f"{value:,.1f}"


def _share(part: float | None, whole: float | None) -> str:
    if part is None or whole is None or whole <= 0:
        return "-"
    return f"{100 * part / whole:.0f}%"


def _int(value: int | None) -> str:
    return "-" if value is None else str(value)
