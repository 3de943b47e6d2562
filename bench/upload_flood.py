"""What unauthenticated uploads can make the service hold: concurrent chunked 4 MiB
uploads with no key, against the resident memory of Serve's proxy and the ingress replica.

    python -m bench.upload_flood --out docs/results/upload-flood [--requests 256] [--mib 4]
        [--env RAY_SERVE_ENABLE_DIRECT_INGRESS=1 --env RAY_SERVE_ENABLE_HA_PROXY=1]
        [--reader smollm2]

Starts serve_config.yaml as shipped (keys required: RAG_API_KEYS set to a key made for the
run; only the port changed, and with `--reader smollm2` the tests' reader, which starts in
seconds: no upload reaches the generator; `--env` adds variables to `serve run`'s
environment, such as Ray Serve's direct ingress through HAProxy), samples the resident
memory (RSS) of what fronts the ingress (Serve's proxy actor, or HAProxy's processes) and
of the ingress replica every 50 ms, idle for a while, then sends `--requests` uploads at
once to
`/v1/collections/flood/documents`, each a multipart body of `--mib` MiB streamed in 64 KiB
pieces with no Content-Length (chunked), without an Authorization header, and goes on
sampling until all have ended and a while after. Each request's status, time and how much of
its body the client got to send is kept, with every memory sample, in `flood.json`.

The goal it checks (issue 29): every request refused 401 before its body is read, and the
proxy's and the ingress's resident memory together growing by under 50 MB.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench.client import burst, openai_error
from bench.labs import SMOLLM2_GENERATOR, keyed_service, machine, run_name, utc_now, write_run
from bench.tables import markdown_table
from harness.processes import replica_pids, titled

PROXY_TITLE = "ray::ProxyActor"
PIECE = 64 * 1024
SAMPLE_S = 0.05
BOUNDARY = "flood"


def front_pids(root: int) -> list[tuple[int, str]]:
    """What receives the HTTP connections: Serve's proxy actor, or HAProxy's processes."""
    found = [(pid, "Serve proxy") for pid in titled(root, PROXY_TITLE)]
    for process in psutil.Process(root).children(recursive=True):
        try:
            if "haproxy" in process.name().lower():
                found.append((process.pid, "HAProxy"))
        except psutil.NoSuchProcess:
            continue
    return found


class MemorySampler(threading.Thread):
    """RSS of each watched process every SAMPLE_S, as (seconds since start, {name: bytes})."""

    def __init__(self, processes: dict[str, psutil.Process]) -> None:
        super().__init__(daemon=True)
        self.processes = processes
        self.samples: list[tuple[float, dict[str, int]]] = []
        self.started = time.monotonic()
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            now = time.monotonic() - self.started
            self.samples.append((now, {n: p.memory_info().rss for n, p in self.processes.items()}))
            self._done.wait(SAMPLE_S)

    def stop(self) -> None:
        self._done.set()
        self.join()

    def now(self) -> float:
        return time.monotonic() - self.started


async def _body(size: int, sent: list[int], index: int) -> AsyncIterator[bytes]:
    head = (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="files"; '
        f'filename="big-{index}.txt"\r\nContent-Type: text/plain\r\n\r\n'
    ).encode()
    yield head
    sent[index] += len(head)
    left = size
    while left > 0:
        piece = b"x" * min(PIECE, left)
        yield piece
        sent[index] += len(piece)
        left -= len(piece)
    yield f"\r\n--{BOUNDARY}--\r\n".encode()


async def _upload(client: httpx.AsyncClient, index: int, size: int, sent: list[int]) -> dict:
    started = time.perf_counter()
    try:
        response = await client.post(
            "/v1/collections/flood/documents",
            content=_body(size, sent, index),
            headers={"content-type": f"multipart/form-data; boundary={BOUNDARY}"},
        )
        code = (openai_error(response.content) or {}).get("code")
        outcome: dict[str, Any] = {"status": response.status_code, "code": code}
    except httpx.HTTPError as exc:
        outcome = {"status": None, "error": type(exc).__name__}
    outcome |= {"index": index, "ms": (time.perf_counter() - started) * 1e3, "sent": sent[index]}
    return outcome


async def flood(base_url: str, requests: int, size: int) -> list[dict]:
    sent = [0] * requests
    return await burst(base_url, requests, 120, lambda client, i: _upload(client, i, size, sent))


def summarize(samples: list[tuple[float, dict[str, int]]], flood_from: float, flood_to: float):
    """Per process and for both: the idle median RSS before the flood, the peak during it
    (and 2 s after), and the growth, in MB."""
    names = list(samples[0][1])
    idle = [s for t, s in samples if t < flood_from]
    during = [s for t, s in samples if flood_from <= t <= flood_to + 2]
    rows = {}
    for name in [*names, "both"]:

        def rss(sample: dict[str, int], name: str = name) -> int:
            return sum(sample.values()) if name == "both" else sample[name]

        before = statistics.median(rss(s) for s in idle)
        peak = max(rss(s) for s in during)
        rows[name] = {
            "idle_mb": before / 1e6,
            "peak_mb": peak / 1e6,
            "growth_mb": (peak - before) / 1e6,
        }
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--mib", type=float, default=4.0)
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE for serve run")
    parser.add_argument(
        "--reader",
        choices=("shipped", "smollm2"),
        default="shipped",
        help="smollm2: the tests' reader, which starts in seconds (the flood never reaches it)",
    )
    args = parser.parse_args(argv)
    name = run_name("flood", args.env)
    overrides = SMOLLM2_GENERATOR if args.reader == "smollm2" else {}
    with keyed_service(args.out, name, args.env, overrides) as (service, _):
        fronts, ingresses = front_pids(service.pid), replica_pids(service.pid, "RagIngress")
        if not fronts or len(ingresses) != 1:
            raise SystemExit(f"expected a proxy and one ingress, found {fronts} and {ingresses}")
        watched = {f"front {pid} ({kind})": psutil.Process(pid) for pid, kind in fronts}
        sampler = MemorySampler(watched | {"ingress": psutil.Process(ingresses[0])})
        sampler.start()
        time.sleep(args.idle_s)
        flood_from = sampler.now()
        outcomes = asyncio.run(flood(service.base_url, args.requests, int(args.mib * (1 << 20))))
        flood_to = sampler.now()
        time.sleep(args.idle_s)
        sampler.stop()
    memory = summarize(sampler.samples, flood_from, flood_to)
    statuses = Counter(
        str(o["status"] if o["status"] is not None else o.get("error")) for o in outcomes
    )
    sent = [o["sent"] for o in outcomes]
    document = {
        "command": f"python -m bench.upload_flood --out {args.out} --requests {args.requests} "
        f"--mib {args.mib:g}"
        + "".join(f" --env {v}" for v in args.env)
        + (f" --reader {args.reader}" if args.reader != "shipped" else ""),
        "cpu": machine(),
        "measured_at": utc_now(),
        "requests": args.requests,
        "body_bytes": int(args.mib * (1 << 20)),
        "flood_s": flood_to - flood_from,
        "statuses": dict(statuses),
        "memory_mb": memory,
        "outcomes": outcomes,
        "samples": sampler.samples,
    }
    table = markdown_table(
        ["process", "idle RSS MB (median)", "peak RSS MB", "growth MB"],
        [[n, f"{m['idle_mb']:.0f}", f"{m['peak_mb']:.0f}", f"{m['growth_mb']:.1f}"]
         for n, m in memory.items()],
    )  # fmt: skip
    report = (
        f"{args.requests} unauthenticated chunked uploads of {args.mib:g} MiB at once, "
        f"{document['flood_s']:.1f} s; statuses {dict(statuses)}; body bytes the client sent "
        f"before its answer: median {statistics.median(sent) / (1 << 20):.2f} MiB, max "
        f"{max(sent) / (1 << 20):.2f} MiB of {args.mib:g}. RSS sampled every "
        f"{SAMPLE_S * 1e3:.0f} ms ({len(sampler.samples)} samples), {document['cpu']}.\n\n"
        f"{table}\n"
    )
    write_run(args.out, name, document, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
