"""bench.direct's comparison of the two paths, the RAG pipeline and vLLM alone, on the same
final prompts: each latency's p50 on both, where the TTFT gap goes, and whether each
question's prompt really was the same on both (its prompt tokens)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bench.loadgen import RequestRecord
from bench.stats import Distribution, Summary, median


@dataclass(frozen=True)
class MetricComparison:
    """One latency's p50 on both paths; diff_ms is pipeline - direct, ratio pipeline / direct."""

    metric: str
    pipeline_ms: float | None
    direct_ms: float | None
    diff_ms: float | None
    ratio: float | None


def compare_p50(pipeline: Summary, direct: Summary) -> list[MetricComparison]:
    """TTFT, TPOT and E2E p50 of both phases, their difference and ratio (None where a side
    measured nothing, or the direct figure is 0 for the ratio)."""
    rows = []
    for metric, attribute in (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"), ("E2E", "e2e_ms")):
        ours: Distribution | None = getattr(pipeline, attribute)
        theirs: Distribution | None = getattr(direct, attribute)
        if ours is None or theirs is None:
            rows.append(
                MetricComparison(
                    metric,
                    ours.p50 if ours is not None else None,
                    theirs.p50 if theirs is not None else None,
                    None,
                    None,
                )
            )
            continue
        ratio = ours.p50 / theirs.p50 if theirs.p50 else None
        rows.append(MetricComparison(metric, ours.p50, theirs.p50, ours.p50 - theirs.p50, ratio))
    return rows


@dataclass(frozen=True)
class TtftBreakdown:
    """Medians over the questions both phases answered, each question's TTFT gap split in
    parts that add up to it: the pipeline's retrieve and compress stages (server timings,
    Ray hops to those stages included), the HTTP edge (client TTFT - server TTFT: proxy and
    ingress, on the way in and the first token's way out) and the rest (the hop to the
    generator and Ray Serve LLM's wrapper, less vLLM's own HTTP front end). Medians of parts
    need not add up to the median gap."""

    questions: int
    gap_ms: float | None
    retrieve_ms: float | None
    compress_ms: float | None
    edge_ms: float | None
    rest_ms: float | None


def ttft_breakdown(
    pipeline: Sequence[RequestRecord], direct: Sequence[RequestRecord]
) -> TtftBreakdown:
    """Pair the records by position (the same question on both paths) and take the medians
    of each pair's parts; pairs without a TTFT on both sides or the server's timings are
    left out."""
    parts: dict[str, list[float]] = {"gap": [], "retrieve": [], "compress": [], "edge": []}
    parts["rest"] = []
    for ours, theirs in zip(pipeline, direct, strict=True):
        timings = ours.server_timings_ms or {}
        if not (ours.ok and theirs.ok) or ours.ttft_ms is None or theirs.ttft_ms is None:
            continue
        if not all(isinstance(timings.get(k), float) for k in ("retrieve", "compress", "ttft")):
            continue
        gap = ours.ttft_ms - theirs.ttft_ms
        edge = ours.ttft_ms - timings["ttft"]
        parts["gap"].append(gap)
        parts["retrieve"].append(timings["retrieve"])
        parts["compress"].append(timings["compress"])
        parts["edge"].append(edge)
        parts["rest"].append(gap - timings["retrieve"] - timings["compress"] - edge)

    return TtftBreakdown(
        questions=len(parts["gap"]),
        gap_ms=median(parts["gap"]),
        retrieve_ms=median(parts["retrieve"]),
        compress_ms=median(parts["compress"]),
        edge_ms=median(parts["edge"]),
        rest_ms=median(parts["rest"]),
    )


@dataclass(frozen=True)
class PromptCheck:
    """One question's prompt on both paths. status: 'ok' (equal prompt tokens), 'MISMATCH'
    (both reported, and they differ) or 'unchecked' (a side reported none)."""

    index: int
    question: str
    local_prompt_tokens: int | None
    pipeline_prompt_tokens: int | None
    direct_prompt_tokens: int | None
    pipeline_cached_tokens: int | None
    direct_cached_tokens: int | None
    pipeline_output_tokens: int | None
    direct_output_tokens: int | None
    status: str


def check_prompts(
    pipeline: Sequence[RequestRecord],
    direct: Sequence[RequestRecord],
    local_prompt_tokens: Sequence[int | None],
) -> list[PromptCheck]:
    """Compare `usage.prompt_tokens` question by question (records paired by position)."""
    checks = []
    for index, (ours, theirs, local) in enumerate(
        zip(pipeline, direct, local_prompt_tokens, strict=True)
    ):
        p_tokens, d_tokens = ours.usage_prompt_tokens, theirs.usage_prompt_tokens
        if p_tokens is None or d_tokens is None:
            status = "unchecked"
        else:
            status = "ok" if p_tokens == d_tokens else "MISMATCH"
        checks.append(
            PromptCheck(
                index=index,
                question=ours.question,
                local_prompt_tokens=local,
                pipeline_prompt_tokens=p_tokens,
                direct_prompt_tokens=d_tokens,
                pipeline_cached_tokens=ours.usage_cached_prompt_tokens,
                direct_cached_tokens=theirs.usage_cached_prompt_tokens,
                pipeline_output_tokens=ours.usage_completion_tokens,
                direct_output_tokens=theirs.usage_completion_tokens,
                status=status,
            )
        )
    return checks


def mismatch_warning(checks: Sequence[PromptCheck]) -> str | None:
    """A loud line when prompt tokens differ on any question, else None."""
    bad = [check for check in checks if check.status == "MISMATCH"]
    if not bad:
        return None
    which = ", ".join(
        f"#{c.index} ({c.pipeline_prompt_tokens} vs {c.direct_prompt_tokens})" for c in bad
    )
    return (
        f"PROMPT MISMATCH on {len(bad)} of {len(checks)} questions, pipeline vs direct "
        f"prompt tokens: {which}. The two paths did not send the same prompts, so their "
        "latencies are not comparable."
    )
