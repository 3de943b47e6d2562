"""Follow-up retrieval lab: does the service find the gold paragraph of a follow-up question?

    python -m bench.conversation build [--squad-file F] --n 120 --seed 0 --out pairs.json
    python -m bench.conversation run --url http://127.0.0.1:8000 --pairs pairs.json --out DIR \\
        [--api-key K] [--top-k 5] [--modes full last join rewrite] [--budget-s 3600]
    python -m bench.conversation all --out DIR [--n 120 --seed 0]   # build, serve, run, stop

`build` draws pairs from SQuAD dev (bench.conversation_pairs): a first question Q1 and a
follow-up Q2' of the same paragraph where an entity of Q2 became a pronoun. `run` sends each
pair under four conditions, in a seeded random order per pair (so no condition always
follows another into the prefix cache): `full` (Q2 as written, no history), then Q2' after
the history [Q1, Q1's first gold answer] with `retrieval_query` `last`, `join` and
`rewrite`. Every request asks for one token (retrieval is measured, not the answer), top_k
chunks, no compression, no context and no citations. Before the pairs, two warm-up requests
(one with a rewrite) put both static system prompts in the prefix cache; they are not
counted.

Per request: whether the gold paragraph is among the sources (recall@k) and its rank, the
retrieval query the service used (and whether a rewrite fell back to the join), timings_ms
(retrieve, rewrite, ttft, total) and cached_prompt_tokens. The summary gives recall@k per
condition with a 95% bootstrap interval, the paired differences join−full, rewrite−full,
last−full and rewrite−join (same pairs on both sides), the rewrite's cost (p50 of
timings_ms.rewrite; the paired TTFT and total differences rewrite − join), and the share of
follow-up requests with cached prompt tokens. An interval that holds 0 is "no detectable
difference". Outputs: `<out>/<label>.json` (config, per-request rows, summary) and
`<out>/<label>.md`.
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from app.schemas import RagQueryResponse
from bench import labs
from bench.client import (
    LabError,
    auth_headers,
    post_query,
    require_loopback,
    with_client,
)
from bench.conversation_pairs import (
    HISTORY_NOTE,
    FollowUpPair,
    PairSet,
    build_pairs,
    from_squad_index,
    load_pairs,
    write_pairs,
)
from bench.conversation_report import render_markdown, summarize
from bench.labs import DEFAULT_BUDGET_S, DEFAULT_TIMEOUT_S, DEFAULT_TOP_K
from bench.outputs import positive_int, write_json_and_markdown
from bench.quality import DEFAULT_INDEX_DIR, check_ready
from bench.squad import DEFAULT_CACHE_DIR, SQUAD_DEV_FILENAME, load_squad
from bench.squad_metrics import document_id
from harness.service import ROOT

logger = logging.getLogger(__name__)

CONDITIONS = ("full", "last", "join", "rewrite")
FOLLOW_UP_CONDITIONS = ("last", "join", "rewrite")
# A question about the docs corpus is fine too: the warm-up only fills the prefix cache.
WARM_UP_HISTORY = [
    {"role": "user", "content": "Who won the game?"},
    {"role": "assistant", "content": "The home team."},
]
WARM_UP_QUESTION = "When was it played?"

Clock = Callable[[], float]


@dataclass(frozen=True)
class RunSettings:
    """What `run` was asked to do (the API key is not kept)."""

    url: str
    pairs_path: Path
    out_dir: Path
    label: str = "conversation"
    conditions: tuple[str, ...] = CONDITIONS
    top_k: int = DEFAULT_TOP_K
    timeout_s: float = DEFAULT_TIMEOUT_S
    budget_s: float = DEFAULT_BUDGET_S
    order_seed: int = 0


@dataclass
class ConditionResult:
    """One pair under one condition; measured fields are None when the request failed."""

    pair_id: str
    condition: str
    position: int
    question: str
    gold_doc_id: str
    status_code: int | None = None
    error: str | None = None
    client_ms: float | None = None
    applied_mode: str | None = None
    retrieval_text: str | None = None
    rewrite_failed: bool | None = None
    recall: float | None = None
    gold_rank: int | None = None
    source_doc_ids: list[str] = field(default_factory=list)
    retrieve_ms: float | None = None
    rewrite_ms: float | None = None
    ttft_ms: float | None = None
    total_ms: float | None = None
    prompt_tokens: int | None = None
    cached_prompt_tokens: int | None = None
    history_turns_used: int | None = None

    @property
    def answered(self) -> bool:
        return self.error is None


def request_body(pair: FollowUpPair, condition: str, top_k: int) -> dict[str, Any]:
    """The /v1/rag/query body of `pair` under `condition`."""
    body: dict[str, Any] = {
        "top_k": top_k,
        "compression": {"method": "none"},
        "max_tokens": 1,
        "temperature": 0.0,
        "include_context": False,
        "citations": False,
    }
    if condition == "full":
        return {**body, "question": pair.question, "retrieval_query": "last"}
    if condition not in FOLLOW_UP_CONDITIONS:
        raise ValueError(f"unknown condition {condition!r}")
    return {
        **body,
        "question": pair.follow_up,
        "history": pair.history(),
        "retrieval_query": condition,
    }


def gold_rank(source_doc_ids: Sequence[str], gold_doc_id: str) -> int | None:
    """The 1-based rank of the first source from the gold paragraph, None if none is."""
    for rank, doc_id in enumerate(source_doc_ids, start=1):
        if document_id(doc_id) == gold_doc_id:
            return rank
    return None


def query_condition(
    client: httpx.Client,
    pair: FollowUpPair,
    condition: str,
    position: int,
    settings: RunSettings,
    headers: dict[str, str] | None,
) -> ConditionResult:
    """Send `pair` under `condition` once and record what came back; errors are data."""
    body = request_body(pair, condition, settings.top_k)
    result = ConditionResult(
        pair_id=pair.pair_id,
        condition=condition,
        position=position,
        question=body["question"],
        gold_doc_id=pair.paragraph_id,
    )
    outcome = post_query(client, body, settings.timeout_s, headers)
    result.status_code, result.client_ms, result.error = (
        outcome.status_code,
        outcome.client_ms,
        outcome.error,
    )
    if outcome.reply is not None:
        _record(result, outcome.reply, settings.top_k)
    return result


def _record(result: ConditionResult, reply: RagQueryResponse, top_k: int) -> None:
    result.source_doc_ids = [source.doc_id for source in reply.sources]
    result.gold_rank = gold_rank(result.source_doc_ids, result.gold_doc_id)
    result.recall = float(result.gold_rank is not None and result.gold_rank <= top_k)
    if reply.retrieval_query is not None:  # left out by a service without conversations
        result.applied_mode = reply.retrieval_query.mode
        result.retrieval_text = reply.retrieval_query.text
        result.rewrite_failed = reply.retrieval_query.rewrite_failed
    timings = reply.timings_ms
    result.retrieve_ms, result.rewrite_ms = timings.retrieve, timings.rewrite
    result.ttft_ms, result.total_ms = timings.ttft, timings.total
    result.prompt_tokens = reply.usage.prompt_tokens
    result.cached_prompt_tokens = reply.usage.cached_prompt_tokens
    result.history_turns_used = reply.history_turns_used


def warm_up(
    client: httpx.Client, settings: RunSettings, headers: dict[str, str] | None
) -> list[str | None]:
    """One plain request and one with a rewrite, uncounted: the first requests after a
    start pay the engine's warm-up, and they put both system prompts in the prefix cache.
    Returns their errors (None for each that succeeded)."""
    base = {"top_k": settings.top_k, "max_tokens": 1, "citations": False}
    bodies = [
        {**base, "question": WARM_UP_QUESTION},
        {**base, "question": WARM_UP_QUESTION, "history": WARM_UP_HISTORY},
    ]
    if "rewrite" in settings.conditions:
        bodies[1]["retrieval_query"] = "rewrite"
    return [post_query(client, body, settings.timeout_s, headers).error for body in bodies]


def run_pairs(
    client: httpx.Client,
    pair_set: PairSet,
    settings: RunSettings,
    headers: dict[str, str] | None = None,
    clock: Clock = time.monotonic,
) -> tuple[list[ConditionResult], int]:
    """Every pair under every condition, one request at a time, while the time budget lasts
    (checked before each pair, so a started pair is finished); returns the rows and how many
    pairs were sent. LabError at the first answer whose sources are not SQuAD paragraphs."""
    deadline = clock() + settings.budget_s
    order_rng = random.Random(settings.order_seed)
    results: list[ConditionResult] = []
    checked_index = False
    sent = 0
    for pair in pair_set.pairs:
        if clock() >= deadline:
            logger.warning(
                "time budget of %.0f s spent after %d of %d pairs",
                settings.budget_s,
                sent,
                len(pair_set.pairs),
            )
            break
        order = list(settings.conditions)
        order_rng.shuffle(order)
        for position, condition in enumerate(order):
            result = query_condition(client, pair, condition, position, settings, headers)
            results.append(result)
            if result.answered and not checked_index and result.source_doc_ids:
                checked_index = True
                if not from_squad_index(result.source_doc_ids, pair_set.articles):
                    raise LabError(
                        f"the service's sources are not SQuAD paragraphs (got "
                        f"{result.source_doc_ids[:3]}); serve indexes/squad-dev "
                        "(retriever.index_path)"
                    )
            logger.info(
                "[pair %d/%d] %s %s: %s",
                sent + 1,
                len(pair_set.pairs),
                pair.pair_id,
                condition,
                result.error
                or f"rank {result.gold_rank}, {result.applied_mode}, TTFT {result.ttft_ms} ms",
            )
        sent += 1
    return results, sent


def run_lab(
    settings: RunSettings,
    client: httpx.Client,
    api_key: str | None = None,
    clock: Clock = time.monotonic,
) -> list[Path]:
    """Load the pairs, check the service is ready, warm up, run them, write `<label>.json`
    and `<label>.md`. LabError or QualityError (not ready) stop it before any output."""
    pair_set = load_pairs(settings.pairs_path)
    headers = auth_headers(api_key)
    check_ready(client, settings.timeout_s)
    started = labs.started_now()
    warm_up_errors = warm_up(client, settings, headers)
    results, pairs_sent = run_pairs(client, pair_set, settings, headers, clock)
    summary = summarize(results, settings.conditions, settings.top_k)
    doc = labs.document(
        settings,
        started,
        {
            "pairs": len(pair_set.pairs),
            "pairs_sent": pairs_sent,
            "budget_spent": pairs_sent < len(pair_set.pairs),
            "pair_seed": pair_set.seed,
            "history_note": HISTORY_NOTE,
            "request": {
                "max_tokens": 1,
                "compression": {"method": "none"},
                "include_context": False,
                "citations": False,
            },
            "warm_up_errors": warm_up_errors,
        },
        asdict(summary),
        results,
    )
    return write_json_and_markdown(
        settings.out_dir, settings.label, doc, render_markdown(doc["config"], summary)
    )


# --- CLI -------------------------------------------------------------------------------------


def _add_build_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--squad-file",
        type=Path,
        default=DEFAULT_CACHE_DIR / SQUAD_DEV_FILENAME,
        help="SQuAD-format JSON (default: the dev set `bench.quality prepare` cached)",
    )
    parser.add_argument("--n", type=positive_int, default=120, help="pairs to draw")
    parser.add_argument("--seed", type=int, default=0)


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    labs.add_request_arguments(parser, "conversation", "all the pairs")
    parser.add_argument("--modes", nargs="+", choices=CONDITIONS, default=list(CONDITIONS))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.conversation", description=__doc__.splitlines()[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="draw the follow-up pairs from SQuAD")
    _add_build_arguments(build)
    build.add_argument("--out", type=Path, required=True, help="pair file (JSON) to write")

    run = commands.add_parser("run", help="measure a running service on the pairs")
    run.add_argument("--url", default="http://127.0.0.1:8000")
    run.add_argument("--pairs", type=Path, required=True)
    run.add_argument("--out", type=Path, required=True, help="folder for the outputs")
    _add_run_arguments(run)

    everything = commands.add_parser("all", help="build, start the SQuAD service, run, stop")
    _add_build_arguments(everything)
    _add_run_arguments(everything)
    everything.add_argument("--out", type=Path, required=True, help="folder for everything")
    everything.add_argument("--base-config", type=Path, default=ROOT / "serve_config.yaml")
    everything.add_argument("--index", type=Path, default=DEFAULT_INDEX_DIR)
    return parser


def main(argv: Sequence[str] | None = None, *, client: httpx.Client | None = None) -> int:
    """CLI entry point; `client` replaces the HTTP client `run` would open (for tests)."""
    args = _parser().parse_args(argv)
    if args.command == "build":
        return labs.main_of(lambda: [_build(args.squad_file, args.n, args.seed, args.out)])
    if args.command == "run":
        return labs.main_of(lambda: _run(args, args.url, args.pairs, args.out, client))

    def everything() -> list[Path]:
        args.out.mkdir(parents=True, exist_ok=True)
        pairs_path = _build(args.squad_file, args.n, args.seed, args.out / "pairs.json")
        with labs.squad_service(args.base_config, args.out, "conversation", args.index) as url:
            return _run(args, url, pairs_path, args.out, client)

    return labs.main_of(everything)


def _build(squad_file: Path, n: int, seed: int, out: Path) -> Path:
    if not squad_file.is_file():
        raise LabError(f"{squad_file} not found; run `python -m bench.quality prepare`")
    pair_set = build_pairs(load_squad(squad_file), n, seed)
    if len(pair_set.pairs) < n:
        logger.warning("only %d pairs of the %d asked for exist", len(pair_set.pairs), n)
    return write_pairs(replace(pair_set, squad_path=str(squad_file)), out)


def _run(
    args: argparse.Namespace,
    url: str,
    pairs_path: Path,
    out_dir: Path,
    client: httpx.Client | None,
) -> list[Path]:
    settings = RunSettings(
        url=require_loopback(url),
        pairs_path=pairs_path,
        out_dir=out_dir,
        label=args.label,
        conditions=tuple(dict.fromkeys(args.modes)),
        top_k=args.top_k,
        timeout_s=args.timeout_s,
        budget_s=args.budget_s,
    )
    return with_client(
        url, args.timeout_s, client, lambda http: run_lab(settings, http, args.api_key)
    )


if __name__ == "__main__":
    sys.exit(main())
