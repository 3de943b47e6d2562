"""Latency lab: streaming load against a running service, with `vllm bench serve`'s figures.

    python -m bench.latency --url http://127.0.0.1:8000 [--api-key K] --endpoint rag|chat \\
        (--rate R | --concurrency C) --num-requests N --max-tokens M [--top-k K] \\
        [--compression none|sentences|llmlingua|sentences+llmlingua] [--rate-keep 0.5] \\
        [--questions FILE] [--first-question I] [--label NAME] \\
        [--slo-ttft-ms 5000 --slo-tpot-ms 200] --out DIR

Questions are taken in order, cycling, from FILE (one per line) or from a built-in list about
LLM serving that the default corpus in data/corpus/ answers. Writes DIR/<label>.json
(config, per-request records, summary), DIR/<label>.md (the summary table, also printed)
and DIR/<label>.advisor.json ({ttft_ms: p50, tpot_ms: p50, output_tokens_per_s}) for
`python -m advisor --bench-result`. Exits 1 when no request succeeded. The API key is
never written to the outputs. Definitions of every figure are in bench/stats.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.labs import label, positive_float, positive_int
from bench.loadgen import (
    DEFAULT_CHAT_MODEL,
    DEFAULT_REQUEST_TIMEOUT_S,
    ENDPOINTS,
    RequestRecord,
    RequestSpec,
    make_client,
    run_load,
)
from bench.questions import DEFAULT_QUESTIONS
from bench.stats import Summary, advisor_figures, summarize, summary_markdown
from prepare.methods import method_names


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.latency",
        description="Streaming load against the RAG service; TTFT, TPOT, ITL, E2E, goodput.",
    )
    parser.add_argument("--url", required=True, help="service base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--api-key", help="sent as Authorization: Bearer <key>; never written")
    parser.add_argument("--endpoint", choices=ENDPOINTS, default="rag")
    parser.add_argument("--model", default=DEFAULT_CHAT_MODEL, help="model id (chat endpoint)")
    arrivals = parser.add_mutually_exclusive_group(required=True)
    arrivals.add_argument("--rate", type=positive_float, help="Poisson arrivals, requests/s")
    arrivals.add_argument(
        "--concurrency", type=positive_int, help="requests in flight at all times"
    )
    parser.add_argument("--num-requests", type=positive_int, required=True)
    parser.add_argument("--max-tokens", type=positive_int, required=True)
    parser.add_argument("--top-k", type=positive_int)
    parser.add_argument("--compression", choices=method_names())
    parser.add_argument("--rate-keep", type=float, help="fraction of context tokens kept")
    parser.add_argument(
        "--policy",
        choices=["always", "auto"],
        help="compression policy (default: 'always' when --compression names a method)",
    )
    parser.add_argument("--questions", type=Path, help="file with one question per line")
    parser.add_argument(
        "--first-question", type=int, default=0, help="index of the first question used"
    )
    parser.add_argument("--label", type=label, help="output file stem (default: from the settings)")
    parser.add_argument("--slo-ttft-ms", type=positive_float, default=5000.0)
    parser.add_argument("--slo-tpot-ms", type=positive_float, default=200.0)
    parser.add_argument("--seed", type=int, default=0, help="seed of the Poisson gaps")
    parser.add_argument(
        "--request-timeout-s", type=positive_float, default=DEFAULT_REQUEST_TIMEOUT_S,
        help="limit on one request, send to end of stream",
    )  # fmt: skip
    parser.add_argument(
        "--deadline-s", type=positive_float, default=3600.0,
        help="limit on the whole run; requests not sent by then are recorded as not sent",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI on `argv` (sys.argv when None). 0 when at least one request succeeded,
    1 when every request failed; bad arguments exit 2 through argparse."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.rate_keep is not None and not 0 < args.rate_keep <= 1:
        parser.error(f"--rate-keep must be in (0, 1], got {args.rate_keep}")
    try:
        questions = load_questions(args.questions) if args.questions else DEFAULT_QUESTIONS
    except (ValueError, OSError) as error:
        parser.error(str(error))
    label = args.label or default_label(args)
    specs = build_specs(args, questions)
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    records = asyncio.run(_run(args, specs))
    summary = summarize(records, slo_ttft_ms=args.slo_ttft_ms, slo_tpot_ms=args.slo_tpot_ms)
    table = summary_markdown(summary)
    config = _config(args, label, len(questions), started_at)
    paths = write_outputs(args.out, label, config, records, summary)
    print(f"## {label}\n\n{table}\n")
    print("wrote " + ", ".join(str(path) for path in paths))
    if summary.succeeded == 0:
        print(f"error: every request failed: {summary.errors}", file=sys.stderr)
        return 1
    return 0


def load_questions(path: Path) -> tuple[str, ...]:
    """Non-blank lines of `path`, stripped; ValueError when there are none."""
    questions = tuple(line.strip() for line in path.read_text().splitlines() if line.strip())
    if not questions:
        raise ValueError(f"{path}: no questions")
    return questions


def build_specs(args: argparse.Namespace, questions: Sequence[str]) -> list[RequestSpec]:
    """`args.num_requests` requests, cycling through `questions` in order from the
    `args.first_question`-th (so two load points of one service can avoid sending the same
    prompt twice, which the prefix cache would answer)."""
    first = getattr(args, "first_question", 0)
    return [
        RequestSpec(
            endpoint=args.endpoint,
            question=questions[(first + i) % len(questions)],
            max_tokens=args.max_tokens,
            top_k=args.top_k,
            compression_method=args.compression,
            compression_rate=args.rate_keep,
            # A named method is measured as such, whatever the service's default policy.
            compression_policy=args.policy or ("always" if args.compression else None),
            model=args.model,
        )
        for i in range(args.num_requests)
    ]


def default_label(args: argparse.Namespace) -> str:
    """E.g. `rag-c4-sentences` or `chat-r0.5-default`."""
    load = f"r{args.rate:g}" if args.rate is not None else f"c{args.concurrency}"
    method = args.compression or "default"
    keep = f"-keep{args.rate_keep:g}" if args.rate_keep is not None else ""
    return f"{args.endpoint}-{load}-{method}{keep}"


def write_outputs(
    out_dir: Path,
    label: str,
    config: dict[str, Any],
    records: Sequence[RequestRecord],
    summary: Summary,
) -> list[Path]:
    """Write <label>.json, <label>.md and, when any figure was measured, <label>.advisor.json
    under `out_dir`; the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    result = {
        "config": config,
        "summary": summary.to_dict(),
        "records": [asdict(record) for record in records],
    }
    paths = [out_dir / f"{label}.json", out_dir / f"{label}.md"]
    paths[0].write_text(json.dumps(result, indent=2) + "\n")
    paths[1].write_text(f"# {label}\n\n{_config_line(config)}\n\n{summary_markdown(summary)}\n")
    figures = advisor_figures(summary)
    if figures:
        paths.append(out_dir / f"{label}.advisor.json")
        paths[2].write_text(json.dumps(figures, indent=2) + "\n")
    return paths


async def _run(args: argparse.Namespace, specs: Sequence[RequestSpec]) -> list[RequestRecord]:
    async with make_client(
        args.url, api_key=args.api_key, request_timeout_s=args.request_timeout_s
    ) as client:
        return await run_load(
            client,
            specs,
            rate_per_s=args.rate,
            concurrency=args.concurrency,
            seed=args.seed,
            request_timeout_s=args.request_timeout_s,
            deadline_s=args.deadline_s,
        )


def _config(
    args: argparse.Namespace, label: str, question_count: int, started_at: str
) -> dict[str, Any]:
    config = {
        key: str(value) if isinstance(value, Path) else value
        for key, value in vars(args).items()
        if key != "api_key"
    }
    config.update(
        label=label,
        api_key_set=bool(args.api_key),
        question_count=question_count,
        started_at=started_at,
    )
    return config


def _config_line(config: dict[str, Any]) -> str:
    load = (
        f"Poisson {config['rate']:g} req/s"
        if config["rate"] is not None
        else f"concurrency {config['concurrency']}"
    )
    return (
        f"{config['endpoint']} endpoint at {config['url']}, {load}, "
        f"{config['num_requests']} requests, max_tokens {config['max_tokens']}, "
        f"top_k {config['top_k'] or 'default'}, compression {config['compression'] or 'default'}"
        f"{'' if config['rate_keep'] is None else ' keep ' + format(config['rate_keep'], 'g')}"
    )


if __name__ == "__main__":
    sys.exit(main())
