"""The lab's HTTP side: one query or many, timed on the client, and ingestion jobs
submitted and awaited."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

JOB_POLL_S = 0.25


JOB_TIMEOUT_S = 600.0


@dataclass
class QueryRecord:
    """One query as the client saw it. `*_s` are seconds from the run's start (monotonic
    clock), `sent_wall` the send time as Unix seconds (to compare with a job's times)."""

    part: str
    index: int
    question: str
    phase: int | None = None
    condition: str | None = None
    target: str | None = None
    scheduled_s: float | None = None
    sent_s: float | None = None
    sent_wall: float | None = None
    e2e_ms: float | None = None
    status: int | None = None
    error_kind: str | None = None
    error: str | None = None
    index_version: str | None = None
    doc_ids: list[str] = field(default_factory=list)
    degraded: str | None = None
    server_total_ms: float | None = None
    # The service's own figures: timings_ms (retrieve, compress, queue, ttft, total, ...)
    # and the prompt's tokens, to see which stage a slowdown is in.
    timings_ms: dict[str, float] = field(default_factory=dict)
    prompt_tokens: int | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error_kind is None

    @property
    def hung(self) -> bool:
        return self.error_kind == "hung"

    def cites(self, doc_id: str) -> bool:
        return doc_id in self.doc_ids


@dataclass
class Clock:
    """The run's origin on the monotonic clock."""

    origin: float = field(default_factory=time.perf_counter)

    def now_s(self) -> float:
        return time.perf_counter() - self.origin


async def ask(
    client: httpx.AsyncClient,
    record: QueryRecord,
    clock: Clock,
    *,
    collection: str,
    max_tokens: int,
    hung_s: float,
    top_k: int | None = None,
) -> QueryRecord:
    """Send `record`'s question and fill in what came back; failures are recorded, never
    raised. No answer within `hung_s` is a hung query."""
    body: dict[str, Any] = {
        "question": record.question,
        "collection": collection,
        "max_tokens": max_tokens,
    }
    if top_k is not None:
        body["top_k"] = top_k
    record.sent_s, record.sent_wall = clock.now_s(), time.time()
    started = time.perf_counter()
    try:
        async with asyncio.timeout(hung_s):
            response = await client.post("/v1/rag/query", json=body)
        record.status = response.status_code
        if response.status_code != 200:
            record.error_kind = f"http_{response.status_code}"
            record.error = response.text[:500]
        else:
            answer = response.json()
            record.index_version = answer.get("index_version")
            record.doc_ids = [str(source.get("doc_id")) for source in answer.get("sources", [])]
            record.degraded = answer.get("degraded")
            timings = answer.get("timings_ms") or {}
            record.timings_ms = {
                k: float(v) for k, v in timings.items() if isinstance(v, int | float)
            }
            record.server_total_ms = record.timings_ms.get("total")
            prompt_tokens = (answer.get("usage") or {}).get("prompt_tokens")
            record.prompt_tokens = prompt_tokens if isinstance(prompt_tokens, int) else None
    except TimeoutError:
        record.error_kind, record.error = "hung", f"no answer within {hung_s:g} s"
    except httpx.HTTPError as exc:
        record.error_kind, record.error = "transport", f"{type(exc).__name__}: {exc}"[:500]
    except ValueError as exc:
        record.error_kind, record.error = "protocol", f"malformed body: {exc}"[:500]
    record.e2e_ms = (time.perf_counter() - started) * 1000
    return record


async def ask_all(
    client: httpx.AsyncClient,
    records: Sequence[QueryRecord],
    clock: Clock,
    concurrency: int,
    **options: Any,
) -> list[QueryRecord]:
    """`records` in a closed loop at `concurrency`."""
    gate = asyncio.Semaphore(concurrency)

    async def one(record: QueryRecord) -> QueryRecord:
        async with gate:
            return await ask(client, record, clock, **options)

    return list(await asyncio.gather(*(one(record) for record in records)))


class JobFailed(RuntimeError):
    """A job request was refused, or the job did not finish in time."""


async def submit(
    client: httpx.AsyncClient, method: str, path: str, body: dict[str, Any] | None = None
) -> tuple[dict[str, Any], float]:
    """(the job as the 202 answered it, Unix time when the 202 returned)."""
    response = await client.request(method, path, json=body)
    returned = time.time()
    if response.status_code != 202:
        raise JobFailed(f"{method} {path}: {response.status_code} {response.text[:500]}")
    return response.json(), returned


async def job_status(client: httpx.AsyncClient, job_id: str) -> dict[str, Any]:
    response = await client.get(f"/v1/jobs/{job_id}")
    if response.status_code != 200:
        raise JobFailed(f"GET /v1/jobs/{job_id}: {response.status_code} {response.text[:500]}")
    return response.json()


async def finished_job(
    client: httpx.AsyncClient, job_id: str, timeout_s: float = JOB_TIMEOUT_S
) -> dict[str, Any]:
    """Poll the job until it has succeeded or failed; JobFailed after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = await job_status(client, job_id)
        if job["status"] in ("succeeded", "failed"):
            return job
        await asyncio.sleep(JOB_POLL_S)
    raise JobFailed(f"job {job_id} not finished after {timeout_s:.0f} s")


def job_row(job: dict[str, Any], returned_wall: float | None = None) -> dict[str, Any]:
    """The parts of a finished job the report keeps, with its durations in seconds."""
    created, started, finished = (
        job.get("created_at"),
        job.get("started_at"),
        job.get("finished_at"),
    )
    row = {key: job.get(key) for key in ("id", "action", "status", "version", "counts", "errors")}
    row |= {
        "created_at": created,
        "started_at": started,
        "finished_at": finished,
        "returned_at": returned_wall,
    }
    row["duration_s"] = finished - created if finished and created else None
    row["run_s"] = finished - started if finished and started else None
    return row
