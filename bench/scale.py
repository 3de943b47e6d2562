"""Scaling out on one machine: replicas of the light stages, the autoscaler, and routing that
keeps prefix-cache hits across generator replicas.

    python -m bench.scale --out docs/results/scale [--parts replicas autoscale routing]

- replicas: the chain with a null generator (generation.paced_engine, so vLLM is out of the
  way and the light stages are what saturates) at 1 and at 2 replicas of the ingress,
  retriever and compressor; open-loop Poisson arrivals at rising rates. Throughput and p99
  TTFT against offered load, side by side.
- autoscale: the retriever and compressor autoscaling between 1 and 3 replicas
  (target 2 ongoing requests, short delays), load ramping up in steps and then stopping;
  replicas over time read from /readyz every second.
- routing: two vLLM generator replicas (the scale profile) under Serve's default router and
  under Ray Serve LLM's PrefixCacheAffinityRouter; the same sequence of questions, each
  asked several times, in a seeded random order. Prefix-cache hit rate per request (cached
  prompt tokens / prompt tokens), compared by request with a 95% bootstrap interval.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import bootstrap, outcomes
from bench.loadgen import RequestRecord, RequestSpec, make_client, run_load
from bench.questions import DEFAULT_QUESTIONS as QUESTIONS
from harness.service import ROOT, free_port, started_service
from harness.variant import write_variant

PACED = {
    "generator.engine": "paced",
    "generator.paced.ttft_ms": 50.0,
    "generator.paced.tpot_ms": 5.0,
    "generator.deployment.max_ongoing_requests": 256,
    "compression.llmlingua.enabled": False,
    "ingress.max_in_flight_requests": 500,
    "ingress.deployment.max_ongoing_requests": 1000,
}
LIGHT_STAGES = ("ingress", "retriever", "compression")
RATES = (10.0, 20.0, 40.0, 80.0)
SECONDS_PER_RATE = 15.0
MAX_TOKENS = 16


def rag_specs(count: int, offset: int = 0) -> list[RequestSpec]:
    return [
        RequestSpec(
            "rag", f"{QUESTIONS[(offset + i) % len(QUESTIONS)]} (#{offset + i})", MAX_TOKENS
        )
        for i in range(count)
    ]


def replicas_overrides(count: int) -> dict[str, Any]:
    return {f"{stage}.deployment.num_replicas": count for stage in LIGHT_STAGES} | {
        f"{stage}.deployment.num_cpus": 0.05 for stage in LIGHT_STAGES
    }


def run_replicas(work: Path, seed: int) -> list[dict]:
    rows = []
    for count in (1, 2):
        port = free_port()
        config = write_variant(
            ROOT / "serve_config.yaml", PACED | replicas_overrides(count),
            work / f"replicas-{count}.yaml", port,
        )  # fmt: skip
        with started_service(config, port, work / f"replicas-{count}.serve.log") as service:
            for index, rate in enumerate(RATES):
                n = int(rate * SECONDS_PER_RATE)

                async def go(rate=rate, n=n, index=index) -> list[RequestRecord]:
                    async with make_client(service.base_url, request_timeout_s=60) as client:
                        return await run_load(
                            client, rag_specs(n, 1000 * index), rate_per_s=rate,
                            concurrency=None, seed=seed,
                        )  # fmt: skip

                records = asyncio.run(go())
                rows.append({"replicas": count, "offered_rps": rate, **point(records)})
                print(json.dumps(rows[-1]), flush=True)
    return rows


def point(records: Sequence[RequestRecord]) -> dict[str, Any]:
    ttfts = [r.ttft_ms for r in records if r.ok and r.ttft_ms is not None]
    return {
        **outcomes.counts(records),
        "throughput_rps": outcomes.answered_per_s(records),
        "ttft_ms_p50": outcomes.percentile(ttfts, 50),
        "ttft_ms_p99": outcomes.percentile(ttfts, 99),
        "ttft_ms": ttfts,
    }


def run_autoscale(work: Path, seed: int) -> dict:
    scaling = {
        "min_replicas": 1, "max_replicas": 3, "target_ongoing_requests": 2,
        "upscale_delay_s": 3, "downscale_delay_s": 15, "look_back_period_s": 5,
    }  # fmt: skip
    overrides = PACED | {
        "retriever.deployment.autoscaling": scaling,
        "retriever.deployment.num_cpus": 0.05,
        "compression.deployment.autoscaling": scaling,
        "compression.deployment.num_cpus": 0.05,
    }
    steps = [(5.0, 20.0), (40.0, 40.0), (0.0, 45.0)]  # (req/s, seconds)
    port = free_port()
    config = write_variant(ROOT / "serve_config.yaml", overrides, work / "autoscale.yaml", port)
    with started_service(config, port, work / "autoscale.serve.log") as service:

        async def go() -> tuple[list[RequestRecord], outcomes.ReadinessLog]:
            readiness = outcomes.ReadinessLog()
            started = time.perf_counter()
            watcher = asyncio.create_task(
                outcomes.watch_readiness(service.base_url, readiness, 1.0, started)
            )
            records: list[RequestRecord] = []
            async with make_client(service.base_url, request_timeout_s=60) as client:
                for index, (rate, seconds) in enumerate(steps):
                    if rate == 0:
                        await asyncio.sleep(seconds)
                        continue
                    records += await run_load(
                        client, rag_specs(int(rate * seconds), 5000 * (index + 1)),
                        rate_per_s=rate, concurrency=None, seed=seed,
                    )  # fmt: skip
            watcher.cancel()
            return records, readiness

        records, readiness = asyncio.run(go())
    return {
        "steps": steps,
        "config": scaling,
        "counts": outcomes.counts(records),
        "replicas": [
            {"t_s": t, "retriever": r.get("retriever"), "compressor": r.get("compressor")}
            for t, _, r in readiness.samples
        ],
    }


def run_routing(work: Path, seed: int, repeats: int = 4) -> dict:
    order = [q for q in QUESTIONS[:12] for _ in range(repeats)]
    random.Random(seed).shuffle(order)
    specs = [RequestSpec("rag", question, 8) for question in order]
    per_router: dict[str, list[RequestRecord]] = {}
    for router in ("power_of_two", "prefix_cache_affinity"):
        port = free_port()
        config = write_variant(
            ROOT / "serve_config.scale.yaml", {"generator.request_router.kind": router},
            work / f"routing-{router}.yaml", port,
        )  # fmt: skip
        with started_service(config, port, work / f"routing-{router}.serve.log") as service:

            async def go() -> list[RequestRecord]:
                async with make_client(service.base_url, request_timeout_s=300) as client:
                    return await run_load(client, specs, rate_per_s=None, concurrency=4, seed=0)

            per_router[router] = asyncio.run(go())
    rates = {name: [hit_rate(r) for r in records] for name, records in per_router.items()}
    pairs = [
        (a, b)
        for a, b in zip(rates["prefix_cache_affinity"], rates["power_of_two"], strict=True)
        if a is not None and b is not None
    ]
    difference = bootstrap.paired_ci(
        [a for a, _ in pairs], [b for _, b in pairs], bootstrap.mean, seed=seed
    )
    return {
        "requests": len(specs),
        "distinct_questions": 12,
        "mean_hit_rate": {
            name: sum(v for v in values if v is not None)
            / max(1, sum(v is not None for v in values))
            for name, values in rates.items()
        },
        "affinity_minus_default": [difference.estimate, difference.low, difference.high],
        "pairs": len(pairs),
        "failures": {name: outcomes.counts(records) for name, records in per_router.items()},
    }


def hit_rate(record: RequestRecord) -> float | None:
    if not record.ok or not record.usage_prompt_tokens:
        return None
    return (record.usage_cached_prompt_tokens or 0) / record.usage_prompt_tokens


def plot(results: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    if "replicas" in results:
        figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
        for count in (1, 2):
            rows = [r for r in results["replicas"] if r["replicas"] == count]
            offered = [r["offered_rps"] for r in rows]
            left.plot(offered, [r["throughput_rps"] for r in rows], "o-", label=f"{count}x")
            right.plot(offered, [r["ttft_ms_p99"] for r in rows], "o-", label=f"{count}x")
        left.set(xlabel="offered load (req/s)", ylabel="answered (req/s)", title="Throughput")
        right.set(xlabel="offered load (req/s)", ylabel="p99 TTFT (ms)", title="p99 TTFT")
        for axis in (left, right):
            axis.legend(title="light-stage replicas")
            axis.grid(alpha=0.3)
        figure.tight_layout()
        written.append(out / "replicas.png")
        figure.savefig(written[-1], dpi=110)
    if "autoscale" in results:
        samples = results["autoscale"]["replicas"]
        figure, axis = plt.subplots(figsize=(8, 3.5))
        for stage in ("retriever", "compressor"):
            axis.step([s["t_s"] for s in samples], [s[stage] for s in samples], where="post",
                      label=stage)  # fmt: skip
        start = 0.0
        for rate, seconds in results["autoscale"]["steps"]:
            axis.axvspan(start, start + seconds, alpha=0.08 * (rate > 0) + 0.02)
            axis.text(start + 1, 3.1, f"{rate:g} req/s", fontsize=8)
            start += seconds
        axis.set(xlabel="time (s)", ylabel="running replicas", ylim=(0, 3.5),
                 title="Autoscaling under a load step")  # fmt: skip
        axis.legend()
        figure.tight_layout()
        written.append(out / "autoscale.png")
        figure.savefig(written[-1], dpi=110)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT / "docs/results/scale")
    parser.add_argument("--work", type=Path, default=ROOT / "bench-results/scale")
    parser.add_argument(
        "--parts", nargs="+", choices=("replicas", "autoscale", "routing"),
        default=["replicas", "autoscale", "routing"],
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    runners = {"replicas": run_replicas, "autoscale": run_autoscale, "routing": run_routing}
    for part in args.parts:
        print(f"== {part}", flush=True)
        results[part] = runners[part](args.work, args.seed)
        (args.out / "scale.json").write_text(json.dumps(results, indent=2))
    for path in plot(results, args.out):
        print(f"wrote {path}")
    print(f"command: python -m bench.scale {' '.join(argv if argv is not None else sys.argv[1:])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
