"""How fast the service refuses what it cannot take: a burst of concurrent queries past its
admission limit, timed at the client from send to the response's headers.

    python -m bench.refusal --out docs/results/refusal [--requests 150] [--without-key]
        [--env RAY_SERVE_ENABLE_DIRECT_INGRESS=1 --env RAY_SERVE_ENABLE_HA_PROXY=1]

Starts serve_config.yaml as shipped (keys required; only the port changed; `--env` adds
variables to `serve run`'s environment), warms it up, then sends `--requests`
`/v1/rag/query` at once with a valid key (`max_tokens` 32). The ingress admits what the
generators can take and refuses the rest with 503 and Retry-After; what matters to a client
is how soon it hears so, and that the refusal is in the OpenAI error shape. Every request's
status, error code, body shape and time are kept in `<name>.json`; the table gives the
time to refuse (p50, p99 with 95% bootstrap intervals) and the statuses.

`--without-key` sends the same burst with no key: every query is refused 401 by the key
check in Serve's proxy before any routing (app.proxy_guard), so its times are the floor of
a refusal through the proxy at this concurrency, on this machine, with this client.

The goal it checks (issue 29): p99 time-to-refuse <= 100 ms at 150 concurrent requests,
and no response >= 500 other than 503.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.client import QUERY_PATH, auth_headers, burst, warm_up
from bench.labs import keyed_service, machine, run_name, utc_now, write_run
from bench.stats import fmt_interval, interval_dict, one_sample, quantile
from bench.tables import markdown_table

QUESTION = "How does prefix caching lower the time to first token?"


# The client's timeline of a request (httpcore's trace events): when it started, its
# connection was open, its request was written, and its response's headers were read.
TIMELINE = {
    "connection.connect_tcp.complete": "connected",
    "http11.send_request_body.complete": "sent",
    "http11.receive_response_headers.complete": "headers",
}


async def _query(client: httpx.AsyncClient, key: str | None) -> dict[str, Any]:
    """One query, timed to its response's headers, with its status, error shape and its
    client-side timeline (`at`: perf_counter stamps)."""
    body = {"question": QUESTION, "max_tokens": 32}
    started = time.perf_counter()
    at = {"started": started}

    async def trace(event: str, info: dict[str, Any]) -> None:
        if event in TIMELINE:
            at[TIMELINE[event]] = time.perf_counter()

    try:
        request = client.build_request(
            "POST", QUERY_PATH, json=body, headers=auth_headers(key), extensions={"trace": trace}
        )
        response = await client.send(request, stream=True)
        headers_ms = (time.perf_counter() - started) * 1e3
        content = await response.aread()
        await response.aclose()
    except httpx.HTTPError as exc:
        return {"status": None, "error": type(exc).__name__, "ms": None}
    outcome: dict[str, Any] = {"status": response.status_code, "ms": headers_ms, "at": at}
    try:
        error = json.loads(content).get("error")
        outcome["shape"] = "openai" if isinstance(error, dict) else "json"
        outcome["code"] = error.get("code") if isinstance(error, dict) else None
    except ValueError:
        outcome |= {"shape": "not json", "code": None, "text": content[:120].decode("latin-1")}
    outcome["retry_after"] = response.headers.get("retry-after")
    return outcome


def timeline_table(refused: list[dict[str, Any]]) -> str:
    """The refused requests' client-side timeline, ms since the burst began: p50 and p99 of
    each step (started, connected, sent, headers)."""
    rows = []
    for step in ("started", *TIMELINE.values()):
        times = [o["timeline_ms"][step] for o in refused if step in o.get("timeline_ms", {})]
        if times:
            p50, p99 = (quantile(q)(np.asarray(times)) for q in (50, 99))
            rows.append([step, len(times), f"{p50:.0f}", f"{p99:.0f}"])
    header = ["refused requests' step, ms since the burst began", "n", "p50", "p99"]
    return markdown_table(header, rows, numeric=(1, 2, 3))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--requests", type=int, default=150)
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE for serve run")
    parser.add_argument("--without-key", action="store_true", help="The burst sends no key.")
    args = parser.parse_args(argv)
    name = run_name("refusal-without-key" if args.without_key else "refusal", args.env)
    with keyed_service(args.out, name, args.env) as (service, key):
        warm_up(service.base_url, (QUESTION,), api_key=key)  # kernel warm-up: not timed
        started = time.perf_counter()
        sent_key = None if args.without_key else key
        queries = burst(service.base_url, args.requests, 300, lambda c, _: _query(c, sent_key))
        outcomes = asyncio.run(queries)
        burst_s = time.perf_counter() - started
    for outcome in outcomes:  # the timeline in ms since the burst began
        outcome["timeline_ms"] = {
            name: (stamp - started) * 1e3 for name, stamp in outcome.pop("at", {}).items()
        }
    statuses = Counter(
        f"{o['status']} {o.get('code') or ''} ({o.get('shape', o.get('error'))})".strip()
        for o in outcomes
    )
    refusal = 401 if args.without_key else 503
    refused = [o["ms"] for o in outcomes if o["status"] == refusal and o["ms"] is not None]
    p99 = one_sample(refused, quantile(99))
    p50 = one_sample(refused, quantile(50))
    document = {
        "command": f"python -m bench.refusal --out {args.out} --requests {args.requests}"
        + (" --without-key" if args.without_key else "")
        + "".join(f" --env {v}" for v in args.env),
        "cpu": machine(),
        "measured_at": utc_now(),
        "requests": args.requests,
        "burst_s": burst_s,
        "statuses": dict(statuses),
        "refused_ms_p50": interval_dict(p50),
        "refused_ms_p99": interval_dict(p99),
        "outcomes": outcomes,
    }
    table = markdown_table(
        ["status (shape)", "requests"], [[s, n] for s, n in sorted(statuses.items())], numeric=(1,)
    )
    report = (
        f"{args.requests} concurrent queries {'without a' if args.without_key else 'with a valid'}"
        f" key, {burst_s:.1f} s until the last answer, {document['cpu']}. Time to a "
        f"{refusal}'s headers at the client: p50 "
        f"{fmt_interval(p50, 0)} ms, p99 {fmt_interval(p99, 0)} ms.\n\n{table}\n\n"
        f"{timeline_table([o for o in outcomes if o['status'] == refusal])}\n"
    )
    write_run(args.out, name, document, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
