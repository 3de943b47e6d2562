"""SQuAD answer quality of a running service, per retrieval depth and compression method.

    python -m bench.quality prepare [--cache .cache/squad] [--index indexes/squad-dev]
    python -m bench.quality run --url http://127.0.0.1:8000 [--api-key K] --questions 50 \\
        --seed 0 --sweep quick|full|reader|qwen [--methods none sentences] [--interleave] \\
        [--resume] [--concurrency 4] --max-tokens 32 --out bench-results --label squad-quick

`prepare` fetches SQuAD v1.1 dev (bench.squad), writes its paragraphs as a JSONL corpus and,
only when the index is missing, builds it with the project's own `python -m retrieval.build`.
The service must then serve that index: write a variant with
`python -m harness.variant --set retriever.index_path=indexes/squad-dev --out ...` and start it.

`run` samples questions with a seed and sends each one once per sweep point to
POST /v1/rag/query (include_context, temperature 0, the point's top_k and compression), one
request at a time (`--concurrency N`: N in flight, the next sent as one returns), each with a
timeout; a failed request is recorded, never retried. Per
question it scores EM and F1 (best over the gold answers, citations stripped from the answer
first), recall@k (the gold paragraph among the sources' doc ids; a SQuAD paragraph id is the
corpus doc id), whether a gold answer survives in the context the model saw, the context tokens
before and after compression, citation validity, and the service's timings. It writes
`<out>/<label>.json` (config, per-question results, per-point summary), `<out>/<label>.md`
(one table row per point) and, when matplotlib is importable, `<out>/<label>.png`
(F1 against mean context tokens kept).

Every result is also appended to `<out>/<label>.partial.jsonl` as it comes: Ctrl-C writes
the outputs of what was done (`stopped_early` in the config) and `--resume` goes on from
there. `--interleave` asks question by question, the points in ABBA turn, so that a run
stopped early still compares every point on the same questions.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field, fields
from itertools import islice
from pathlib import Path
from typing import Any, TypeVar

import httpx

from app.schemas import RagQueryResponse
from bench import quality_report
from bench.client import auth_headers, check_ready, post_query, with_client
from bench.labs import label, positive_float, positive_int, utc_now, write_json_and_markdown
from bench.squad import (
    DEFAULT_CACHE_DIR,
    SQUAD_DEV_FILENAME,
    SquadFetchError,
    SquadFormatError,
    SquadQuestion,
    fetch_squad_dev,
    load_squad,
    sample_questions,
    write_corpus_jsonl,
)
from bench.squad_metrics import (
    answer_survives,
    citation_validity,
    cited_ids,
    exact_match,
    f1,
    recall_at_k,
    repeated_sentences,
)
from bench.stats import mean, median
from bench.tables import markdown_table
from pipeline.messages import CompressionMethod
from retrieval.index import INDEX_FILE, MANIFEST_FILE

logger = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_INDEX_DIR = Path("indexes/squad-dev")
CORPUS_FILENAME = "squad-dev.jsonl"
# The ingress gives up at 120 s by default (ingress.request_timeout_s); allow for the hop.
DEFAULT_TIMEOUT_S = 180.0
# Bracketed citations, as bench.squad_metrics counts them; removed before EM/F1 so that a
# correct answer is not penalised for citing its source.
_CITATION = re.compile(r"\[[^\[\]\n]+\](?!\()")

CommandRunner = Callable[..., "subprocess.CompletedProcess[Any]"]
SquadFetcher = Callable[[Path], Path]


class QualityError(RuntimeError):
    """The benchmark cannot go on (no data set, index build failed, service not ready)."""


# --- sweep -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SweepPoint:
    """One setting under test: retrieve `top_k` chunks, compress with `method` at `rate`."""

    method: CompressionMethod
    rate: float | None
    top_k: int

    @property
    def name(self) -> str:
        """A short label such as `sentences@0.5 k=3`."""
        rate = "" if self.rate is None else f"@{self.rate:g}"
        return f"{self.method}{rate} k={self.top_k}"

    def compression(self) -> dict[str, Any]:
        """The request's `compression` object: the method itself, never the service's
        `auto` policy deciding to skip it."""
        options: dict[str, Any] = {"method": self.method, "policy": "always"}
        if self.rate is not None:
            options["rate"] = self.rate
        return options


SWEEPS: dict[str, tuple[SweepPoint, ...]] = {
    "quick": (
        SweepPoint("none", None, 3),
        SweepPoint("sentences", 0.5, 3),
        SweepPoint("llmlingua", 0.5, 3),
    ),
    # Every method at k=3 (two rates each), and the k=5 retrieval for the main ones.
    "full": (
        SweepPoint("none", None, 3),
        SweepPoint("none", None, 5),
        SweepPoint("sentences", 0.5, 3),
        SweepPoint("sentences", 0.5, 5),
        SweepPoint("sentences", 0.33, 3),
        SweepPoint("llmlingua", 0.5, 3),
        SweepPoint("llmlingua", 0.5, 5),
        SweepPoint("llmlingua", 0.33, 3),
        SweepPoint("sentences+llmlingua", 0.33, 3),
    ),
    # The 1.5B reader's headline comparison at top-5, one point per method; run a subset of
    # the methods with `--methods` (the same seed and n ask the same questions, so runs pair).
    "reader": (
        SweepPoint("none", None, 5),
        SweepPoint("sentences", 0.5, 5),
        SweepPoint("llmlingua", 0.5, 5),
    ),
    # The prefix cache's TTFT (bench.suite's prefix-off / prefix-on plans): one request per
    # question, so nothing but the system prompt can be shared between prompts.
    "prefix": (SweepPoint("none", None, 3),),
    # What the shipped config does to every request: sentences at 0.5 on the top 5.
    "default": (SweepPoint("sentences", 0.5, 5),),
    # Naive RAG: the shipped config's top 5, uncompressed.
    "naive": (SweepPoint("none", None, 5),),
    # The slower Qwen reader: the k=3 points.
    "qwen": (
        SweepPoint("none", None, 3),
        SweepPoint("sentences", 0.5, 3),
        SweepPoint("sentences", 0.33, 3),
        SweepPoint("llmlingua", 0.5, 3),
        SweepPoint("llmlingua", 0.33, 3),
    ),
}


# --- per-question results --------------------------------------------------------------------


@dataclass
class QuestionResult:
    """One question at one sweep point. Metric fields are None when the request failed."""

    point: str
    method: str
    rate: float | None
    top_k: int
    question_id: str
    question: str
    gold_answers: list[str]
    gold_doc_id: str
    status_code: int | None = None
    error: str | None = None
    client_ms: float | None = None
    answer: str | None = None
    exact_match: float | None = None
    f1: float | None = None
    recall: float | None = None
    answer_survived: bool | None = None
    citation_validity: float | None = None
    citations: int | None = None
    source_ids: list[str] = field(default_factory=list)
    source_doc_ids: list[str] = field(default_factory=list)
    context_tokens_before: int | None = None
    context_tokens_after: int | None = None
    prompt_tokens: int | None = None
    cached_prompt_tokens: int | None = None
    completion_tokens: int | None = None
    retrieve_ms: float | None = None
    compress_ms: float | None = None
    ttft_ms: float | None = None
    total_ms: float | None = None
    tpot_ms: float | None = None
    answer_style: str = "explained"
    # A gold answer found inside the answer (both normalised): what an explained answer is
    # scored by, where EM/F1 against a span mean little.
    contains_gold: bool | None = None
    # "stop": the answer ended on its own; "length": cut at max_tokens.
    finish_reason: str | None = None
    # The answer's sentences that repeat an earlier one word for word (squad_metrics).
    repeated_sentences: int | None = None
    # The service's attribution, as text: each answer sentence and the source sentence it
    # points at (`citations` of the response), for judging whether the source supports it.
    attributions: list[dict[str, Any]] = field(default_factory=list)

    @property
    def answered(self) -> bool:
        return self.error is None


def query_question(
    client: httpx.Client,
    question: SquadQuestion,
    point: SweepPoint,
    max_tokens: int,
    timeout_s: float,
    headers: dict[str, str] | None = None,
    answer_style: str = "explained",
    collection: str | None = None,
) -> QuestionResult:
    """Ask one question at one sweep point (of `collection`, or the service's default) and
    score the reply; errors are recorded, not raised.

    A transport error, a non-200 status or a body that is not a RagQueryResponse with `context`
    yields a result with `error` set and no metrics.
    """
    result = QuestionResult(
        point=point.name,
        method=point.method,
        rate=point.rate,
        top_k=point.top_k,
        question_id=question.question_id,
        question=question.question,
        gold_answers=list(question.gold_answers),
        gold_doc_id=question.paragraph_id,
        answer_style=answer_style,
    )
    body = {
        "question": question.question,
        "answer_style": answer_style,
        "top_k": point.top_k,
        "compression": point.compression(),
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "include_context": True,
    }
    if collection is not None:
        body["collection"] = collection
    outcome = post_query(client, body, timeout_s, headers)
    result.status_code, result.client_ms = outcome.status_code, outcome.client_ms
    reply = outcome.reply
    if reply is None:
        result.error = outcome.error
        return result
    if reply.context is None:
        result.error = "response has no 'context'; the service ignores include_context"
        return result
    _score(result, reply, question, point)
    return result


def _score(
    result: QuestionResult, reply: RagQueryResponse, question: SquadQuestion, point: SweepPoint
) -> None:
    context = reply.context or []
    answer_for_scoring = without_citations(reply.answer)
    result.answer = reply.answer
    result.exact_match = exact_match(answer_for_scoring, question.gold_answers)
    result.f1 = f1(answer_for_scoring, question.gold_answers)
    result.contains_gold = answer_survives(answer_for_scoring, question.gold_answers)
    result.repeated_sentences = repeated_sentences(reply.answer)
    result.source_ids = [source.id for source in reply.sources]
    result.source_doc_ids = [source.doc_id for source in reply.sources]
    result.recall = recall_at_k(result.source_doc_ids, question.paragraph_id, k=point.top_k)
    # Newlines keep a gold answer from being "found" across the seam of two passages.
    result.answer_survived = answer_survives(
        "\n".join(passage.text for passage in context), question.gold_answers
    )
    result.citation_validity = citation_validity(reply.answer, [p.id for p in context])
    result.citations = len(cited_ids(reply.answer))
    usage = reply.usage
    result.context_tokens_before = usage.context_tokens_before
    result.context_tokens_after = usage.context_tokens_after
    result.prompt_tokens = usage.prompt_tokens
    result.cached_prompt_tokens = usage.cached_prompt_tokens
    result.completion_tokens = usage.completion_tokens
    result.retrieve_ms = reply.timings_ms.retrieve
    result.compress_ms = reply.timings_ms.compress
    result.ttft_ms = reply.timings_ms.ttft
    result.total_ms = reply.timings_ms.total
    result.tpot_ms = reply.tpot_ms
    result.finish_reason = reply.finish_reason
    result.attributions = attributions(reply)


def without_citations(text: str) -> str:
    """`text` with its `[source id]` markers blanked out, as it is scored and judged."""
    return _CITATION.sub(" ", text)


def attributions(reply: RagQueryResponse) -> list[dict[str, Any]]:
    """Each citation of `reply` as the answer sentence, the source id and sentence, and the
    attribution's score (empty when the reply has no citations or no context)."""
    passages = {passage.id: passage.text for passage in reply.context or []}
    pairs = []
    for citation in reply.citations or []:
        text = passages.get(citation.source_id)
        if text is None:
            continue
        (a0, a1), (s0, s1) = citation.answer_span, citation.source_span
        pairs.append({"answer_sentence": reply.answer[a0:a1], "source_id": citation.source_id,
                      "source_sentence": text[s0:s1], "score": citation.score})  # fmt: skip
    return pairs


def sweep_order(
    questions: Sequence[SquadQuestion], points: Sequence[SweepPoint], interleave: bool = False
) -> list[tuple[SweepPoint, SquadQuestion]]:
    """The requests in the order they are sent: point by point, or, interleaved, question by
    question with the points in turn forwards and backwards (ABBA), so that a run stopped
    early is still paired and drift over the run falls on every point alike."""
    if not interleave:
        return [(point, question) for point in points for question in questions]
    return [
        (point, question)
        for i, question in enumerate(questions)
        for point in (points if i % 2 == 0 else tuple(reversed(points)))
    ]


def iter_sweep(
    client: httpx.Client,
    requests: Sequence[tuple[SweepPoint, SquadQuestion]],
    max_tokens: int,
    timeout_s: float,
    known_doc_ids: set[str],
    headers: dict[str, str] | None = None,
    answer_style: str = "explained",
    concurrency: int = 1,
    collection: str | None = None,
) -> Iterator[QuestionResult]:
    """Send `requests` in order, `concurrency` in flight at a time, yielding each scored
    result as it comes.

    `known_doc_ids` are the corpus's paragraph ids: if the first answered request retrieves
    none of them, the service is serving another index and QualityError stops the run there.
    """

    def ask(request: tuple[SweepPoint, SquadQuestion]) -> QuestionResult:
        point, question = request
        return query_question(
            client, question, point, max_tokens, timeout_s, headers, answer_style, collection
        )

    checked_index = False
    for done, result in enumerate(_in_flight(ask, requests, concurrency), start=1):
        if result.answered and not checked_index:
            checked_index = True
            if not known_doc_ids.intersection(result.source_doc_ids):
                raise QualityError(
                    "the service's sources are not SQuAD paragraphs (got "
                    f"{result.source_doc_ids[:3]}); serve the index `prepare` built "
                    "(retriever.index_path, see harness.variant)"
                )
        logger.info(
            "[%d/%d] %s %s: %s",
            done,
            len(requests),
            result.point,
            result.question_id,
            result.error
            or f"F1 {result.f1:.2f}, recall {result.recall:.0f}, TTFT {result.ttft_ms:.0f} ms",
        )
        yield result


def _in_flight(
    ask: Callable[[T], QuestionResult], requests: Sequence[T], concurrency: int
) -> Iterator[QuestionResult]:
    """`ask` of each request, in order, at most `concurrency` at a time (the next sent as one
    comes back, a closed loop), yielding the results as they come."""
    if concurrency <= 1:
        yield from map(ask, requests)
        return
    pending = iter(requests)
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        running = {pool.submit(ask, request) for request in islice(pending, concurrency)}
        while running:
            finished, running = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                for request in islice(pending, 1):
                    running.add(pool.submit(ask, request))
                yield future.result()


# --- checkpoint ------------------------------------------------------------------------------


def checkpoint_path(out_dir: Path, label: str) -> Path:
    """Where a run appends each result as it comes (removed once the outputs are written)."""
    return out_dir / f"{label}.partial.jsonl"


def read_checkpoint(
    path: Path, points: Sequence[SweepPoint], questions: Sequence[SquadQuestion]
) -> list[QuestionResult]:
    """The results an earlier, unfinished run of the same sample left in `path` (none when
    there is no file). Raises QualityError when they are not of this run's questions and
    points: resuming them would mix two samples."""
    if not path.is_file():
        return []
    wanted_points = {point.name for point in points}
    wanted_questions = {question.question_id for question in questions}
    results = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            result = QuestionResult(**json.loads(line))
        except (ValueError, TypeError) as exc:
            raise QualityError(f"{path}:{number}: not a result of this tool ({exc})") from exc
        if result.point not in wanted_points or result.question_id not in wanted_questions:
            raise QualityError(
                f"{path}:{number}: {result.point} {result.question_id} is not in this run's "
                "sample; delete the file or run with the seed, --questions and sweep it had"
            )
        results.append(result)
    return results


# --- per-point summary -----------------------------------------------------------------------


@dataclass(frozen=True)
class PointSummary:
    """Aggregates of one sweep point over the questions whose request succeeded.

    `kept_ratio` is total context tokens after over total before; `citation_validity` is the
    mean over answers that cite anything (`citing_answers` of them); medians are of the
    service's own timings.
    """

    point: str
    method: str
    rate: float | None
    top_k: int
    questions: int
    answered: int
    errors: int
    exact_match: float | None
    f1: float | None
    contains_gold: float | None
    recall: float | None
    answer_survival: float | None
    context_tokens_before_mean: float | None
    context_tokens_kept_mean: float | None
    kept_ratio: float | None
    citation_validity: float | None
    citing_answers: int
    ttft_ms_median: float | None
    total_ms_median: float | None
    # Answers that used the whole max_tokens: cut, or about to be (a cap so low that many
    # answers reach it scores the cap, not the reader).
    at_cap: int = 0
    # Answers that said a sentence of theirs twice.
    repeating_answers: int = 0


def summarize(
    results: Sequence[QuestionResult], points: Sequence[SweepPoint], max_tokens: int | None = None
) -> list[PointSummary]:
    """One PointSummary per point, in sweep order; `at_cap` counts answers of `max_tokens`
    completion tokens or more."""
    summaries = []
    for point in points:
        mine = [r for r in results if r.point == point.name]
        ok = [r for r in mine if r.answered]
        before = [r.context_tokens_before for r in ok if r.context_tokens_before is not None]
        after = [r.context_tokens_after for r in ok if r.context_tokens_after is not None]
        validities = [r.citation_validity for r in ok if r.citation_validity is not None]
        summaries.append(
            PointSummary(
                point=point.name,
                method=point.method,
                rate=point.rate,
                top_k=point.top_k,
                questions=len(mine),
                answered=len(ok),
                errors=len(mine) - len(ok),
                exact_match=mean(r.exact_match for r in ok),
                f1=mean(r.f1 for r in ok),
                contains_gold=mean(
                    None if r.contains_gold is None else float(r.contains_gold) for r in ok
                ),
                recall=mean(r.recall for r in ok),
                answer_survival=mean(
                    None if r.answer_survived is None else float(r.answer_survived) for r in ok
                ),
                context_tokens_before_mean=mean(before),
                context_tokens_kept_mean=mean(after),
                kept_ratio=sum(after) / sum(before) if sum(before) > 0 else None,
                citation_validity=mean(validities),
                citing_answers=len(validities),
                ttft_ms_median=median(r.ttft_ms for r in ok),
                total_ms_median=median(r.total_ms for r in ok),
                at_cap=sum(
                    1
                    for r in ok
                    if max_tokens is not None
                    and r.completion_tokens is not None
                    and r.completion_tokens >= max_tokens
                ),
                repeating_answers=sum(1 for r in ok if r.repeated_sentences),
            )
        )
    return summaries


# --- outputs ---------------------------------------------------------------------------------


def render_markdown(config: dict[str, Any], summaries: Sequence[PointSummary]) -> str:
    """The summary as a Markdown table, one row per sweep point, under a line of config."""
    lines = [
        f"# SQuAD quality: {config['label']}",
        "",
        f"{config['questions_sampled']} SQuAD v1.1 dev questions (seed {config['seed']}), "
        f"sweep `{config['sweep']}`, answer style `{config.get('answer_style', 'explained')}`, "
        f"max_tokens {config['max_tokens']}, temperature 0, "
        f"service {config['url']}. Means are over answered requests; the kept ratio is total "
        "context tokens after / before; citation validity is over answers that cite.",
        "",
        *(
            [
                "Stopped early: the rows hold the requests done before Ctrl-C "
                "(`--resume` goes on).",
                "",
            ]
            if config.get("stopped_early")
            else []
        ),
        markdown_table(
            [
                "point",
                "answered",
                "errors",
                "EM",
                "F1",
                "contains gold",
                "recall@k",
                "answer kept",
                "context tokens before → kept",
                "kept ratio",
                "citation validity (citing)",
                "TTFT p50 ms",
                "total p50 ms",
                "at max_tokens",
                "repeating a sentence",
            ],
            [
                [
                    s.point,
                    f"{s.answered}/{s.questions}",
                    s.errors,
                    _fmt(s.exact_match),
                    _fmt(s.f1),
                    _fmt(s.contains_gold),
                    _fmt(s.recall),
                    _fmt(s.answer_survival),
                    f"{_fmt(s.context_tokens_before_mean, 0)} → "
                    f"{_fmt(s.context_tokens_kept_mean, 0)}",
                    _fmt(s.kept_ratio, 2),
                    f"{_fmt(s.citation_validity)} ({s.citing_answers})",
                    _fmt(s.ttft_ms_median, 0),
                    _fmt(s.total_ms_median, 0),
                    f"{s.at_cap}/{s.answered}",
                    f"{s.repeating_answers}/{s.answered}",
                ]
                for s in summaries
            ],
        ),
    ]
    return "\n".join(lines) + "\n"


def _fmt(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def plot_f1_against_tokens(summaries: Sequence[PointSummary], path: Path) -> bool:
    """Write F1 against mean context tokens kept, one marker per method; False without
    matplotlib (it is optional and never installed by this tool)."""
    if importlib.util.find_spec("matplotlib") is None:
        logger.warning("matplotlib is not importable; skipping the plot %s", path)
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    markers = {"none": "o", "sentences": "s", "llmlingua": "^", "sentences+llmlingua": "D"}
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for method, marker in markers.items():
        drawn = [
            (s.context_tokens_kept_mean, s.f1, s)
            for s in summaries
            if s.method == method and s.f1 is not None and s.context_tokens_kept_mean is not None
        ]
        if not drawn:
            continue
        axes.scatter(
            [x for x, _, _ in drawn], [y for _, y, _ in drawn], marker=marker, label=method
        )
        for x, y, s in drawn:
            rate = "" if s.rate is None else f" r={s.rate:g}"
            axes.annotate(
                f"k={s.top_k}{rate}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8
            )
    axes.set_xlabel("mean context tokens kept")
    axes.set_ylabel("F1")
    axes.set_title("SQuAD F1 against context kept")
    axes.grid(alpha=0.3)
    if axes.get_legend_handles_labels()[0]:
        axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return True


def write_outputs(
    out_dir: Path,
    label: str,
    config: dict[str, Any],
    results: Sequence[QuestionResult],
    summaries: Sequence[PointSummary],
) -> list[Path]:
    """Write `<label>.json`, `<label>.md` and, with matplotlib, `<label>.png`; return them."""
    rows = [asdict(r) for r in results]
    comparisons = quality_report.against_none(rows, config["points"])
    document = {
        "config": config,
        "summary": [asdict(s) for s in summaries],
        "comparisons": quality_report.jsonable(comparisons),
        "results": rows,
    }
    markdown = render_markdown(config, summaries) + quality_report.comparisons_markdown(comparisons)
    written = write_json_and_markdown(out_dir, label, document, markdown)
    png_path = out_dir / f"{label}.png"
    if plot_f1_against_tokens(summaries, png_path):
        written.append(png_path)
    return written


# --- the two commands ------------------------------------------------------------------------


@dataclass(frozen=True)
class RunSettings:
    """What `run` was asked to do (no secrets: the API key is not kept)."""

    url: str
    questions: int
    seed: int
    sweep: str
    max_tokens: int
    timeout_s: float
    out_dir: Path
    label: str
    cache_dir: Path = DEFAULT_CACHE_DIR
    # Any SQuAD-format JSON file; None: SQuAD v1.1 dev from the cache.
    squad_file: Path | None = None
    # "short" (the answer span: EM/F1 mean what they say) or "explained".
    answer_style: str = "explained"
    # Only the sweep's points of these methods; empty: all of them.
    methods: tuple[str, ...] = ()
    # Question by question, points in ABBA turn (sweep_order), instead of point by point.
    interleave: bool = False
    # Go on from the checkpoint an unfinished run of the same sample left.
    resume: bool = False
    # Requests in flight at a time (a closed loop); 1: one at a time.
    concurrency: int = 1
    # The collection every question is asked of; None: the service's default.
    collection: str | None = None


def run_quality(
    settings: RunSettings, client: httpx.Client, api_key: str | None = None
) -> list[Path]:
    """Sample the questions, check the service is ready, run the sweep, write the outputs.

    `client` is used as given (its base URL is the service); the key, when given, goes in an
    `Authorization: Bearer` header on each query. Raises QualityError if the cached SQuAD set
    is missing, the service is not ready, or it serves another index.

    Each result is appended to `checkpoint_path` as it comes; `resume` starts from what an
    unfinished run left there. Ctrl-C stops the sweep and still writes the outputs, marked
    `stopped_early` (the checkpoint stays, for `--resume`); a finished run removes it.
    """
    squad_path = settings.squad_file or settings.cache_dir / SQUAD_DEV_FILENAME
    if not squad_path.is_file():
        raise QualityError(f"{squad_path} not found; run `python -m bench.quality prepare`")
    squad = load_squad(squad_path)
    questions = sample_questions(squad, settings.questions, settings.seed)
    points = select_points(settings.sweep, settings.methods)
    if (problem := check_ready(client, settings.timeout_s)) is not None:
        raise QualityError(problem)
    headers = auth_headers(api_key)
    settings.out_dir.mkdir(parents=True, exist_ok=True)
    checkpoint = checkpoint_path(settings.out_dir, settings.label)
    results = read_checkpoint(checkpoint, points, questions) if settings.resume else []
    if not settings.resume:
        checkpoint.unlink(missing_ok=True)
    done = {(r.point, r.question_id) for r in results}
    requests = [
        (point, question)
        for point, question in sweep_order(questions, points, settings.interleave)
        if (point.name, question.question_id) not in done
    ]
    logger.info(
        "%d questions x %d points: %d requests to send, %d at a time (%d from %s)",
        len(questions),
        len(points),
        len(requests),
        settings.concurrency,
        len(results),
        checkpoint,
    )
    started_at = utc_now()
    started = time.perf_counter()
    resumed = len(results)
    stopped_early = False
    try:
        with checkpoint.open("a", encoding="utf-8") as sink:
            for result in iter_sweep(
                client,
                requests,
                settings.max_tokens,
                settings.timeout_s,
                {paragraph.paragraph_id for paragraph in squad.paragraphs},
                headers,
                settings.answer_style,
                settings.concurrency,
                settings.collection,
            ):
                results.append(result)
                sink.write(json.dumps(asdict(result)) + "\n")
                sink.flush()
    except KeyboardInterrupt:
        stopped_early = True
        logger.warning(
            "stopped early: %d of %d requests done", len(results), len(done) + len(requests)
        )
    summaries = summarize(results, points, settings.max_tokens)
    config = {
        **{
            key: str(value) if isinstance(value, Path) else value
            for key, value in asdict(settings).items()
        },
        "squad_path": str(squad_path),
        "questions_sampled": len(questions),
        "question_ids": [question.question_id for question in questions],
        "points": [{**asdict(point), "name": point.name} for point in points],
        "started_at": started_at,
        "elapsed_s": round(time.perf_counter() - started, 1),
        "resumed_results": resumed,
        "stopped_early": stopped_early,
    }
    written = write_outputs(settings.out_dir, settings.label, config, results, summaries)
    if not stopped_early:
        checkpoint.unlink(missing_ok=True)
    return written


def select_points(sweep: str, methods: Sequence[str] = ()) -> tuple[SweepPoint, ...]:
    """The sweep's points, only those of `methods` when any are named (QualityError when
    that leaves none)."""
    points = tuple(p for p in SWEEPS[sweep] if not methods or p.method in methods)
    if not points:
        raise QualityError(f"sweep {sweep!r} has no point of the methods {list(methods)}")
    return points


@dataclass(frozen=True)
class PrepareResult:
    """What `prepare` found or made; `build_command` and `build_s` are None if it built
    nothing."""

    squad_path: Path
    corpus_path: Path
    index_dir: Path
    manifest: dict[str, Any]
    build_command: list[str] | None = None
    build_s: float | None = None


def build_command(corpus_dir: Path, index_dir: Path) -> list[str]:
    """The project's own index build, run with this interpreter."""
    return [
        sys.executable,
        "-m",
        "retrieval.build",
        "--input",
        str(corpus_dir),
        "--output",
        str(index_dir),
    ]


def index_is_built(index_dir: Path) -> bool:
    """Whether `index_dir` holds a saved index (its manifest and FAISS file)."""
    return (index_dir / MANIFEST_FILE).is_file() and (index_dir / INDEX_FILE).is_file()


def prepare(
    cache_dir: Path = DEFAULT_CACHE_DIR,
    index_dir: Path = DEFAULT_INDEX_DIR,
    *,
    fetch: SquadFetcher | None = None,
    run_command: CommandRunner | None = None,
    squad_file: Path | None = None,
) -> PrepareResult:
    """Fetch SQuAD dev into `cache_dir`, (re)write `<cache_dir>/corpus/squad-dev.jsonl`, and
    build the index into `index_dir` only if it is not already there. With `squad_file`
    (any SQuAD-format JSON), its paragraphs go to `<cache_dir>/corpus-<stem>/` instead.

    `fetch` defaults to bench.squad.fetch_squad_dev and `run_command` to subprocess.run (both
    injectable for tests). The build's output goes to this process's terminal. Raises
    QualityError if the build fails or leaves no index.
    """
    run_command = run_command or subprocess.run
    if squad_file is not None:  # another SQuAD-format set: its own corpus folder
        squad_path = squad_file
        corpus_path = cache_dir / f"corpus-{squad_file.stem}" / f"{squad_file.stem}.jsonl"
    else:
        squad_path = (fetch or fetch_squad_dev)(cache_dir)
        corpus_path = cache_dir / "corpus" / CORPUS_FILENAME
    squad = load_squad(squad_path)
    records = write_corpus_jsonl(squad, corpus_path)
    logger.info("wrote %d paragraphs to %s", records, corpus_path)
    command: list[str] | None = None
    build_s: float | None = None
    if index_is_built(index_dir):
        logger.info("index already built at %s; not rebuilding", index_dir)
    else:
        _warn_about_other_documents(corpus_path)
        command = build_command(corpus_path.parent, index_dir)
        logger.info("building the index: %s", shlex.join(command))
        started = time.perf_counter()
        completed = run_command(command, check=False)
        build_s = round(time.perf_counter() - started, 1)
        if completed.returncode != 0:
            raise QualityError(f"{shlex.join(command)} failed with exit {completed.returncode}")
        if not index_is_built(index_dir):
            raise QualityError(f"{shlex.join(command)} succeeded but left no index in {index_dir}")
    manifest = _read_manifest(index_dir)
    documents = manifest.get("extra", {}).get("num_documents")
    if documents != len(squad.paragraphs):
        logger.warning(
            "%s holds %s documents but SQuAD dev has %d paragraphs; delete it to rebuild",
            index_dir,
            documents,
            len(squad.paragraphs),
        )
    return PrepareResult(squad_path, corpus_path, index_dir, manifest, command, build_s)


def _read_manifest(index_dir: Path) -> dict[str, Any]:
    manifest: dict[str, Any] = json.loads((index_dir / MANIFEST_FILE).read_text(encoding="utf-8"))
    return manifest


def _warn_about_other_documents(corpus_path: Path) -> None:
    # retrieval.build indexes every document file under the folder, not just ours.
    others = [
        path
        for path in corpus_path.parent.rglob("*")
        if path.is_file() and path != corpus_path and path.suffix in {".jsonl", ".txt", ".md"}
    ]
    if others:
        logger.warning("%s also holds %s; they will be indexed too", corpus_path.parent, others)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.quality", description=__doc__.splitlines()[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    prepare_parser = commands.add_parser("prepare", help="fetch SQuAD dev, build its index")
    prepare_parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE_DIR)
    prepare_parser.add_argument("--index", type=Path, default=DEFAULT_INDEX_DIR)
    prepare_parser.add_argument(
        "--squad-file", type=Path, help="any SQuAD-format JSON (default: SQuAD v1.1 dev)"
    )

    run_parser = commands.add_parser("run", help="score a running service on SQuAD questions")
    run_parser.add_argument("--url", default="http://127.0.0.1:8000")
    run_parser.add_argument("--api-key", default=None, help="sent as Authorization: Bearer")
    run_parser.add_argument("--questions", type=positive_int, default=50)
    run_parser.add_argument("--seed", type=int, default=0)
    run_parser.add_argument("--sweep", choices=sorted(SWEEPS), default="quick")
    run_parser.add_argument("--max-tokens", type=positive_int, default=32)
    run_parser.add_argument(
        "--answer-style",
        choices=("short", "explained"),
        default="explained",
        help="short: the answer span (EM/F1); explained: scored by contains-gold",
    )
    run_parser.add_argument(
        "--methods",
        nargs="+",
        choices=("none", "sentences", "llmlingua", "sentences+llmlingua"),
        default=(),
        help="only the sweep's points of these compression methods",
    )
    run_parser.add_argument(
        "--interleave",
        action="store_true",
        help="question by question, the points in ABBA turn (default: point by point)",
    )
    run_parser.add_argument(
        "--concurrency", type=positive_int, default=1, help="requests in flight at a time"
    )
    run_parser.add_argument(
        "--resume",
        action="store_true",
        help="go on from <out>/<label>.partial.jsonl, which an unfinished run left",
    )
    run_parser.add_argument(
        "--timeout-s", type=positive_float, default=DEFAULT_TIMEOUT_S, help="per request"
    )
    run_parser.add_argument("--cache", dest="cache_dir", type=Path, default=DEFAULT_CACHE_DIR)
    run_parser.add_argument(
        "--squad-file", type=Path, help="the set `prepare --squad-file` indexed (default: dev)"
    )
    run_parser.add_argument(
        "--collection", help="ask this collection (default: the service's, `default`)"
    )
    run_parser.add_argument(
        "--out", dest="out_dir", type=Path, required=True, help="folder for the outputs"
    )
    run_parser.add_argument("--label", type=label, required=True, help="output file stem")
    return parser


def main(argv: Sequence[str] | None = None, *, client: httpx.Client | None = None) -> int:
    """CLI entry point; `client` replaces the HTTP client `run` would open (for tests)."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    # httpx logs every request at INFO; the sweep logs its own line per request.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        if args.command == "prepare":
            return _main_prepare(args)
        return _main_run(args, client)
    except (QualityError, SquadFetchError, SquadFormatError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _main_prepare(args: argparse.Namespace) -> int:
    result = prepare(args.cache, args.index, squad_file=args.squad_file)
    manifest = result.manifest
    print(f"dev set: {result.squad_path}")
    print(f"corpus:  {result.corpus_path}")
    if result.build_command is None:
        print(f"index:   {result.index_dir} (already built; delete it to rebuild)")
    else:
        print(f"index:   {result.index_dir} (built in {result.build_s:.1f} s)")
        print(f"command: {shlex.join(result.build_command)}")
    print(
        f"manifest: {manifest.get('extra', {}).get('num_documents')} documents, "
        f"{manifest.get('num_chunks')} chunks, {manifest.get('num_sentences')} sentences, "
        f"{manifest.get('index', {}).get('kind')} index, {manifest.get('embedding_model')}"
    )
    return 0


def _main_run(args: argparse.Namespace, client: httpx.Client | None) -> int:
    # The run's options are RunSettings' fields by name (the API key is not one: never kept).
    options = vars(args) | {"methods": tuple(args.methods)}
    settings = RunSettings(**{f.name: options[f.name] for f in fields(RunSettings)})
    written = with_client(
        args.url, args.timeout_s, client, lambda http: run_quality(settings, http, args.api_key)
    )
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
