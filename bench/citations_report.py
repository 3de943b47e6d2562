"""Scoring and summary of the citation lab (bench.citations): one row per answer.

A citation is `{answer_span: [s, e], source_id, source_span: [s, e], score}`; its source
text is `context[source_id].text[s:e]`, the passage as the model saw it. A gold answer is
"held" by a text when bench.squad_metrics.answer_survives finds it there (both sides
normalised, substring). Proportions:

- coverage: answers with at least one citation, of the answered ones (an answer whose
  attribution was unavailable, `citations: null`, has none).
- span precision: answers whose top-scored citation's span holds a gold answer, of the
  answers with a citation; passage precision: the same for the top citation's whole passage.
- span hits: the same span hits over all answered requests (an answer without citations
  counts as a miss), against the ceiling: answers whose context holds a gold answer at all.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.schemas import CitationInfo, RagQueryResponse
from bench.squad_metrics import answer_survives, exact_match, f1, recall_at_k
from bench.stats import (
    Interval,
    fmt_interval,
    format_ms,
    mean,
    one_sample,
    percentile_or_none,
    sample_mean,
    sample_median,
)
from bench.tables import markdown_table


@dataclass
class CitationRow:
    """One question in one answer style; scored fields are None when the request failed."""

    question_id: str
    style: str
    question: str
    gold_answers: list[str]
    gold_doc_id: str
    status_code: int | None = None
    error: str | None = None
    client_ms: float | None = None
    answer: str | None = None
    answer_style: str | None = None
    compression_method: str | None = None
    source_doc_ids: list[str] = field(default_factory=list)
    citations: list[dict[str, Any]] | None = None
    citation_count: int | None = None
    # Citations naming a source_id that is not among the response's sources.
    invalid_source_ids: int | None = None
    # Citations whose answer span or source span falls outside its text, or whose source
    # is not in the returned context.
    bad_spans: int | None = None
    top_source_id: str | None = None
    top_score: float | None = None
    top_span_text: str | None = None
    top_span_has_gold: bool | None = None
    top_passage_has_gold: bool | None = None
    context_has_gold: bool | None = None
    gold_retrieved: bool | None = None
    answer_has_gold: bool | None = None
    # SQuAD's EM and F1 of the answer (best over the golds): what the short style is for.
    exact_match: float | None = None
    f1: float | None = None
    attribute_ms: float | None = None
    ttft_ms: float | None = None
    total_ms: float | None = None


def score_reply(row: CitationRow, reply: RagQueryResponse, top_k: int) -> None:
    """Fill `row`'s scored fields from a reply that carries `context`."""
    passages = {passage.id: passage.text for passage in reply.context or []}
    source_ids = {source.id for source in reply.sources}
    golds = row.gold_answers
    row.answer = reply.answer
    row.answer_style = reply.answer_style
    row.compression_method = reply.compression_method
    row.source_doc_ids = [source.doc_id for source in reply.sources]
    row.gold_retrieved = bool(recall_at_k(row.source_doc_ids, row.gold_doc_id, k=top_k))
    # Newlines keep a gold answer from being "found" across the seam of two passages.
    row.context_has_gold = answer_survives("\n".join(passages.values()), golds)
    row.answer_has_gold = answer_survives(reply.answer, golds)
    score_answer(row)
    row.attribute_ms = reply.timings_ms.attribute
    row.ttft_ms, row.total_ms = reply.timings_ms.ttft, reply.timings_ms.total
    if reply.citations is None:  # attribution off or unavailable: no figures, not zeros
        return
    citations = reply.citations
    row.citations = [citation.model_dump(mode="json") for citation in citations]
    row.citation_count = len(citations)
    row.invalid_source_ids = sum(c.source_id not in source_ids for c in citations)
    row.bad_spans = sum(not _spans_fit(c, reply.answer, passages) for c in citations)
    if not citations:
        return
    top = max(citations, key=lambda c: c.score)  # the first of equal scores
    passage = passages.get(top.source_id)
    start, end = top.source_span
    row.top_source_id, row.top_score = top.source_id, top.score
    row.top_span_text = None if passage is None else passage[start:end]
    row.top_span_has_gold = row.top_span_text is not None and answer_survives(
        row.top_span_text, golds
    )
    row.top_passage_has_gold = passage is not None and answer_survives(passage, golds)


def score_answer(row: CitationRow) -> None:
    """EM and F1 of `row.answer` against its golds (rows written before they were kept)."""
    if row.answer is not None:
        row.exact_match = exact_match(row.answer, row.gold_answers)
        row.f1 = f1(row.answer, row.gold_answers)


def _spans_fit(citation: CitationInfo, answer: str, passages: dict[str, str]) -> bool:
    passage = passages.get(citation.source_id)
    if passage is None:
        return False
    (a_start, a_end), (s_start, s_end) = citation.answer_span, citation.source_span
    return 0 <= a_start < a_end <= len(answer) and 0 <= s_start < s_end <= len(passage)


# --- summary ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class StyleSummary:
    style: str
    questions: int
    answered: int
    errors: int
    attribution_missing: int
    citations: int
    invalid_source_ids: int
    answers_with_invalid_source: int
    bad_spans: int
    citations_per_answer: float | None
    coverage: Interval | None
    span_precision: Interval | None
    passage_precision: Interval | None
    span_precision_when_context_has_gold: Interval | None
    span_hits: Interval | None
    context_ceiling: Interval | None
    gold_retrieved: Interval | None
    answer_has_gold: Interval | None
    exact_match: Interval | None
    f1: Interval | None
    attribute_ms_p50: Interval | None
    attribute_ms_p95: float | None
    compression_methods: dict[str, int]


def summarize(rows: Sequence[CitationRow], styles: Sequence[str]) -> list[StyleSummary]:
    """One StyleSummary per style, in the order given."""
    return [_style(style, [r for r in rows if r.style == style]) for style in styles]


def _style(style: str, rows: Sequence[CitationRow]) -> StyleSummary:
    ok = [r for r in rows if r.error is None]
    attributed = [r for r in ok if r.citations is not None]
    cited = [r for r in attributed if r.citation_count]
    attribute_ms = [r.attribute_ms for r in ok if r.attribute_ms is not None]
    return StyleSummary(
        style=style,
        questions=len(rows),
        answered=len(ok),
        errors=len(rows) - len(ok),
        attribution_missing=len(ok) - len(attributed),
        citations=sum(r.citation_count or 0 for r in attributed),
        invalid_source_ids=sum(r.invalid_source_ids or 0 for r in attributed),
        answers_with_invalid_source=sum(bool(r.invalid_source_ids) for r in attributed),
        bad_spans=sum(r.bad_spans or 0 for r in attributed),
        citations_per_answer=mean(r.citation_count for r in attributed),
        coverage=_share(ok, lambda r: bool(r.citation_count)),
        span_precision=_share(cited, lambda r: bool(r.top_span_has_gold)),
        passage_precision=_share(cited, lambda r: bool(r.top_passage_has_gold)),
        span_precision_when_context_has_gold=_share(
            [r for r in cited if r.context_has_gold], lambda r: bool(r.top_span_has_gold)
        ),
        span_hits=_share(ok, lambda r: bool(r.top_span_has_gold)),
        context_ceiling=_share(ok, lambda r: bool(r.context_has_gold)),
        gold_retrieved=_share(ok, lambda r: bool(r.gold_retrieved)),
        answer_has_gold=_share(ok, lambda r: bool(r.answer_has_gold)),
        exact_match=one_sample(
            [r.exact_match for r in ok if r.exact_match is not None], sample_mean
        ),
        f1=one_sample([r.f1 for r in ok if r.f1 is not None], sample_mean),
        attribute_ms_p50=one_sample(attribute_ms, sample_median),
        attribute_ms_p95=percentile_or_none(attribute_ms, 95),
        compression_methods=dict(Counter(r.compression_method for r in ok if r.compression_method)),
    )


def _share(rows: Sequence[CitationRow], hit: Callable[[CitationRow], bool]) -> Interval | None:
    return one_sample([float(hit(r)) for r in rows], sample_mean)


# --- Markdown --------------------------------------------------------------------------------


def render_markdown(config: dict[str, Any], summaries: Sequence[StyleSummary]) -> str:
    """One table of proportions and one of validity and cost, a row per answer style."""
    lines = [
        f"# Citation precision: {config['label']}",
        "",
        f"{config['questions_asked']} of {config['questions_sampled']} SQuAD v1.1 dev "
        f"questions (seed {config['seed']}), top_k {config['top_k']}, include_context, "
        f"temperature 0, the service's default compression, service {config['url']}."
        + (" The time budget ran out first." if config["budget_spent"] else ""),
        "",
        "Top citation: the highest-scored one; its span is sliced from its passage in "
        "`context`. Span and passage precision are over answers with a citation; coverage, span "
        "hits and the ceiling (the context holds a gold answer) over all answers. "
        "95% bootstrap intervals, n in parentheses.",
        "",
        markdown_table(
            [
                "style",
                "answered",
                "coverage",
                "span precision",
                "passage precision",
                "span precision, gold in context",
                "span hits",
                "ceiling",
                "answer holds gold",
                "EM",
                "F1",
            ],
            [
                [s.style, f"{s.answered}/{s.questions}", *map(fmt_interval, _shares(s))]
                for s in summaries
            ],
        ),
        "",
        markdown_table(
            [
                "style",
                "citations (per answer)",
                "invalid source_id (answers)",
                "bad spans",
                "no attribution",
                "attribute p50 ms [95% CI]",
                "attribute p95 ms",
                "compression",
            ],
            [
                [
                    s.style,
                    f"{s.citations} ({_per_answer(s)})",
                    f"{s.invalid_source_ids} ({s.answers_with_invalid_source})",
                    s.bad_spans,
                    s.attribution_missing,
                    fmt_interval(s.attribute_ms_p50, 1),
                    format_ms(s.attribute_ms_p95),
                    _methods(s),
                ]
                for s in summaries
            ],
        ),
    ]
    return "\n".join(lines) + "\n"


def _shares(s: StyleSummary) -> list[Interval | None]:
    return [s.coverage, s.span_precision, s.passage_precision,
            s.span_precision_when_context_has_gold, s.span_hits, s.context_ceiling,
            s.answer_has_gold, s.exact_match, s.f1]  # fmt: skip


def _per_answer(s: StyleSummary) -> str:
    return "–" if s.citations_per_answer is None else f"{s.citations_per_answer:.2f}"


def _methods(s: StyleSummary) -> str:
    return ", ".join(f"{m} {n}" for m, n in sorted(s.compression_methods.items())) or "–"
