"""Command line: start the service as shipped (only its port and collections root changed),
run the parts, write the results."""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench import ingestion
from bench.ingestion.inputs import load_passages
from bench.ingestion.parts import API_KEY, COLLECTION, phase_plan, run_parts
from bench.ingestion.report import build_document, git_state, markdown
from bench.outputs import label, positive_float, positive_int, write_json_and_markdown
from bench.squad import DEFAULT_CACHE_DIR, SQUAD_DEV_FILENAME
from harness.service import ROOT, free_port, started_service
from harness.variant import write_variant

DEFAULT_OUT = Path("bench-results/ingestion")
READY_TIMEOUT_S = 420.0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.ingestion", description=(ingestion.__doc__ or "").splitlines()[0]
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--label", type=label, default="ingestion")
    parser.add_argument("--base", type=Path, default=ROOT / "serve_config.yaml")
    parser.add_argument("--corpus", type=Path, default=ROOT / "data/corpus")
    parser.add_argument(
        "--squad-file", type=Path, default=ROOT / DEFAULT_CACHE_DIR / SQUAD_DEV_FILENAME
    )
    parser.add_argument(
        "--collections-root",
        type=Path,
        default=None,
        help="where the service keeps collections (default: a temporary "
        "folder, removed afterwards)",
    )
    parser.add_argument("--adds", type=positive_int, default=20)
    parser.add_argument("--add-timeout-s", type=positive_float, default=120.0)
    parser.add_argument("--delete-queries", type=positive_int, default=1000)
    parser.add_argument("--delete-precheck", type=positive_int, default=20)
    parser.add_argument("--delete-concurrency", type=positive_int, default=4)
    parser.add_argument("--phases", type=positive_int, default=4)
    parser.add_argument("--phase-s", type=positive_float, default=150.0)
    parser.add_argument(
        "--warm-up-s",
        type=float,
        default=60.0,
        help="seconds of the same load before the phases, not counted (0: none)",
    )
    parser.add_argument(
        "--rate",
        type=positive_float,
        default=None,
        help="query arrivals per second (default: --rate-fraction of the measured capacity)",
    )
    parser.add_argument("--rate-fraction", type=positive_float, default=0.45)
    parser.add_argument("--docs-per-job", type=positive_int, default=20)
    parser.add_argument("--calibrate-queries", type=positive_int, default=12)
    parser.add_argument("--capacity-queries", type=positive_int, default=32)
    parser.add_argument("--calibrate-concurrency", type=positive_int, default=4)
    parser.add_argument(
        "--load-questions",
        choices=["distinct", "repeated"],
        default="distinct",
        help="the steady load's questions: one per corpus sentence (no prompt recurs), or "
        "bench.questions' few, repeated (whole prompts cached while nothing changes)",
    )
    parser.add_argument("--max-tokens", type=positive_int, default=2)
    parser.add_argument("--hung-s", type=positive_float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    arguments = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(arguments)
    phase_plan(args.phases)  # at least one phase of each condition

    from app.config import parse_config
    from harness.variant import first_application
    from retrieval.documents import load_documents

    passages_kind, passages = load_passages(args.corpus, args.squad_file)
    app_config = parse_config(first_application(args.base)[1].get("args") or {})
    config = {
        "command": shlex.join(["python", "-m", "bench.ingestion", *arguments]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "git": git_state(),
        "cpu_count": os.cpu_count(),
        "load_average_start": list(os.getloadavg()),
        "base": str(args.base.relative_to(ROOT) if args.base.is_relative_to(ROOT) else args.base),
        "model": app_config.generator.model_id,
        "collection": COLLECTION,
        "corpus": str(args.corpus.relative_to(ROOT) if args.corpus.is_absolute() else args.corpus),
        "corpus_documents": len(load_documents(args.corpus)),
        "passages": f"{len(passages):,} {passages_kind}",
        **{
            key: value
            for key, value in vars(args).items()
            if key not in ("out", "base", "corpus", "squad_file", "collections_root")
        },
    }
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-ingestion-") as scratch:
        root = args.collections_root or Path(scratch) / "collections"
        port = free_port()
        serve_config = write_variant(
            args.base, {"collections.root": str(root)}, args.out / f"{args.label}.yaml", port
        )
        log = args.out / f"{args.label}.serve.log"
        with started_service(
            serve_config, port, log, {"RAG_API_KEYS": API_KEY}, ready_timeout_s=READY_TIMEOUT_S
        ) as service:
            print(
                f"service ready at {service.base_url} after {time.monotonic() - started:.0f} s",
                flush=True,
            )
            measured = asyncio.run(run_parts(service.base_url, args, passages))
    duration_s = time.monotonic() - started
    config["load_average_end"] = list(os.getloadavg())
    document = build_document(measured, config, args.seed, duration_s)
    text = markdown(document)
    for path in write_json_and_markdown(args.out, args.label, document, text):
        print(path)
    print(text)
    return 0
