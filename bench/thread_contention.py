"""How much a background embedding thread slows the query path's CPU work, by its priority.

    python -m bench.thread_contention [--seconds 20] [--out docs/results/thread-contention]

Why: on two cores, ingestion jobs at nice 10 still slowed queries under continuous
ingestion (bench.ingestion run 3: p99 2.22x; under SCHED_IDLE, run 4: 0.94x). One suspected
mechanism: vLLM's CPU forward pass runs one OpenMP thread per core, each op waiting at a
barrier for the slowest, so a background thread taking a slice of either core stalls the
whole pass, and a nice value only shrinks the slice. This looks for it without the service.

- Probe (the query path's CPU work): the retriever's embedder (all-MiniLM-L6-v2, from its
  PyPI package) encoding one batch of 8 long questions again and again for `--seconds`,
  with torch at 1 thread (a stage like the retriever) and at 2 threads (one per core, as
  vLLM's forward pass runs).
- Background (an ingestion job at job_cpu_share 1): a second process embedding batches of
  32 chunk-length texts without pause on one thread, lowered by the writer's own code
  (corpus.job_thread.lower_this_thread) to nice 10 or SCHED_IDLE.
- Conditions per probe width, in the order alone, nice 10, SCHED_IDLE, alone (the two alone
  runs pooled, so a drift over the run falls on the baseline too). Each probe and writer is
  its own process, started and stopped here by its process id.

Reported: probe calls n, median ms, and each condition's median over alone's, with a 95%
bootstrap interval (bench.bootstrap.ratio_ci; calls are resampled as independent, which
they nearly are). Writes OUT/contention.json and OUT/contention.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from bench.bootstrap import ratio_ci
from bench.outputs import positive_float, write_json_and_markdown
from harness.service import ROOT, stop_process

QUESTION = "How does prefix caching lower the time to the first token of an answer? " * 20
CHUNK = ("Retrieved chunks are embedded and indexed; a job embeds each new one. " * 6)[:400]
CONDITIONS = ("alone", "nice", "idle", "alone")
WRITER_WARM_UP_S = 8.0


def _embedder(threads: int):
    import torch

    torch.set_num_threads(threads)
    from retrieval.embedding import Embedder
    from retrieval.models import DEFAULT_EMBEDDING_MODEL, resolve_model_reference

    return Embedder.load(resolve_model_reference(DEFAULT_EMBEDDING_MODEL, ROOT))


def run_writer(scheduling: str) -> None:
    """Embed without pause on one thread lowered as the collection writer lowers its own."""
    from corpus.job_thread import Scheduling, lower_this_thread

    embedder = _embedder(1)
    texts = [CHUNK] * 32

    def work() -> None:
        print(lower_this_thread(cast(Scheduling, scheduling), 10), flush=True)
        while True:
            embedder.encode(texts)

    threading.Thread(target=work, daemon=True).start()
    while True:
        time.sleep(3600)


def run_probe(threads: int, seconds: float) -> list[float]:
    embedder = _embedder(threads)
    batch = [QUESTION] * 8
    for _ in range(3):
        embedder.encode(batch)
    times: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        started = time.perf_counter()
        embedder.encode(batch)
        times.append((time.perf_counter() - started) * 1000)
    return times


def _child(*argv: str) -> list[str]:
    return [sys.executable, "-m", "bench.thread_contention", *argv]


def _env() -> dict[str, str]:
    return {**os.environ, "TOKENIZERS_PARALLELISM": "false"}


def measure(threads: int, condition: str, seconds: float) -> list[float]:
    writer = None
    if condition != "alone":
        writer = subprocess.Popen(
            _child("--role", "writer", "--scheduling", condition),
            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        time.sleep(WRITER_WARM_UP_S)
    try:
        probe = subprocess.run(
            _child("--role", "probe", "--threads", str(threads), "--seconds", str(seconds)),
            env=_env(), capture_output=True, text=True, check=True,
        )  # fmt: skip
    finally:
        if writer is not None:
            stop_process(writer)
    return json.loads(probe.stdout.strip().splitlines()[-1])


def summarise(samples: dict[int, dict[str, list[float]]]) -> list[dict[str, Any]]:
    rows = []
    for threads, by_condition in samples.items():
        alone = by_condition["alone"]
        for condition in ("alone", "nice", "idle"):
            values = by_condition[condition]
            row: dict[str, Any] = {
                "threads": threads, "condition": condition, "n": len(values),
                "median_ms": statistics.median(values),
            }  # fmt: skip
            if condition != "alone":
                interval = ratio_ci(values, alone)
                row["ratio"] = {"estimate": interval.estimate, "low": interval.low,
                                "high": interval.high}  # fmt: skip
            rows.append(row)
    return rows


LABELS = {"alone": "alone", "nice": "writer at nice 10", "idle": "writer at SCHED_IDLE"}


def markdown(rows: Sequence[dict[str, Any]], seconds: float, command: str) -> str:
    lines = [
        "# A background embedding thread against the query path's CPU work",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs. "
        f"Probe: all-MiniLM-L6-v2 encoding 8 long questions, {seconds:g} s per condition; "
        "writer: one thread embedding 32 chunks a batch without pause. Ratio: the probe's "
        "median over its median alone (the two alone runs pooled), 95% bootstrap interval.",
        "",
        "| probe threads | condition | n | median ms | / alone [95% CI] |",
        "|---:|---|---:|---:|---|",
    ]
    for row in rows:
        ratio = row.get("ratio")
        shown = (
            f"{ratio['estimate']:.2f}x [{ratio['low']:.2f}, {ratio['high']:.2f}]"
            + (": no detectable difference" if ratio["low"] <= 1 <= ratio["high"] else "")
            if ratio
            else "-"
        )
        lines.append(
            f"| {row['threads']} | {LABELS[row['condition']]} | {row['n']} | "
            f"{row['median_ms']:,.1f} | {shown} |"
        )
    return "\n".join([*lines, "", f"Command: `{command}`", ""])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.thread_contention")
    parser.add_argument("--role", choices=("lab", "probe", "writer"), default="lab")
    parser.add_argument("--scheduling", choices=("nice", "idle"), default="idle")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seconds", type=positive_float, default=20.0)
    parser.add_argument("--out", type=Path, default=Path("bench-results/thread-contention"))
    args = parser.parse_args(argv)
    if args.role == "writer":
        run_writer(args.scheduling)
        return 0
    if args.role == "probe":
        print(json.dumps(run_probe(args.threads, args.seconds)))
        return 0
    samples: dict[int, dict[str, list[float]]] = {}
    for threads in (1, 2):
        by_condition: dict[str, list[float]] = {"alone": [], "nice": [], "idle": []}
        for condition in CONDITIONS:
            by_condition[condition] += measure(threads, condition, args.seconds)
            print(f"{threads} threads, {condition}: done", flush=True)
        samples[threads] = by_condition
    rows = summarise(samples)
    command = "python -m bench.thread_contention " + " ".join(argv or sys.argv[1:])
    document = {"seconds": args.seconds, "rows": rows, "samples": samples}
    for path in write_json_and_markdown(args.out, "contention", document, markdown(
        rows, args.seconds, command.strip())):  # fmt: skip
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
