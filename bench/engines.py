"""The generator inside Ray against the same engine outside it: what `generator.engine: openai`
costs or saves per request.

    python -m bench.engines [--concurrency 1 8] [--requests 30] [--seed 0] \\
        [--out bench-results/engines]

- in-ray: serve_config.yaml as shipped (vLLM inside Ray Serve LLM), LLMLingua unloaded
  (compression.llmlingua.enabled=false) to spare the 2-core machine's CPU; the default
  compression, sentence selection, does not need it.
- external: vLLM's own OpenAI server, started here with the generator's engine arguments
  (harness.vllm_server, as bench.overhead's vllm phase), and the same application with
  generator.engine=openai pointed at it: generator.openai.base_url http://127.0.0.1:PORT/v1,
  generator.deployment.num_cpus 0.1 (a light async actor now), and a read timeout as long
  as the ingress's request timeout, so neither side gives up on a request sooner.

Both sides get the same requests: streaming /v1/chat/completions (as bench.overhead's chain
side), max_tokens 32, temperature 0, the same questions in the same order (drawn with
replacement from bench.questions with a fixed seed, one list per concurrency), closed loop
at each concurrency, one after the other: the whole in-ray side, stopped, then the whole
external side (never both at once on this machine). Each side answers one warm-up request
before it is measured; each starts with an empty prefix cache, so repeated questions hit the
cache alike on both sides.

Per point and side: requests ok and failed, TTFT p50 and p95, TPOT p50, E2E p50, output
tokens/s, prompt and cached prompt tokens per request (from usage), and CPU seconds per
request of every process of the side (the `serve run` tree, Ray included, plus on the
external side vLLM's server tree). Then external against in-ray, paired by request (the same
question at the same position): the median of the per-request ratios external / in-ray of
TTFT, TPOT and E2E with a 95% bootstrap interval (bench.bootstrap, on the log scale), and the
median difference. An interval that contains 1 is written "no detectable difference".
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import shlex
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from app.config import RagAppConfig, parse_config
from bench import bootstrap
from bench.loadgen import RequestRecord, RequestSpec
from bench.outputs import positive_int, write_json_and_markdown
from bench.overhead import Point, listening_pid, measure, tree_cpu_s
from bench.questions import DEFAULT_QUESTIONS as QUESTIONS
from bench.stats import format_ms, mean, median, percentile_or_none, summarize, tpot_ms
from harness.service import ROOT, free_port, started_service
from harness.variant import first_application, write_variant
from harness.vllm_server import external_generator_overrides, serving_generator

SIDES = ("in-ray", "external")
MAX_TOKENS = 32
# Fewer requests per point than this is a smoke run: the intervals mean little.
MIN_REQUESTS = 30
VLLM_READY_TIMEOUT_S = 600.0
# Both sides: the same application, LLMLingua unloaded.
SHARED_OVERRIDES: dict[str, Any] = {"compression.llmlingua.enabled": False}


# Per-request latencies compared between the sides (successful requests only).
METRICS: dict[str, Callable[[RequestRecord], float | None]] = {
    "ttft_ms": lambda r: r.ttft_ms if r.ok else None,
    "tpot_ms": tpot_ms,
    "e2e_ms": lambda r: r.e2e_ms if r.ok else None,
}


def point_specs(
    concurrency: Sequence[int], requests: int, seed: int, model: str
) -> dict[int, list[RequestSpec]]:
    """The requests of each point, the same for both sides: `requests` questions drawn with
    replacement from bench.questions by `random.Random(seed)`, one draw per concurrency."""
    rng = random.Random(seed)
    return {
        c: [
            RequestSpec("chat", question, MAX_TOKENS, model=model, temperature=0.0)
            for question in rng.choices(QUESTIONS, k=requests)
        ]
        for c in concurrency
    }


def write_side_config(
    base: Path, side: str, out: Path, port: int, vllm_port: int | None = None
) -> Path:
    """The serve config of `side` (in SIDES) at `out`, answering on `port`; the external
    side's generator streams from vLLM's server on `vllm_port`."""
    overrides = dict(SHARED_OVERRIDES)
    if side == "external":
        if vllm_port is None:
            raise ValueError("the external side needs vllm_port")
        timeout_s = base_config(base).ingress.request_timeout_s
        overrides |= external_generator_overrides(f"http://127.0.0.1:{vllm_port}", timeout_s)
    elif side != "in-ray":
        raise ValueError(f"unknown side {side!r}")
    return write_variant(base, overrides, out, port)


def base_config(base: Path) -> RagAppConfig:
    return parse_config(first_application(base)[1].get("args") or {})


# --- running the sides -------------------------------------------------------------------


def measure_side(
    side: str, base_url: str, pids: Sequence[int], jobs: Mapping[int, list[RequestSpec]]
) -> dict[int, Point]:
    """One warm-up request, then each point; a point's CPU is that of every tree in `pids`
    (the first is the service's, whose URL is `base_url`)."""
    warm_up = dataclasses.replace(next(iter(jobs.values()))[0], question=QUESTIONS[0])
    warm = measure(side, base_url, pids[0], [warm_up], 1).records[0]
    if not warm.ok:
        raise RuntimeError(f"{side}: the warm-up request failed: {warm.error_kind} {warm.error}")
    points = {}
    for c, specs in jobs.items():
        others_before = sum(tree_cpu_s(pid) for pid in pids[1:])
        point = measure(side, base_url, pids[0], specs, c)
        others = sum(tree_cpu_s(pid) for pid in pids[1:]) - others_before
        points[c] = dataclasses.replace(point, cpu_s=point.cpu_s + others)
        row = side_summary(points[c])
        print(f"{side} C={c}: {row['ok']}/{row['n']} ok, TTFT p50 {row['ttft_ms_p50']}", flush=True)
    return points


def run_in_ray(base: Path, work: Path, jobs: Mapping[int, list[RequestSpec]]) -> dict[int, Point]:
    port = free_port()
    config = write_side_config(base, "in-ray", work / "in-ray.yaml", port)
    with started_service(config, port, work / "in-ray.serve.log") as service:
        return measure_side("in-ray", service.base_url, [service.pid], jobs)


def run_external(base: Path, work: Path, jobs: Mapping[int, list[RequestSpec]]) -> dict[int, Point]:
    """vLLM's own server for the generator of `base` (its engine arguments, its replica's
    environment), and the application streaming from it."""
    _, application = first_application(base)
    log = work / "external.vllm.log"
    with serving_generator(application, log, VLLM_READY_TIMEOUT_S) as server:
        port = free_port()
        config = write_side_config(base, "external", work / "external.yaml", port, server.port)
        with started_service(config, port, work / "external.serve.log") as service:
            pids = [service.pid, listening_pid(server.port)]
            return measure_side("external", service.base_url, pids, jobs)


# --- figures -----------------------------------------------------------------------------


def side_summary(point: Point) -> dict[str, Any]:
    """One side at one point: counts, latencies (ms), tokens and CPU per request."""
    summary = summarize(point.records)
    ok = point.ok()
    ttfts = [r.ttft_ms for r in ok if r.ttft_ms is not None]
    return {
        "side": point.side,
        "concurrency": point.concurrency,
        "n": summary.requests,
        "ok": summary.succeeded,
        "failed": summary.requests - summary.succeeded,
        "errors": summary.errors,
        "ttft_ms_p50": median(ttfts),
        "ttft_ms_p95": percentile_or_none(ttfts, 95),
        "tpot_ms_p50": median(tpot_ms(r) for r in ok),
        "e2e_ms_p50": median(r.e2e_ms for r in ok),
        "output_tokens_per_s": summary.output_tokens_per_s,
        "prompt_tokens_mean": mean(r.usage_prompt_tokens for r in ok),
        "cached_prompt_tokens_mean": mean(r.usage_cached_prompt_tokens for r in ok),
        "cpu_s_per_request": point.cpu_s / max(1, summary.requests),
    }


def compare(in_ray: Point, external: Point, seed: int) -> dict[str, Any]:
    """External against in-ray, paired by request index (both succeeded): per metric the
    median per-request ratio external / in-ray and the median difference (ms), each
    [estimate, low, high] with a 95% bootstrap interval, and the verdict of the ratio."""
    pairs = list(zip(in_ray.records, external.records, strict=True))
    result: dict[str, Any] = {"pairs": sum(a.ok and b.ok for a, b in pairs)}
    for name, value in METRICS.items():
        both = [
            (x, y) for x, y in ((value(b), value(a)) for a, b in pairs)
            if x is not None and y is not None and x > 0 and y > 0
        ]  # fmt: skip
        if len(both) < 2:
            result[name] = None
            continue
        ext, ray = [x for x, _ in both], [y for _, y in both]
        logs = bootstrap.paired_ci(
            [math.log(x) for x in ext], [math.log(y) for y in ray], seed=seed
        )
        ratio = [math.exp(logs.estimate), math.exp(logs.low), math.exp(logs.high)]
        difference = bootstrap.paired_ci(ext, ray, seed=seed)
        result[name] = {
            "n": len(both),
            "ratio": ratio,
            "difference_ms": [difference.estimate, difference.low, difference.high],
            "verdict": verdict(ratio),
        }
    return result


def verdict(ratio: Sequence[float]) -> str:
    """What a ratio external / in-ray [estimate, low, high] of a latency says."""
    _, low, high = ratio
    if low <= 1 <= high:
        return "no detectable difference"
    return "external slower" if low > 1 else "external faster"


def report(
    points: Mapping[str, Mapping[int, Point]], config: dict[str, Any], seed: int
) -> dict[str, Any]:
    """The JSON document: the run's config, a summary per point and side, the comparison
    at each point both sides measured, and every request's record."""
    in_ray, external = points.get("in-ray", {}), points.get("external", {})
    return {
        "config": config,
        "summary": [side_summary(p) for side in SIDES for p in points.get(side, {}).values()],
        "comparison": [
            {"concurrency": c, **compare(in_ray[c], external[c], seed)}
            for c in in_ray
            if c in external
        ],
        "records": {
            side: {str(c): [dataclasses.asdict(r) for r in p.records] for c, p in by_c.items()}
            for side, by_c in points.items()
        },
    }


def markdown(document: dict[str, Any]) -> str:
    config = document["config"]
    out = [
        f"Measured with `{config['command']}` on {config['date']}.",
        "",
        f"{config['model']}, streaming /v1/chat/completions, max_tokens {MAX_TOKENS}, "
        f"temperature 0, closed loop, {config['requests']} requests per point (questions "
        f"drawn with seed {config['seed']}, the same on both sides); in-ray: vLLM inside Ray "
        "Serve LLM; external: vLLM's own OpenAI server with the same engine arguments, the "
        "application's generator.engine=openai; the sides run one after the other.",
        "",
    ]
    if config["requests"] < MIN_REQUESTS:
        out += [f"**Smoke run**: fewer than {MIN_REQUESTS} requests per point.", ""]
    out += [
        "| C | side | ok / failed | TTFT p50 ms | TTFT p95 ms | TPOT p50 ms | E2E p50 ms | "
        "output tokens/s | prompt tokens (cached) | CPU s/request |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in sorted(document["summary"], key=lambda r: (r["concurrency"], r["side"] != "in-ray")):
        out.append(
            f"| {row['concurrency']} | {row['side']} | {row['ok']} / {row['failed']} | "
            f"{format_ms(row['ttft_ms_p50'])} | {format_ms(row['ttft_ms_p95'])} | "
            f"{format_ms(row['tpot_ms_p50'])} | {format_ms(row['e2e_ms_p50'])} | "
            f"{row['output_tokens_per_s']:.1f} | {_tokens(row['prompt_tokens_mean'])} "
            f"({_tokens(row['cached_prompt_tokens_mean'])}) | {row['cpu_s_per_request']:.2f} |"
        )
    if document["comparison"]:
        out += [
            "",
            "External against in-ray, paired by request: the median of per-request ratios "
            "external / in-ray, 95% bootstrap interval, and the median difference.",
            "",
            "| C | pairs | TTFT | TPOT | E2E |",
            "|---|---|---|---|---|",
        ]
        for row in document["comparison"]:
            cells = [_comparison(row[name]) for name in METRICS]
            out.append(f"| {row['concurrency']} | {row['pairs']} | {' | '.join(cells)} |")
    return "\n".join(out) + "\n"


def _comparison(figures: dict[str, Any] | None) -> str:
    if figures is None:
        return "-"
    estimate, low, high = figures["ratio"]
    difference = figures["difference_ms"][0]
    return f"{estimate:.2f}x [{low:.2f}, {high:.2f}] ({difference:+,.1f} ms): {figures['verdict']}"


def _tokens(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.engines", description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results/engines")
    parser.add_argument("--base", type=Path, default=ROOT / "serve_config.yaml")
    parser.add_argument("--concurrency", nargs="+", type=positive_int, default=[1, 8])
    parser.add_argument("--requests", type=positive_int, default=MIN_REQUESTS)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    arguments = list(argv if argv is not None else sys.argv[1:])
    config = {
        "command": shlex.join(["python", "-m", "bench.engines", *arguments]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "base": str(args.base),
        "model": base_config(args.base).generator.model_id,
        "max_tokens": MAX_TOKENS,
        "concurrency": list(dict.fromkeys(args.concurrency)),
        "requests": args.requests,
        "seed": args.seed,
    }
    jobs = point_specs(config["concurrency"], args.requests, args.seed, config["model"])
    args.out.mkdir(parents=True, exist_ok=True)
    points: dict[str, dict[int, Point]] = {}
    for side, run in (("in-ray", run_in_ray), ("external", run_external)):
        print(f"== {side}", flush=True)
        points[side] = run(args.base, args.out, jobs)
        document = report(points, config, args.seed)  # written after each side
        write_json_and_markdown(args.out, "engines", document, markdown(document))
    print(markdown(document))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
