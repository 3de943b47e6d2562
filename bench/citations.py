"""Citation precision lab: does an answer's top citation point at the text holding the answer?

    python -m bench.citations run --url http://127.0.0.1:8000 --out DIR [--api-key K] \\
        [--questions 120] [--seed 0] [--styles short explained] [--top-k 5]
    python -m bench.citations all --out DIR [...]   # start the SQuAD service, run, stop

SQuAD dev questions drawn with a seed (bench.squad.sample_questions) are asked once per
answer style, one request at a time, with include_context, citations on, top_k 5,
temperature 0 and the service's default compression. Per answer (bench.citations_report
scores it): the citations; invalid ones (a source_id that is not among the response's
sources, or a span outside its text); whether the top-scored citation's source span, sliced
from its passage in `context`, holds a gold answer (normalised as bench.squad_metrics does),
and whether its whole passage does; whether the context holds one at all (the ceiling);
timings_ms.attribute. The summary gives each proportion and the attribution's p50 with a 95%
bootstrap interval. Outputs: `<out>/<label>.json` (config, rows, summary) and
`<out>/<label>.md`.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from bench import labs
from bench.citations_report import (
    CitationRow,
    render_markdown,
    score_answer,
    score_reply,
    summarize,
)
from bench.client import (
    LabError,
    auth_headers,
    post_query,
    require_loopback,
    with_client,
)
from bench.labs import DEFAULT_BUDGET_S, DEFAULT_TIMEOUT_S, DEFAULT_TOP_K
from bench.outputs import positive_int, write_json_and_markdown
from bench.quality import DEFAULT_INDEX_DIR, check_ready
from bench.squad import (
    DEFAULT_CACHE_DIR,
    SQUAD_DEV_FILENAME,
    SquadQuestion,
    load_squad,
    sample_questions,
)
from harness.service import ROOT

logger = logging.getLogger(__name__)

STYLES = ("short", "explained")
# Enough for a span ("short") or a few sentences ("explained") from the CPU model.
DEFAULT_MAX_TOKENS = {"short": 32, "explained": 128}
DEFAULT_QUESTIONS = 120
WARM_UP_QUESTION = "Which team won the game?"

Clock = Callable[[], float]


@dataclass(frozen=True)
class RunSettings:
    """What `run` was asked to do (the API key is not kept)."""

    url: str
    out_dir: Path
    squad_path: Path
    label: str = "citations"
    questions: int = DEFAULT_QUESTIONS
    seed: int = 0
    styles: tuple[str, ...] = ("short",)
    top_k: int = DEFAULT_TOP_K
    max_tokens: int | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    budget_s: float = DEFAULT_BUDGET_S

    def max_tokens_for(self, style: str) -> int:
        return self.max_tokens or DEFAULT_MAX_TOKENS[style]


def request_body(question: str, style: str, settings: RunSettings) -> dict[str, object]:
    """The /v1/rag/query body: no compression named, so the service's default applies."""
    return {
        "question": question,
        "answer_style": style,
        "top_k": settings.top_k,
        "include_context": True,
        "citations": True,
        "max_tokens": settings.max_tokens_for(style),
        "temperature": 0.0,
    }


def ask(
    client: httpx.Client,
    question: SquadQuestion,
    style: str,
    settings: RunSettings,
    headers: dict[str, str] | None,
) -> CitationRow:
    """Ask one question in one style and score the reply; a failure is recorded."""
    row = CitationRow(
        question_id=question.question_id,
        style=style,
        question=question.question,
        gold_answers=list(question.gold_answers),
        gold_doc_id=question.paragraph_id,
    )
    outcome = post_query(
        client, request_body(question.question, style, settings), settings.timeout_s, headers
    )
    row.status_code, row.client_ms, row.error = (
        outcome.status_code,
        outcome.client_ms,
        outcome.error,
    )
    if outcome.reply is not None:
        if outcome.reply.context is None:
            row.error = "response has no 'context'; the service ignores include_context"
        else:
            score_reply(row, outcome.reply, settings.top_k)
    return row


def run_questions(
    client: httpx.Client,
    questions: Sequence[SquadQuestion],
    known_doc_ids: set[str],
    settings: RunSettings,
    headers: dict[str, str] | None = None,
    clock: Clock = time.monotonic,
) -> tuple[list[CitationRow], int]:
    """Each question in each style while the time budget lasts (checked before each
    question); returns the rows and how many questions were asked. LabError at the first
    answer whose sources are not SQuAD paragraphs."""
    deadline = clock() + settings.budget_s
    rows: list[CitationRow] = []
    checked_index = False
    asked = 0
    for question in questions:
        if clock() >= deadline:
            logger.warning("time budget spent after %d of %d questions", asked, len(questions))
            break
        for style in settings.styles:
            row = ask(client, question, style, settings, headers)
            rows.append(row)
            if row.error is None and not checked_index and row.source_doc_ids:
                checked_index = True
                if not known_doc_ids.intersection(row.source_doc_ids):
                    raise LabError(
                        f"the service's sources are not SQuAD paragraphs (got "
                        f"{row.source_doc_ids[:3]}); serve indexes/squad-dev "
                        "(retriever.index_path)"
                    )
            logger.info(
                "[%d/%d] %s %s: %s",
                asked + 1,
                len(questions),
                question.question_id,
                style,
                row.error
                or f"{row.citation_count} citations, top span gold {row.top_span_has_gold}",
            )
        asked += 1
    return rows, asked


def run_lab(
    settings: RunSettings,
    client: httpx.Client,
    api_key: str | None = None,
    clock: Clock = time.monotonic,
) -> list[Path]:
    """Sample the questions, check the service is ready, warm up, ask, write the outputs."""
    if not settings.squad_path.is_file():
        raise LabError(f"{settings.squad_path} not found; run `python -m bench.quality prepare`")
    squad = load_squad(settings.squad_path)
    questions = sample_questions(squad, settings.questions, settings.seed)
    headers = auth_headers(api_key)
    check_ready(client, settings.timeout_s)
    started = labs.started_now()
    # Uncounted: the engine's warm-up and each style's system prompt into the prefix cache.
    warm_up_errors = [
        post_query(
            client, request_body(WARM_UP_QUESTION, style, settings), settings.timeout_s, headers
        ).error
        for style in settings.styles
    ]
    rows, asked = run_questions(
        client, questions, {p.paragraph_id for p in squad.paragraphs}, settings, headers, clock
    )
    summary = summarize(rows, settings.styles)
    doc = labs.document(
        settings,
        started,
        {
            "questions_sampled": len(questions),
            "questions_asked": asked,
            "budget_spent": asked < len(questions),
            "question_ids": [q.question_id for q in questions],
            "max_tokens_per_style": {s: settings.max_tokens_for(s) for s in settings.styles},
            "warm_up_errors": warm_up_errors,
        },
        [asdict(s) for s in summary],
        rows,
    )
    return write_json_and_markdown(
        settings.out_dir, settings.label, doc, render_markdown(doc["config"], summary)
    )


# --- CLI -------------------------------------------------------------------------------------


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, required=True, help="folder for the outputs")
    labs.add_request_arguments(parser, "citations", "all questions")
    parser.add_argument(
        "--squad-file",
        type=Path,
        default=DEFAULT_CACHE_DIR / SQUAD_DEV_FILENAME,
        help="SQuAD-format JSON (default: the dev set `bench.quality prepare` cached)",
    )
    parser.add_argument("--questions", type=positive_int, default=DEFAULT_QUESTIONS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--styles", nargs="+", choices=STYLES, default=["short"])
    parser.add_argument(
        "--max-tokens", type=positive_int, default=None, help="default: short 32, explained 128"
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.citations", description=__doc__.splitlines()[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="measure a running service")
    run.add_argument("--url", default="http://127.0.0.1:8000")
    _add_run_arguments(run)
    report = commands.add_parser("report", help="re-score and re-render a run's JSON")
    report.add_argument("results", type=Path, help="the <label>.json a run wrote")
    everything = commands.add_parser("all", help="start the SQuAD service, run, stop")
    _add_run_arguments(everything)
    everything.add_argument("--base-config", type=Path, default=ROOT / "serve_config.yaml")
    everything.add_argument("--index", type=Path, default=DEFAULT_INDEX_DIR)
    return parser


def main(argv: Sequence[str] | None = None, *, client: httpx.Client | None = None) -> int:
    """CLI entry point; `client` replaces the HTTP client `run` would open (for tests)."""
    args = _parser().parse_args(argv)
    if args.command == "run":
        return labs.main_of(lambda: _run(args, args.url, client))
    if args.command == "report":
        return labs.main_of(lambda: rewrite_report(args.results))

    def everything() -> list[Path]:
        with labs.squad_service(args.base_config, args.out, "citations", args.index) as url:
            return _run(args, url, client)

    return labs.main_of(everything)


def rewrite_report(results: Path) -> list[Path]:
    """Re-score the answers of a run's JSON (EM/F1 included) and write its outputs again."""
    document = json.loads(results.read_text(encoding="utf-8"))
    config = document["config"]
    rows = [CitationRow(**row) for row in document["results"]]
    for row in rows:
        score_answer(row)
    summary = summarize(rows, config["styles"])
    document = {
        "config": config,
        "summary": [asdict(s) for s in summary],
        "results": [asdict(r) for r in rows],
    }
    return write_json_and_markdown(
        results.parent, results.stem, document, render_markdown(config, summary)
    )


def _run(args: argparse.Namespace, url: str, client: httpx.Client | None) -> list[Path]:
    settings = RunSettings(
        url=require_loopback(url),
        out_dir=args.out,
        squad_path=args.squad_file,
        label=args.label,
        questions=args.questions,
        seed=args.seed,
        styles=tuple(dict.fromkeys(args.styles)),
        top_k=args.top_k,
        max_tokens=args.max_tokens,
        timeout_s=args.timeout_s,
        budget_s=args.budget_s,
    )
    return with_client(
        url, args.timeout_s, client, lambda http: run_lab(settings, http, args.api_key)
    )


if __name__ == "__main__":
    sys.exit(main())
