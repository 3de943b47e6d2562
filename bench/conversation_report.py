"""The follow-up retrieval lab's summary and Markdown table (rows from bench.conversation).

Recall@k per condition over its answered requests; paired differences over the pairs
answered under both conditions (resampled together); p50s of the service's own timings.
Every interval is bench.stats' 95% percentile interval with a fixed seed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from bench.stats import (
    NO_DIFFERENCE,
    Interval,
    Statistic,
    difference_verdict,
    fmt_interval,
    format_ms,
    mean,
    median,
    one_sample,
    paired_difference,
    sample_mean,
    sample_median,
)
from bench.tables import markdown_table

# (minuend, subtrahend): the comparisons the lab is for.
RECALL_DIFFERENCES = (("join", "full"), ("rewrite", "full"), ("last", "full"), ("rewrite", "join"))


class Row(Protocol):
    """What the summary reads of one request (bench.conversation.ConditionResult)."""

    pair_id: str
    condition: str
    error: str | None
    recall: float | None
    gold_rank: int | None
    applied_mode: str | None
    rewrite_failed: bool | None
    retrieve_ms: float | None
    rewrite_ms: float | None
    ttft_ms: float | None
    total_ms: float | None
    cached_prompt_tokens: int | None


@dataclass(frozen=True)
class ConditionSummary:
    condition: str
    requests: int
    answered: int
    errors: int
    recall: Interval | None
    mrr: float | None
    applied_modes: dict[str, int]
    rewrite_fallbacks: int
    retrieve_ms_p50: float | None
    rewrite_ms_p50: float | None
    ttft_ms_p50: float | None
    total_ms_p50: float | None
    with_cached_prompt: int


@dataclass(frozen=True)
class Difference:
    """stat(a − b) over the pairs answered under both; `label` says what the interval says."""

    name: str
    pairs: int
    interval: Interval | None
    label: str


@dataclass(frozen=True)
class RewriteCost:
    rewrite_ms_p50: Interval | None
    ttft_ms: Difference | None
    total_ms: Difference | None
    fallbacks: int
    answered: int


@dataclass(frozen=True)
class CacheUse:
    """Answered follow-up requests (with history) and those with cached prompt tokens."""

    follow_up_requests: int
    with_cached_prompt: int
    fraction: Interval | None


@dataclass(frozen=True)
class Summary:
    top_k: int
    conditions: list[ConditionSummary]
    recall_differences: list[Difference]
    rewrite_cost: RewriteCost | None
    prefix_cache: CacheUse


def summarize(rows: Sequence[Row], conditions: Sequence[str], top_k: int) -> Summary:
    """The lab's figures from its rows; comparisons need both of their conditions run."""
    answered = {(r.pair_id, r.condition): r for r in rows if r.error is None}
    differences = [
        _difference(answered, rows, a, b, "recall", sample_mean)
        for a, b in RECALL_DIFFERENCES
        if a in conditions and b in conditions
    ]
    cost = None
    if "rewrite" in conditions:
        rewrites = [r for r in rows if r.condition == "rewrite" and r.error is None]
        has_join = "join" in conditions
        cost = RewriteCost(
            rewrite_ms_p50=one_sample((r.rewrite_ms for r in rewrites), sample_median),
            ttft_ms=_difference(answered, rows, "rewrite", "join", "ttft_ms", sample_median)
            if has_join
            else None,
            total_ms=_difference(answered, rows, "rewrite", "join", "total_ms", sample_median)
            if has_join
            else None,
            fallbacks=sum(_fell_back(r) for r in rewrites),
            answered=len(rewrites),
        )
    follow_ups = [
        r.cached_prompt_tokens
        for r in rows
        if r.error is None and r.condition != "full" and r.cached_prompt_tokens is not None
    ]
    cached = [float(tokens > 0) for tokens in follow_ups]
    return Summary(
        top_k=top_k,
        conditions=[_condition(c, [r for r in rows if r.condition == c]) for c in conditions],
        recall_differences=differences,
        rewrite_cost=cost,
        prefix_cache=CacheUse(len(cached), int(sum(cached)), one_sample(cached, sample_mean)),
    )


def _condition(condition: str, rows: Sequence[Row]) -> ConditionSummary:
    ok = [r for r in rows if r.error is None]
    return ConditionSummary(
        condition=condition,
        requests=len(rows),
        answered=len(ok),
        errors=len(rows) - len(ok),
        recall=one_sample((r.recall for r in ok), sample_mean),
        mrr=mean(1 / r.gold_rank if r.gold_rank else 0.0 for r in ok),
        applied_modes=dict(Counter(r.applied_mode for r in ok if r.applied_mode)),
        rewrite_fallbacks=sum(_fell_back(r) for r in ok) if condition == "rewrite" else 0,
        retrieve_ms_p50=median(r.retrieve_ms for r in ok),
        rewrite_ms_p50=median(r.rewrite_ms for r in ok),
        ttft_ms_p50=median(r.ttft_ms for r in ok),
        total_ms_p50=median(r.total_ms for r in ok),
        with_cached_prompt=sum(bool(r.cached_prompt_tokens) for r in ok),
    )


def _fell_back(row: Row) -> bool:
    return bool(row.rewrite_failed) or row.applied_mode not in {None, "rewrite"}


def _difference(
    answered: dict[tuple[str, str], Row],
    rows: Sequence[Row],
    a: str,
    b: str,
    metric: str,
    stat: Statistic,
) -> Difference:
    pair_ids = list(dict.fromkeys(r.pair_id for r in rows))
    values = [
        (getattr(answered[(p, a)], metric), getattr(answered[(p, b)], metric))
        for p in pair_ids
        if (p, a) in answered and (p, b) in answered
    ]
    values = [(x, y) for x, y in values if x is not None and y is not None]
    interval = paired_difference(values, stat)
    return Difference(f"{a} − {b}", len(values), interval, difference_verdict(interval))


# --- Markdown --------------------------------------------------------------------------------


def render_markdown(config: dict[str, Any], summary: Summary) -> str:
    """The summary as a Markdown report: one row per condition, then the comparisons."""
    k = summary.top_k
    lines = [
        f"# Follow-up retrieval: {config['label']}",
        "",
        f"{config['pairs_sent']} of {config['pairs']} SQuAD dev follow-up pairs (pair seed "
        f"{config['pair_seed']}), top_k {k}, one generated token per request, no compression, "
        f"service {config['url']}."
        + (" The time budget ran out before the last pair." if config["budget_spent"] else ""),
        "",
        config["history_note"],
        "",
        "`full`: the follow-up written out (no history). `last`, `join`, `rewrite`: the "
        "follow-up with a pronoun, after the history, retrieved by that mode. Intervals are "
        f'95% bootstrap intervals; one that holds 0 is "{NO_DIFFERENCE}".',
        "",
        markdown_table(
            [
                "condition",
                "answered",
                "errors",
                f"recall@{k} [95% CI]",
                "MRR",
                "mode applied",
                "retrieve p50 ms",
                "rewrite p50 ms",
                "TTFT p50 ms",
                "total p50 ms",
                "cached prompt > 0",
            ],
            [
                [
                    c.condition,
                    f"{c.answered}/{c.requests}",
                    c.errors,
                    fmt_interval(c.recall),
                    _fmt(c.mrr),
                    _modes(c.applied_modes),
                    format_ms(c.retrieve_ms_p50),
                    format_ms(c.rewrite_ms_p50),
                    format_ms(c.ttft_ms_p50),
                    format_ms(c.total_ms_p50),
                    f"{c.with_cached_prompt}/{c.answered}",
                ]
                for c in summary.conditions
            ],
        ),
    ]
    if summary.recall_differences:
        lines += [
            "",
            f"## Paired differences in recall@{k}",
            "",
            markdown_table(
                ["difference", "pairs", "mean [95% CI]", "verdict"],
                [
                    [d.name, d.pairs, fmt_interval(d.interval, 3), d.label]
                    for d in summary.recall_differences
                ],
            ),
        ]
    cost = summary.rewrite_cost
    if cost is not None:
        lines += [
            "",
            "## What the rewrite costs",
            "",
            f"- `timings_ms.rewrite` p50: {fmt_interval(cost.rewrite_ms_p50, 1)} ms",
            f"- fell back to the join: {cost.fallbacks} of {cost.answered}",
        ]
        for name, difference in (("TTFT", cost.ttft_ms), ("total", cost.total_ms)):
            if difference is not None:
                lines.append(
                    f"- {name} {difference.name}, median of per-pair differences: "
                    f"{fmt_interval(difference.interval, 1)} ms: {difference.label}"
                )
    cache = summary.prefix_cache
    lines += [
        "",
        "## Prefix cache",
        "",
        f"- follow-up requests with `cached_prompt_tokens` > 0: {cache.with_cached_prompt}/"
        f"{cache.follow_up_requests} ({fmt_interval(cache.fraction)})",
    ]
    return "\n".join(lines) + "\n"


def _modes(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{mode} {count}" for mode, count in sorted(counts.items())) or "–"


def _fmt(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"
