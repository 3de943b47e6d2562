"""What the serving chain costs over the engine alone.

    python -m bench.overhead --out bench-results/overhead \\
        [--phases paced interval vllm micro] [--concurrency 1 8 32 64] [--requests 30]

- paced: a null engine (generation.paced_engine: TTFT 50 ms, then a token every 5 or
  50 ms) behind the whole chain (`serve run`, generator.engine=paced, everything else as
  shipped but LLMLingua unloaded), and the same engine alone behind bench.paced_server; the
  same OpenAI streaming requests to both, closed loop at each concurrency, max(requests,
  2C) requests per point. What the chain adds is then all there is to measure.
- interval: the chain at 5 ms per token with generator.stream_batching_interval_ms 0, 10
  and 50, at concurrency 1 and 64: what batching the token stream buys and costs.
- vllm: the chain as shipped (SmolLM2 on vLLM) against vLLM's own OpenAI server with the
  same engine arguments, with the cores split on both sides: everything under
  `taskset -c 0`, vLLM's threads bound to core 1. The chain answers each question once
  with include_context; its final prompt is rebuilt from that (the same system prompt,
  sources and question the compressor assembled) and sent to vLLM alone, so both sides
  prefill the same text; the prompt token counts are checked equal.
- micro: the request path's new admission code (auth and rate-limit guard, body-size
  limit, readiness read and in-flight gate) timed in-process, per call.

Comparisons are paired by request (the same question at the same position on both sides):
the median difference with a 95% bootstrap interval. CPU per request is the CPU time of
every process of the service (or server) over the point, divided by its requests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import timeit
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from app.config import parse_config
from bench import bootstrap
from bench.loadgen import RequestRecord, RequestSpec, make_client, run_load
from bench.questions import DEFAULT_QUESTIONS as QUESTIONS
from bench.stats import median, percentile_or_none
from harness import processes
from harness.service import ROOT, free_port, running_server, started_service
from harness.variant import first_application, write_variant
from harness.vllm_server import running_vllm, vllm_environment, vllm_serve_argv
from prepare.prompt import build_messages
from retrieval.models import resolve_model_reference

PACED_TTFT_MS = 50.0
SHIPPED_INTERVAL_MS = 50.0  # serve_config.yaml's generator.stream_batching_interval_ms
PACED_MAX_TOKENS = 64
VLLM_MAX_TOKENS = 32
PIN = ("taskset", "-c", "0")


@dataclass(frozen=True)
class Point:
    """One side at one load point: its records and the CPU its processes spent."""

    side: str
    concurrency: int
    records: list[RequestRecord]
    cpu_s: float
    wall_s: float

    def ok(self) -> list[RequestRecord]:
        return [r for r in self.records if r.ok]

    def summary(self) -> dict[str, Any]:
        ok = self.ok()
        tokens = sum(r.output_tokens for r in ok)
        return {
            "side": self.side,
            "concurrency": self.concurrency,
            "n": len(self.records),
            "succeeded": len(ok),
            "ttft_ms_p50": median([r.ttft_ms for r in ok]),
            "ttft_ms_p99": percentile_or_none([r.ttft_ms for r in ok if r.ttft_ms], 99),
            "tpot_ms_p50": median([tpot(r) for r in ok]),
            "tokens_per_s": tokens / self.wall_s if self.wall_s else None,
            "cpu_ms_per_request": 1000 * self.cpu_s / max(1, len(self.records)),
            "server_ms_p50": {
                stage: median([(r.server_timings_ms or {}).get(stage) for r in ok])
                for stage in ("retrieve", "compress", "queue", "network", "ttft")
            },
        }


def tpot(record: RequestRecord) -> float | None:
    if record.ttft_ms is None or record.e2e_ms is None or record.output_tokens < 2:
        return None
    return (record.e2e_ms - record.ttft_ms) / (record.output_tokens - 1)


def _ttft(record: RequestRecord) -> float | None:
    return record.ttft_ms


def tree_cpu_s(root_pid: int) -> float:
    """User + system CPU seconds of `root_pid` and every living descendant."""
    total = 0.0
    for process in [psutil.Process(root_pid), *processes.descendants(root_pid)]:
        try:
            times = process.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            continue
    return total


def measure(
    side: str,
    base_url: str,
    root_pid: int,
    specs: Sequence[RequestSpec],
    concurrency: int,
    api_key: str | None = None,
) -> Point:
    async def go() -> list[RequestRecord]:
        async with make_client(base_url, api_key=api_key, request_timeout_s=300) as client:
            return await run_load(client, specs, rate_per_s=None, concurrency=concurrency, seed=0)

    cpu_before, started = tree_cpu_s(root_pid), time.perf_counter()
    records = asyncio.run(go())
    wall = time.perf_counter() - started
    return Point(side, concurrency, records, tree_cpu_s(root_pid) - cpu_before, wall)


def chat_specs(
    count: int, max_tokens: int, model: str, offset: int = 0, include_context: bool = False
) -> list[RequestSpec]:
    return [
        RequestSpec(
            "chat", f"{QUESTIONS[(offset + i) % len(QUESTIONS)]} (#{offset + i})", max_tokens,
            model=model, temperature=0.0, include_context=include_context,
        )
        for i in range(count)
    ]  # fmt: skip


def direct_specs(chain: Sequence[RequestSpec], model: str) -> list[RequestSpec]:
    """The same questions as plain chat messages, for an engine with no RAG in front."""
    return [
        RequestSpec(
            "chat", spec.question, spec.max_tokens, model=model,
            messages=({"role": "user", "content": spec.question},), temperature=0.0,
        )
        for spec in chain
    ]  # fmt: skip


def compare(chain: Point, direct: Point, seed: int) -> dict[str, Any]:
    """Paired chain-minus-direct differences by request index, 95% bootstrap intervals."""
    pairs = [(c, d) for c, d in zip(chain.records, direct.records, strict=True) if c.ok and d.ok]
    result: dict[str, Any] = {"pairs": len(pairs)}
    for name, value in (("ttft_ms", _ttft), ("tpot_ms", tpot)):
        both = [
            (a, b) for a, b in ((value(c), value(d)) for c, d in pairs)
            if a is not None and b is not None
        ]  # fmt: skip
        if len(both) >= 2:
            interval = bootstrap.paired_ci([a for a, _ in both], [b for _, b in both], seed=seed)
            result[f"{name}_added"] = [interval.estimate, interval.low, interval.high]
            ratio = bootstrap.ratio_ci([a for a, _ in both], [b for _, b in both], seed=seed)
            result[f"{name}_ratio"] = [ratio.estimate, ratio.low, ratio.high]
    chain_rate, direct_rate = chain.summary()["tokens_per_s"], direct.summary()["tokens_per_s"]
    if chain_rate and direct_rate:
        result["throughput_share"] = chain_rate / direct_rate
    return result


# --- phases ------------------------------------------------------------------------------


@contextmanager
def paced_chain(work: Path, tpot_ms: float, interval_ms: float, label: str):
    port = free_port()
    overrides = {
        "generator.engine": "paced",
        "generator.paced.ttft_ms": PACED_TTFT_MS,
        "generator.paced.tpot_ms": tpot_ms,
        "generator.stream_batching_interval_ms": interval_ms,
        "generator.max_tokens_limit": 256,
        # The null engine has no batch limit: let every stream in, as the engine alone does.
        "generator.deployment.max_ongoing_requests": 256,
        "compression.llmlingua.enabled": False,
        "ingress.max_in_flight_requests": 200,
    }
    config = write_variant(ROOT / "serve_config.yaml", overrides, work / f"{label}.yaml", port)
    with started_service(config, port, work / f"{label}.serve.log") as service:
        warm_chain(service.base_url)
        yield service


@contextmanager
def paced_alone(work: Path, tpot_ms: float, label: str):
    port = free_port()
    argv = [
        sys.executable, "-m", "bench.paced_server", "--port", str(port),
        "--ttft-ms", str(PACED_TTFT_MS), "--tpot-ms", str(tpot_ms),
    ]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    with running_server(
        argv, f"{url}/health", work / f"{label}.log", env=dict(os.environ),
        name="paced server", ready_timeout_s=60, poll_s=0.5,
    ) as process:  # fmt: skip
        yield url, process.pid


def warm_chain(base_url: str) -> None:
    for question in QUESTIONS[:2]:
        httpx.post(
            f"{base_url}/v1/rag/query", json={"question": question, "max_tokens": 4}, timeout=600
        )


def run_paced(work: Path, concurrency: Sequence[int], requests: int, seed: int) -> list[dict]:
    rows = []
    for tpot_ms in (5.0, 50.0):
        label = f"paced-{tpot_ms:g}ms"
        points = {c: chat_specs(max(requests, 2 * c), PACED_MAX_TOKENS, "smollm2-135m-instruct")
                  for c in concurrency}  # fmt: skip
        chain_points = {}
        with paced_chain(work, tpot_ms, SHIPPED_INTERVAL_MS, label) as service:
            for c, specs in points.items():
                chain_points[c] = measure("chain", service.base_url, service.pid, specs, c)
        with paced_alone(work, tpot_ms, label + "-alone") as (url, pid):
            for c, specs in points.items():
                direct = measure("alone", url, pid, direct_specs(specs, "paced"), c)
                rows.append(
                    {
                        "tpot_ms": tpot_ms,
                        "concurrency": c,
                        "chain": chain_points[c].summary(),
                        "alone": direct.summary(),
                        "added": compare(chain_points[c], direct, seed),
                    }
                )
                print(json.dumps(rows[-1]["added"]), flush=True)
    return rows


def run_interval(work: Path, requests: int, seed: int) -> list[dict]:
    rows = []
    for interval_ms in (0.0, 10.0, 50.0):
        with paced_chain(work, 5.0, interval_ms, f"interval-{interval_ms:g}") as service:
            for c in (1, 64):
                specs = chat_specs(max(requests, 2 * c), PACED_MAX_TOKENS, "smollm2-135m-instruct")
                point = measure("chain", service.base_url, service.pid, specs, c)
                rows.append({"interval_ms": interval_ms, **point.summary()})
                print(json.dumps(rows[-1]), flush=True)
    return rows


def run_vllm(work: Path, concurrency: Sequence[int], requests: int, seed: int) -> dict:
    """The chain and vLLM alone, identical prompts, the cores split (see the module doc)."""
    os.sched_setaffinity(0, {0})  # the load generator shares core 0 with the serving side
    port = free_port()
    overrides = {"generator.cpu_binding": ["1"], "ingress.max_in_flight_requests": 200}
    config = write_variant(ROOT / "serve_config.yaml", overrides, work / "vllm-chain.yaml", port)
    _, application = first_application(config)
    app_config = parse_config(application["args"])
    model = app_config.generator.model_id
    jobs = {c: chat_specs(max(requests, 2 * c), VLLM_MAX_TOKENS, model, offset=100 * c,
                          include_context=True)
            for c in concurrency}  # fmt: skip
    chain_points, prompts = {}, {}
    with started_service(config, port, work / "vllm-chain.serve.log", launcher=PIN) as service:
        warm_chain(service.base_url)
        for c, specs in jobs.items():
            chain_points[c] = measure("chain", service.base_url, service.pid, specs, c)
            prompts[c] = [
                final_prompt(record, app_config.prompt.system_prompt)
                for record in chain_points[c].records
            ]
    generator = app_config.generator
    vllm_port = free_port()
    argv = [
        *PIN,
        *vllm_serve_argv(
            sys.executable,
            resolve_model_reference(generator.model_source, ROOT),
            generator,
            "127.0.0.1",
            vllm_port,
        ),
    ]
    env = vllm_environment(
        dict(os.environ), application.get("runtime_env", {}).get("env_vars", {}), generator
    ) | {"VLLM_CPU_OMP_THREADS_BIND": "1"}
    rows = []
    url = f"http://127.0.0.1:{vllm_port}"
    with running_vllm(argv, env, url, work / "vllm-alone.log", 600):
        pid = listening_pid(vllm_port)
        httpx.post(
            f"{url}/v1/chat/completions",
            json={"model": model, "messages": list(prompts[concurrency[0]][0][0]), "max_tokens": 4},
            timeout=600,
        )  # warm-up: kernels and the system prompt's cached blocks, as the chain had
        for c, specs in jobs.items():
            alone_specs = [
                RequestSpec(
                    "chat", spec.question, spec.max_tokens, model=model,
                    messages=tuple(messages), temperature=0.0,
                )
                for spec, (messages, _) in zip(specs, prompts[c], strict=True)
            ]  # fmt: skip
            direct = measure("alone", url, pid, alone_specs, c)
            chain_tokens = [tokens for _, tokens in prompts[c]]
            alone_tokens = [r.usage_prompt_tokens for r in direct.records]
            rows.append(
                {
                    "concurrency": c,
                    "chain": chain_points[c].summary(),
                    "alone": direct.summary(),
                    "added": compare(chain_points[c], direct, seed),
                    "prompt_tokens_equal": sum(
                        a == b for a, b in zip(chain_tokens, alone_tokens, strict=True)
                    ),
                    "prompts": len(chain_tokens),
                }
            )
            print(json.dumps(rows[-1]["added"]), rows[-1]["prompt_tokens_equal"], flush=True)
    return {"rows": rows, "max_tokens": VLLM_MAX_TOKENS}


def final_prompt(record: RequestRecord, system_prompt: str) -> tuple[list[dict[str, str]], int]:
    """The chain's final messages for one answered request, rebuilt from what it reported
    (include_context: the passages it sent, with their sources' titles, in prompt order,
    and the question), and its prompt token count. Rebuilt from the measured request
    itself, so neither side has seen the prompt before it is measured."""
    if record.passages is None or record.usage_prompt_tokens is None:
        raise RuntimeError(f"request {record.index} reported no context: {record.error}")
    sources = [_Source(chunk_id, title, text) for chunk_id, title, text in record.passages]
    messages = build_messages(system_prompt, sources, record.question.strip())
    return messages, record.usage_prompt_tokens


@dataclass(frozen=True)
class _Source:
    chunk_id: str
    title: str
    text: str


def listening_pid(port: int) -> int:
    """The pid of the process listening on TCP `port` on this machine."""
    for connection in psutil.net_connections("tcp"):
        if connection.laddr and connection.laddr.port == port and connection.pid:
            return connection.pid
    raise RuntimeError(f"nothing listens on port {port}")


def run_micro(repeats: int = 2000) -> dict[str, float]:
    """Microseconds per call, p50 over `repeats` calls, of the admission path's parts."""
    from app.admission import BodySizeLimit, InFlightGate, KeyRateLimiter
    from app.guard import RequestGuard
    from app.settings import Settings

    class State:
        settings = Settings(environment="production", api_keys=("k" * 32,))
        rate_limiter = KeyRateLimiter(1e9, 10**9)

        @staticmethod
        def serve_request_id():
            return "rid"

    app_state = type("AppState", (), {"rag": State()})()
    scope_app = type("App", (), {"state": app_state})()

    async def downstream(scope, receive, send):
        return None

    headers = [(b"authorization", b"Bearer " + b"k" * 32), (b"content-length", b"100")]

    def scope():
        return {
            "type": "http",
            "method": "POST",
            "path": "/v1/rag/query",
            "headers": headers,
            "app": scope_app,
        }

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        return None

    guard = RequestGuard(downstream)
    limit = BodySizeLimit(downstream, 1 << 20, lambda s: {})
    gate = InFlightGate(10)
    loop = asyncio.new_event_loop()

    def timed(call) -> float:
        samples = timeit.repeat(call, number=1, repeat=repeats)
        return 1e6 * sorted(samples)[len(samples) // 2]

    result = {
        "bare_asgi_call_us": timed(
            lambda: loop.run_until_complete(downstream(scope(), receive, send))
        ),
        "guard_us": timed(lambda: loop.run_until_complete(guard(scope(), receive, send))),
        "body_limit_us": timed(lambda: loop.run_until_complete(limit(scope(), receive, send))),
        "gate_enter_leave_us": timed(lambda: _enter_and_leave(gate)),
    }
    loop.close()
    return result


def _enter_and_leave(gate) -> None:
    gate.try_enter()
    gate.leave()


# --- report ------------------------------------------------------------------------------


def markdown(results: dict[str, Any], command: str) -> str:
    out = [f"Measured with `{command}` on {results['date']}.", ""]
    if "paced" in results:
        out += [
            "**Null engine** (TTFT 50 ms, then a token every 5 or 50 ms, 64 tokens): the chain "
            "against the same engine alone, the same requests, closed loop. Added = chain minus "
            "alone, median of per-request differences, 95% bootstrap CI.",
            "",
            "| TPOT | C | n | TTFT chain / alone ms | TTFT added ms | TPOT chain / alone ms "
            "| TPOT added ms | tokens/s share | CPU ms/request chain / alone | stage work ms | "
            "hops ms (queue + network) |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for row in results["paced"]:
            chain, alone, added = row["chain"], row["alone"], row["added"]
            stages = chain["server_ms_p50"]
            out.append(
                f"| {row['tpot_ms']:g} ms | {row['concurrency']} | {added['pairs']} | "
                f"{_f(chain['ttft_ms_p50'])} / {_f(alone['ttft_ms_p50'])} | "
                f"{_ci(added.get('ttft_ms_added'))} | {_f(chain['tpot_ms_p50'], 2)} / "
                f"{_f(alone['tpot_ms_p50'], 2)} | {_ci(added.get('tpot_ms_added'), 2)} | "
                f"{_pct(added.get('throughput_share'))} | {_f(chain['cpu_ms_per_request'])} / "
                f"{_f(alone['cpu_ms_per_request'])} | "
                f"{_f(_sum(stages, 'retrieve', 'compress'))} | "
                f"{_f(_sum(stages, 'queue', 'network'))} |"
            )
        out.append("")
    if "interval" in results:
        out += [
            "**Stream batching interval** (null engine, 5 ms per token, 64 tokens):",
            "",
            "| interval | C | n | TTFT p50 ms | TPOT p50 ms | tokens/s | CPU ms/request |",
            "|---|---|---|---|---|---|---|",
        ]
        out += [
            f"| {row['interval_ms']:g} ms | {row['concurrency']} | {row['n']} | "
            f"{_f(row['ttft_ms_p50'])} | {_f(row['tpot_ms_p50'], 2)} | "
            f"{_f(row['tokens_per_s'])} | {_f(row['cpu_ms_per_request'])} |"
            for row in results["interval"]
        ]
        out.append("")
    if "vllm" in results:
        out += [
            f"**vLLM, identical prompts, cores split** (SmolLM2-135M fp32, max_tokens "
            f"{results['vllm']['max_tokens']}; everything on core 0, vLLM's threads on core 1, on "
            "both sides):",
            "",
            "| C | n | same prompt tokens | TTFT chain / alone ms | TTFT ratio | TPOT chain / "
            "alone ms | TPOT ratio | stage work ms |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for row in results["vllm"]["rows"]:
            chain, alone, added = row["chain"], row["alone"], row["added"]
            out.append(
                f"| {row['concurrency']} | {added['pairs']} | {row['prompt_tokens_equal']}/"
                f"{row['prompts']} | {_f(chain['ttft_ms_p50'])} / {_f(alone['ttft_ms_p50'])} | "
                f"{_ci(added.get('ttft_ms_ratio'), 3)} | {_f(chain['tpot_ms_p50'], 1)} / "
                f"{_f(alone['tpot_ms_p50'], 1)} | {_ci(added.get('tpot_ms_ratio'), 3)} | "
                f"{_f(_sum(chain['server_ms_p50'], 'retrieve', 'compress'))} |"
            )
        out.append("")
    if "micro" in results:
        micro = results["micro"]
        out += [
            "**The admission path, per call** (in-process, p50 of 2,000 calls): "
            + ", ".join(
                f"{name.removesuffix('_us')} {value:.1f} µs" for name, value in micro.items()
            ),
            "",
        ]
    return "\n".join(out)


def _sum(values: dict[str, float | None], *names: str) -> float | None:
    present = [value for name in names if (value := values.get(name)) is not None]
    return sum(present) if len(present) == len(names) else None


def _f(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _ci(interval: list[float] | None, digits: int = 1) -> str:
    if not interval:
        return "-"
    estimate, low, high = interval
    return f"{estimate:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.overhead", description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results/overhead")
    parser.add_argument(
        "--phases", nargs="+", choices=("paced", "interval", "vllm", "micro"),
        default=["micro", "paced", "interval", "vllm"],
    )  # fmt: skip
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 8, 32, 64])
    parser.add_argument("--vllm-concurrency", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    for phase in args.phases:
        print(f"== {phase}", flush=True)
        if phase == "micro":
            results["micro"] = run_micro()
        elif phase == "paced":
            results["paced"] = run_paced(args.out, args.concurrency, args.requests, args.seed)
        elif phase == "interval":
            results["interval"] = run_interval(args.out, args.requests, args.seed)
        else:
            results["vllm"] = run_vllm(args.out, args.vllm_concurrency, args.requests, args.seed)
        (args.out / "overhead.json").write_text(json.dumps(results, indent=2, default=str))
    command = "python -m bench.overhead " + " ".join(argv if argv is not None else sys.argv[1:])
    (args.out / "overhead.md").write_text(markdown(results, command.strip()))
    print((args.out / "overhead.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
