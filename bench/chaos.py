"""Chaos and load runs against the real service; writes docs/reliability.md.

    python -m bench.chaos --out docs/reliability.md [--results docs/results/reliability] \\
        [--scenarios overload replica-kill node-loss fuzz] [--seed 0]

Every scenario starts the service itself (`serve run`, or a two-node cluster and
`serve deploy`), drives it over HTTP from this process (loopback only, bounded in requests
and time), injects its fault into processes it started, and stops everything it started:

- overload: the CPU default. First at capacity (closed loop, as many clients as the ingress
  admits), then open-loop Poisson arrivals at 10x the throughput measured at capacity.
- replica-kill: the scale profile (2 replicas of every stage). Under steady load (4 clients),
  kill -9 one replica of each deployment in turn, then the vLLM engine process of one
  generator replica (the replica lives on with a dead engine), waiting for recovery in
  between.
- node-loss: two Ray nodes on this machine, the two-node profile (one replica of every stage
  per node); under steady load the worker node's raylet is killed.
- fuzz: schemathesis over /openapi.json with the CPU default.

Outcomes per request (bench.stats): succeeded, refused (429/503 with Retry-After),
interrupted (a final stream error event after a stage died), failed, hung (no answer within
the client timeout). Recovery: from the kill to the replica count being whole again, read
from /readyz polled every 0.5 s.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from app.config import parse_config
from bench import stats
from bench.client import READY_PATH, ready_replicas, warm_up
from bench.labs import machine, started_variant
from bench.loadgen import RequestRecord, RequestSpec, make_client, run_load
from bench.questions import DEFAULT_QUESTIONS as QUESTIONS
from bench.tables import markdown_table
from generation.checkpoints import FASTEST
from generation.dtype import cpu_flags, fastest_dtype
from harness import processes
from harness.cluster import NodeSpec, local_cluster
from harness.service import ROOT, free_port
from harness.variant import apply_overrides, first_application, write_variant

SCENARIOS = ("overload", "overload-paced", "replica-kill", "node-loss", "fuzz")
MAX_TOKENS = 32
WHOLE_STREAK = 4  # /readyz answers in a row that count as recovered (2 s)
CLIENT_TIMEOUT_S = 120.0
STAGE_OF = {
    "Retriever": "retriever",
    "Compressor": "compressor",
    "Generator": "generator",
    "RagIngress": "ingress",
}


@dataclass
class ReadinessLog:
    """(seconds since start, HTTP status, replicas per stage) of each /readyz poll."""

    samples: list[tuple[float, int | None, dict[str, int]]] = field(default_factory=list)

    def ready_share(self) -> float | None:
        if not self.samples:
            return None
        return sum(status == 200 for _, status, _ in self.samples) / len(self.samples)

    def first_time(self, predicate, after_s: float = 0.0) -> float | None:
        """When (s) a sample at or after `after_s` first satisfied `predicate(status, replicas)`."""
        for at_s, status, replicas in self.samples:
            if at_s >= after_s and predicate(status, replicas):
                return at_s
        return None


async def watch_readiness(
    base_url: str, log: ReadinessLog, interval_s: float = 0.5, started: float | None = None
) -> None:
    """Poll /readyz until cancelled, appending to `log` (a failed poll records None)."""
    start = time.perf_counter() if started is None else started
    async with httpx.AsyncClient(base_url=base_url, timeout=5, trust_env=False) as client:
        while True:
            try:
                response = await client.get(READY_PATH)
                status, replicas = response.status_code, ready_replicas(response)
            except (httpx.HTTPError, ValueError):
                status, replicas = None, {}
            log.samples.append((time.perf_counter() - start, status, replicas))
            await asyncio.sleep(interval_s)


def specs(count: int, offset: int = 0) -> list[RequestSpec]:
    """Distinct questions (a suffix keeps whole prompts from repeating)."""
    return [
        RequestSpec("rag", f"{QUESTIONS[i % len(QUESTIONS)]} (#{offset + i})", MAX_TOKENS)
        for i in range(count)
    ]


async def load(
    base_url: str,
    requests: Sequence[RequestSpec],
    *,
    concurrency: int | None = None,
    rate_per_s: float | None = None,
    seed: int = 0,
    strike: tuple[float, Callable[[], object]] | None = None,
) -> tuple[list[RequestRecord], ReadinessLog, float | None]:
    """Run the load while /readyz is watched; `strike` = (after_s, action) runs the fault.
    Returns the records, the readiness log and when (s from start) the fault struck."""
    readiness = ReadinessLog()
    started = time.perf_counter()
    watcher = asyncio.create_task(watch_readiness(base_url, readiness, 0.5, started=started))
    struck_at: list[float] = []

    async def fault() -> None:
        if strike is None:
            return
        await asyncio.sleep(strike[0])
        await asyncio.to_thread(strike[1])
        struck_at.append(time.perf_counter() - started)

    async with make_client(base_url, request_timeout_s=CLIENT_TIMEOUT_S) as client:
        striker = asyncio.create_task(fault())
        records = await run_load(
            client,
            requests,
            rate_per_s=rate_per_s,
            concurrency=concurrency,
            seed=seed,
            request_timeout_s=CLIENT_TIMEOUT_S,
        )
        await striker
    watcher.cancel()
    return records, readiness, (struck_at[0] if struck_at else None)


def summary(records: Sequence[RequestRecord], readiness: ReadinessLog) -> dict:
    rejects = stats.reject_ms(records)
    admitted = stats.admitted_e2e_ms(records)
    return {
        **stats.counts(records),
        "reject_ms_p50": stats.percentile_or_none(rejects, 50),
        "reject_ms_p99": stats.percentile_or_none(rejects, 99),
        "admitted_e2e_ms_p50": stats.percentile_or_none(admitted, 50),
        "admitted_e2e_ms_p99": stats.percentile_or_none(admitted, 99),
        "throughput_rps": stats.answered_per_s(records),
        "ready_share": readiness.ready_share(),
        "failures": stats.failures(records),
        "codes": sorted({f"{r.status}:{r.error_code}" for r in records if not r.ok}),
        # Every request as the client saw it, so that any figure above can be recomputed.
        "records": [asdict(record) for record in records],
    }


def wait_replicas(
    base_url: str,
    want: dict[str, int],
    timeout_s: float = 300,
    give_up: Callable[[], bool] = lambda: False,
) -> float | None:
    """Seconds until /readyz shows at least `want` running replicas per stage (None: never,
    or `give_up()` said so, asked every 10 s)."""
    started = time.perf_counter()
    asked = started
    streak = 0
    while time.perf_counter() - started < timeout_s:
        if time.perf_counter() - asked > 10:
            asked = time.perf_counter()
            if give_up():
                return None
        try:
            replicas = ready_replicas(httpx.get(f"{base_url}{READY_PATH}", timeout=10))
            whole = all(replicas.get(stage, 0) >= count for stage, count in want.items())
        except (httpx.HTTPError, ValueError):
            whole = False
        # Several answers in a row: each ingress replica answers from its own view.
        streak = streak + 1 if whole else 0
        if streak >= WHOLE_STREAK:
            return time.perf_counter() - started
        time.sleep(0.5)
    return None


# --- scenarios ---------------------------------------------------------------------------


# The null engine at vLLM's pace here (TTFT ~0.3 s, ~30 ms a token: generation.paced_engine):
# the same admission path without the core vLLM's decoding takes from everything else.
PACED_LIKE_VLLM = {
    "generator.engine": "paced",
    "compression.llmlingua.enabled": False,
}


# The config each scenario serves (its file in the tree and the overrides it applies), so
# that every result names the reader it was measured with.
SCENARIO_CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "overload": ("serve_config.yaml", {}),
    "overload-paced": ("serve_config.yaml", PACED_LIKE_VLLM),
    "replica-kill": ("serve_config.scale.yaml", {}),
    "node-loss": ("serve_config.multinode.yaml", {}),
    "fuzz": ("serve_config.yaml", {}),
}


def reader_of(args: dict[str, Any], flags: frozenset[str] | None) -> str:
    """The generator a config's application args serve: its model and dtype, with what
    `fastest` means on a CPU with `flags` (None: not resolved)."""
    generator = parse_config(args).generator
    if generator.engine == "paced":
        return "the null engine at vLLM's pace (no model)"
    if generator.engine == "openai":
        return f"{generator.model_id} on an external OpenAI-compatible server"
    dtype = generator.engine_kwargs.get("dtype", "auto")
    if dtype == FASTEST and flags is not None:
        dtype = f"{dtype}: {fastest_dtype(generator.model_source, flags, has_gpu=False)} here"
    return f"{generator.model_id} (vLLM, dtype {dtype})"


def scenario_reader(name: str, flags: frozenset[str] | None) -> str:
    """reader_of the config scenario `name` serves, as the tree holds it now."""
    file, overrides = SCENARIO_CONFIGS[name]
    args = first_application(ROOT / file)[1].get("args") or {}
    return reader_of(apply_overrides(args, overrides), flags)


def run_overload(work: Path, seed: int, overrides: dict | None = None, label: str = "") -> dict:
    name = f"overload{label}"
    with started_variant(ROOT / "serve_config.yaml", overrides or {}, work, name) as service:
        config = first_application(work / f"{name}.serve.yaml")[1]["args"]
        limit = parse_config(config).in_flight_limit()
        warm_up(service.base_url, QUESTIONS[:2], 8, CLIENT_TIMEOUT_S, strict=False)
        capacity_records, capacity_ready, _ = asyncio.run(
            load(service.base_url, specs(2 * limit), concurrency=limit, seed=seed)
        )
        capacity = summary(capacity_records, capacity_ready)
        rate = 10 * (capacity["throughput_rps"] or 1.0)
        count = min(600, max(100, int(rate * 30)))
        over_records, over_ready, _ = asyncio.run(
            load(service.base_url, specs(count, 1000), rate_per_s=rate, seed=seed)
        )
        overloaded = summary(over_records, over_ready)
    ratio = stats.ratio_ci(
        stats.admitted_e2e_ms(over_records),
        stats.admitted_e2e_ms(capacity_records),
        stats.quantile(99),
        seed=seed,
    )
    return {
        "engine": "paced" if overrides else "vllm",
        "in_flight_limit": limit,
        "offered_rate_rps": rate,
        "capacity": capacity,
        "overload": overloaded,
        "admitted_p99_ratio": [ratio.estimate, ratio.low, ratio.high],
    }


def run_overload_paced(work: Path, seed: int) -> dict:
    return run_overload(work, seed, PACED_LIKE_VLLM, "-paced")


def run_replica_kills(
    work: Path, seed: int, router: str | None = None, compressor_router: str | None = None
) -> list[dict]:
    """`router`: the generator's request router (generator.request_router.kind), else the
    scale profile's own; `compressor_router` the compressor's (compression.request_router.kind)."""
    overrides: dict[str, object] = {}
    if router is not None:
        overrides["generator.request_router.kind"] = router
    if compressor_router is not None:
        overrides["compression.request_router.kind"] = compressor_router
    whole = {"retriever": 2, "compressor": 2, "generator": 2, "ingress": 2}
    results = []
    with started_variant(ROOT / "serve_config.scale.yaml", overrides, work, "scale") as service:
        warm_up(service.base_url, QUESTIONS[:2], 8, CLIENT_TIMEOUT_S, strict=False)
        targets = [
            ("Retriever", "replica"),
            ("Compressor", "replica"),
            ("Generator", "replica"),
            ("RagIngress", "replica"),
            ("Generator", "engine"),
        ]
        for index, (deployment, what) in enumerate(targets):
            wait_replicas(service.base_url, whole)
            if what == "engine":
                victim = processes.engine_pids(service.pid)[0]
            else:
                victim = processes.replica_pids(service.pid, deployment)[0]
            records, readiness, struck = asyncio.run(
                load(
                    service.base_url,
                    specs(48, 100 * index),
                    concurrency=4,
                    seed=seed,
                    strike=(5.0, functools.partial(processes.kill, victim)),
                )
            )
            stage = STAGE_OF.get(deployment)
            detected: float | None = None
            recovered: float | None = None
            if stage is not None and struck is not None:
                detected = readiness.first_time(
                    lambda status, replicas, s=stage: replicas.get(s, 2) < 2, struck
                )
                back = wait_replicas(service.base_url, {stage: 2})
                recovered = _recovery_s(readiness, stage, struck, back)
            results.append(
                {
                    "target": f"{deployment} {what}",
                    "victim_pid": victim,
                    "struck_at_s": struck,
                    "detected_after_s": (
                        None if detected is None or struck is None else detected - struck
                    ),
                    "recovered_after_s": recovered,
                    **summary(records, readiness),
                }
            )
    return results


def _recovery_s(
    readiness: ReadinessLog, stage: str, struck: float, waited_after_run: float | None
) -> float | None:
    """Seconds from the kill until the stage had its replicas back for good: the first
    sample from which on every sample of the log taken during the load shows them all (each
    ingress replica answers /readyz from its own view, refreshed every 2 s, so one sample
    can lag another), else the wait after the load (None when it never came back)."""
    after = [(at, replicas.get(stage, 0) >= 2) for at, _, replicas in readiness.samples]
    after = [(at, whole) for at, whole in after if at >= struck]
    if any(not whole for _, whole in after) and after[-1][1]:
        last_short = max(at for at, whole in after if not whole)
        return min(at for at, whole in after if whole and at > last_short) - struck
    if waited_after_run is None:
        return None
    last = readiness.samples[-1][0] if readiness.samples else struck
    return (last - struck) + waited_after_run


def run_node_loss(work: Path, seed: int) -> dict:
    http_port = free_port()
    config = write_variant(
        ROOT / "serve_config.multinode.yaml", {}, work / "multinode.yaml", port=http_port
    )
    base_url = f"http://127.0.0.1:{http_port}"
    nodes = [NodeSpec("node_a", 1), NodeSpec("node_b", 1)]
    with local_cluster(nodes, work / "cluster", free_port(), free_port()) as cluster:
        cluster.deploy(config, work / "deploy.log")
        ready_s = wait_replicas(
            base_url,
            {"retriever": 2, "compressor": 2, "generator": 2},
            timeout_s=600,
            give_up=lambda: cluster.app_status()[0] == "DEPLOY_FAILED",
        )
        if ready_s is None:
            raise RuntimeError(f"the app did not come up: {cluster.app_status()}")
        warm_up(base_url, QUESTIONS[:2], 8, CLIENT_TIMEOUT_S, strict=False)
        before = cluster.placement()
        records, readiness, struck = asyncio.run(
            load(
                base_url,
                specs(64, 5000),
                concurrency=4,
                seed=seed,
                strike=(5.0, lambda: cluster.take_away("node_b")),
            )
        )
        time.sleep(10)
        after = cluster.placement()
        alive = cluster.alive_nodes()
    tail = [r for r in records if (r.send_at_ms or 0) / 1000 > (struck or 0) + 15]
    return {
        "deploy_to_ready_s": ready_s,
        "placement_before": before,
        "placement_after": after,
        "alive_nodes_after": alive,
        "struck_at_s": struck,
        "after_15s": stats.counts(tail),
        **summary(records, readiness),
    }


def run_fuzz(work: Path, seed: int, examples: int = 100) -> dict:
    overrides = {"generator.max_tokens_limit": 64, "generator.default_max_tokens": 16}
    with started_variant(ROOT / "serve_config.yaml", overrides, work, "fuzz") as service:
        started = time.perf_counter()
        result = subprocess.run(
            [
                str(Path(sys.executable).with_name("st")), "run",
                f"{service.base_url}/openapi.json",
                "--checks", "not_a_server_error",
                "--max-examples", str(examples), "--seed", str(seed),
                "--request-timeout", "120",
            ],
            capture_output=True, text=True, timeout=3600, check=False,
        )  # fmt: skip
        elapsed = time.perf_counter() - started
    (work / "fuzz.out.txt").write_text(result.stdout + result.stderr)
    cases = re.findall(r"(\d+) generated", result.stdout)
    return {
        "examples_per_operation": examples,
        "exit_code": result.returncode,
        "generated": int(cases[-1]) if cases else None,
        "server_errors_found": result.returncode != 0,
        "seconds": elapsed,
        "summary": _st_summary(result.stdout),
    }


def _st_summary(stdout: str) -> str:
    lines = [line for line in stdout.splitlines() if line.strip()]
    return "\n".join(lines[-12:])


# --- report ------------------------------------------------------------------------------


def markdown(
    results: dict[str, Any], command: str, records: str = "docs/results/reliability/"
) -> str:
    """The report; `records` names the folder the raw records were saved to."""
    out = [
        "# Reliability: overload, replica and engine deaths, node loss, fuzzing",
        "",
        f"Measured with `{command}` on {results['date']} ({results['machine']})"
        + _earlier(results.get("earlier", {}))
        + f". Raw records are in {records}. Outcomes: "
        "*succeeded*; *refused* = 429/503 with Retry-After before any answer; *interrupted* "
        "= a final stream error event after a stage died mid-answer; *failed* = anything "
        "else (a 500, a 503 without Retry-After, a broken stream); *hung* = no answer "
        f"within {CLIENT_TIMEOUT_S:.0f} s.",
        "",
    ]
    readers = results.get("readers", {})
    sections: list[tuple[str, Callable[[Any], list[str]]]] = [
        ("overload", _overload_section),
        ("overload-paced", _overload_section),
        ("replica-kill", _kill_section),
        ("node-loss", _node_section),
    ]
    for name, section in sections:
        if name in results:
            title, *rest = section(results[name])
            out += [title, "", _reader_line(readers.get(name)), *rest]
    out += LIMITS
    if "fuzz" in results:
        fuzz = results["fuzz"]
        out += [
            "## Fuzzing every route (schemathesis)",
            "",
            _reader_line(readers.get("fuzz")),
            "",
            f"`st run /openapi.json --checks not_a_server_error --max-examples "
            f"{fuzz['examples_per_operation']}` against the CPU default (max_tokens capped at "
            f"64): exit code {fuzz['exit_code']} "
            f"({'server errors found' if fuzz['server_errors_found'] else 'no response >= 500'}),"
            f" {fuzz['seconds']:.0f} s.",
            "",
            "```",
            fuzz["summary"],
            "```",
            "",
        ]
    return "\n".join(out)


LIMITS = [
    "## What the service cannot make clean, and why",
    "",
    "- **An ingress replica that dies mid-request.** A stream already started is cut (the "
    "client sees the connection close: its status was sent); a request not yet answered "
    "gets 503 `ingress_unavailable` with Retry-After from the middleware in Serve's proxy "
    "(app/proxy_errors.py; before it, the HTTP server's plain-text 500). Run two or more "
    "ingress replicas, and let clients retry connection errors and 503s.",
    "- **A node that vanishes.** Requests in flight on its replicas wait until Ray declares "
    "them dead (7 to 17 s in these runs), then get 503 with Retry-After; requests sent "
    "after that are served by the surviving node.",
    "- **Prefix-cache-affine routing across nodes.** Ray Serve LLM's "
    "PrefixCacheAffinityRouter keeps its prefix tree in one detached actor. When the node "
    "holding it was lost, every generator call hung (seen in a run before the two-node "
    "profile switched to the default router).",
    "",
]


def _reader_line(reader: str | None) -> str:
    return f"Reader: {reader or 'not recorded'}."


def _earlier(earlier: dict[str, str]) -> str:
    if not earlier:
        return ""
    parts = ", ".join(f"{name} on {measured}" for name, measured in sorted(earlier.items()))
    return f"; scenarios kept from earlier runs of the same command: {parts}"


OUTCOME_HEADER = [
    "run", "sent", "succeeded", "refused", "interrupted", "failed", "hung",
    "reject ms p50 / p99", "admitted E2E ms p50 / p99", "/readyz 200",
]  # fmt: skip


def _outcomes(s: dict, label: str) -> list[str]:
    """One run's outcome counts and latencies, as a row of OUTCOME_HEADER."""
    return [
        label, s["sent"], s["succeeded"], s["refused"], s["interrupted"], s["failed"], s["hung"],
        f"{_ms(s['reject_ms_p50'])} / {_ms(s['reject_ms_p99'])}",
        f"{_ms(s['admitted_e2e_ms_p50'])} / {_ms(s['admitted_e2e_ms_p99'])}",
        _share(s["ready_share"]),
    ]  # fmt: skip


def _outcome_table(*rows: tuple[str, dict]) -> str:
    return markdown_table(OUTCOME_HEADER, [_outcomes(s, label) for label, s in rows])


def _overload_section(result: dict) -> list[str]:
    low, high = result["admitted_p99_ratio"][1:]
    paced = result.get("engine") == "paced"
    title = "## Overload at 10x capacity" + (", with a null engine at vLLM's pace" if paced else "")
    engine = (
        "The generator is the null engine (TTFT 300 ms, a token every 30 ms, about vLLM's "
        "pace here), so no core is taken by decoding: the admission path alone. "
        if paced
        else ""
    )
    return [
        title,
        "",
        f"{engine}CPU default (1 replica per stage; the ingress admits "
        f"{result['in_flight_limit']} "
        f"requests in flight). At capacity: closed loop, {result['in_flight_limit']} clients. "
        f"Overload: Poisson arrivals at {result['offered_rate_rps']:.2f} req/s, 10x the "
        f"{result['capacity']['throughput_rps']:.2f} req/s measured at capacity; "
        f"max_tokens {MAX_TOKENS}.",
        "",
        _outcome_table(("at capacity", result["capacity"]), ("10x overload", result["overload"])),
        "",
        f"Admitted p99 E2E under overload / at capacity: {result['admitted_p99_ratio'][0]:.2f}"
        f" (95% bootstrap CI {low:.2f} to {high:.2f}). Refusal codes: "
        f"{', '.join(result['overload']['codes']) or 'none'}.",
        "",
    ]


def _kill_section(rows: list[dict]) -> list[str]:
    out = [
        "## kill -9 of one replica of each stage, and of one vLLM engine",
        "",
        "Scale profile (serve_config.scale.yaml: 2 replicas of every stage), 4 clients, 48 "
        "requests each time, the kill 5 s in. Detected: until /readyz showed one replica "
        "fewer; recovered: until the stage was whole again.",
        "",
        _outcome_table(*((row["target"], row) for row in rows)),
        "",
        markdown_table(
            ["target", "detected after", "recovered after", "non-success codes"],
            [
                [
                    row["target"],
                    _s(row["detected_after_s"]),
                    _s(row["recovered_after_s"]),
                    ", ".join(row["codes"]) or "-",
                ]
                for row in rows
            ],
        ),
    ]
    return [*out, ""]


def _node_section(result: dict) -> list[str]:
    return [
        "## Losing a node",
        "",
        "Two Ray nodes on this machine (`ray start --head` with node_a, `ray start "
        "--address` with node_b, 1 CPU each), `serve deploy serve_config.multinode.yaml` "
        f"(ready {_s(result['deploy_to_ready_s'])} after the deploy), 4 clients, 64 requests;"
        " node_b's raylet killed 5 s in.",
        "",
        f"Replicas before: `{json.dumps(result['placement_before'])}`",
        "",
        f"Replicas 10 s after the run: `{json.dumps(result['placement_after'])}` "
        f"({result['alive_nodes_after']} node(s) alive)",
        "",
        _outcome_table(
            ("node_b lost", result),
            ("sent 15 s or more after the loss", result["after_15s"] | _blank()),
        ),
        "",
    ]


def _blank() -> dict:
    return {
        "reject_ms_p50": None, "reject_ms_p99": None, "admitted_e2e_ms_p50": None,
        "admitted_e2e_ms_p99": None, "ready_share": None,
    }  # fmt: skip


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT / "docs/reliability.md")
    parser.add_argument("--results", type=Path, default=ROOT / "docs/results/reliability")
    parser.add_argument("--work", type=Path, default=ROOT / "bench-results/chaos")
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--generator-router",
        choices=["power_of_two", "prefix_cache_affinity", "passage_affinity"],
        help="replica-kill: the generator's request router (default: the scale profile's)",
    )
    parser.add_argument(
        "--compressor-router",
        choices=["power_of_two", "conversation_affinity"],
        help="replica-kill: the compressor's request router (default: the scale profile's)",
    )
    parser.add_argument(
        "--render-only", action="store_true",
        help="run nothing: write --out from the results saved under --results",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.render_only:
        args.scenarios = []
    args.work.mkdir(parents=True, exist_ok=True)
    args.results.mkdir(parents=True, exist_ok=True)
    runners: dict[str, Callable[[Path, int], Any]] = {
        "overload": run_overload,
        "overload-paced": run_overload_paced,
        "replica-kill": functools.partial(
            run_replica_kills,
            router=args.generator_router,
            compressor_router=args.compressor_router,
        ),
        "node-loss": run_node_loss,
        "fuzz": run_fuzz,
    }
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": _machine(),
    }
    readers: dict[str, str] = {}
    for name in args.scenarios:
        print(f"== {name}", flush=True)
        started = time.perf_counter()
        results[name] = runners[name](args.work, args.seed)
        print(f"   {time.perf_counter() - started:.0f} s", flush=True)
        readers[name] = scenario_reader(name, cpu_flags())
        record = {"measured": results["date"], "reader": readers[name], "result": results[name]}
        (args.results / f"{name}.json").write_text(json.dumps(record, indent=2))
    # Scenarios not run this time keep their last measured results in the report.
    earlier = {
        name: _load(args.results / f"{name}.json")
        for name in SCENARIOS
        if name not in args.scenarios and (args.results / f"{name}.json").exists()
    }
    results |= {name: result for name, (result, _, _) in earlier.items()}
    results["earlier"] = {name: measured for name, (_, measured, _) in earlier.items()}
    for name, (_, _, reader) in earlier.items():
        readers[name] = reader or (
            f"{scenario_reader(name, None)}; not recorded by that run: read from "
            f"{SCENARIO_CONFIGS[name][0]} as the tree holds it now"
        )
    results["readers"] = readers
    command = "python -m bench.chaos " + " ".join(argv or sys.argv[1:])
    records = args.results.resolve()
    shown = records.relative_to(ROOT) if records.is_relative_to(ROOT) else records
    args.out.write_text(markdown(results, command.strip(), f"{shown}/"))
    print(f"wrote {args.out}")
    return 0


def _load(path: Path) -> tuple[Any, str, str | None]:
    """A scenario's saved result, when it was measured and the reader it served (older
    files hold the result alone: their modification time stands in; or no reader)."""
    record = json.loads(path.read_text())
    if isinstance(record, dict) and "measured" in record and "result" in record:
        return record["result"], record["measured"], record.get("reader")
    modified = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(path.stat().st_mtime))
    return record, modified, None


def _machine() -> str:
    memory_gib = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    return f"{machine()}, {memory_gib:.0f} GiB, CPU only"


if __name__ == "__main__":
    raise SystemExit(main())
