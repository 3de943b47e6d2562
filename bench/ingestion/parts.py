"""The lab's parts against a running service: calibration, add-then-query, delete, and the
steady load with and without ingestion."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import time
from collections.abc import Iterator, Sequence
from typing import Any

import httpx

from bench.ingestion.client import (
    Clock,
    JobFailed,
    QueryRecord,
    ask,
    ask_all,
    finished_job,
    job_row,
    job_status,
    submit,
)
from bench.ingestion.inputs import (
    Fact,
    Passage,
    document_stream,
    invent_facts,
    load_questions,
    paraphrase_records,
    take,
)
from bench.ingestion.summary import (
    INGESTING,
    QUIET,
    WARM_UP,
    AddRun,
    PhaseRun,
    delete_summary,
    latency_summary,
)
from harness.service import wait_for_every_stage

COLLECTION = "ingestion-lab"
API_KEY = "bench-ingestion-key-0123456789"


def phase_plan(phases: int, warm_up: bool = False) -> list[str]:
    """Conditions of `phases` phases in ABBA order from quiet: quiet, ingesting, ingesting,
    quiet, quiet, ingesting, ... (a drift linear in time then falls equally on both
    conditions when `phases` is a multiple of 4); with `warm_up`, a warm-up phase (load, no
    ingestion, not counted) comes first."""
    if phases < 2:
        raise ValueError("at least 2 phases (one of each condition) are needed")
    plan = [QUIET if (i + 1) // 2 % 2 == 0 else INGESTING for i in range(phases)]
    return [WARM_UP] * warm_up + plan


def choose_rate(capacity_per_s: float, fraction: float) -> float:
    """The load's arrival rate: `fraction` of the measured capacity, to 2 decimals (at
    least 0.01/s)."""
    if not capacity_per_s > 0:
        raise ValueError(f"capacity must be positive, got {capacity_per_s}")
    return max(0.01, round(capacity_per_s * fraction, 2))


async def add_and_find(
    client: httpx.AsyncClient,
    fact: Fact,
    clock: Clock,
    *,
    collection: str,
    max_tokens: int,
    hung_s: float,
    timeout_s: float,
    first_index: int,
) -> AddRun:
    """POST the fact, then query it one query after another until an answer cites it."""
    job, t0_wall = await submit(
        client, "POST", f"/v1/collections/{collection}/documents", {"documents": [fact.record()]}
    )
    t0 = time.perf_counter()
    queries: list[QueryRecord] = []
    first_cited_s = None
    while time.perf_counter() - t0 < timeout_s:
        record = QueryRecord("add", first_index + len(queries), fact.question, target=fact.doc_id)
        await ask(
            client, record, clock, collection=collection, max_tokens=max_tokens, hung_s=hung_s
        )
        queries.append(record)
        if record.cites(fact.doc_id):
            first_cited_s = time.perf_counter() - t0
            break
        if job["status"] == "failed":
            break
        if job["status"] != "succeeded":
            job = await job_status(client, job["id"])
    job = await finished_job(client, job["id"])
    return AddRun(
        fact.doc_id,
        t0_wall,
        job_row(job, t0_wall),
        queries,
        first_cited_s,
        timed_out=first_cited_s is None,
    )


async def steady_load(
    client: httpx.AsyncClient,
    clock: Clock,
    plan: Sequence[str],
    documents: Iterator[dict[str, str]],
    *,
    collection: str,
    phase_s: float,
    warm_up_s: float,
    rate: float,
    docs_per_job: int,
    questions: Iterator[str],
    seed: int,
    max_tokens: int,
    hung_s: float,
) -> tuple[list[QueryRecord], list[PhaseRun]]:
    """Poisson query arrivals at `rate` over the phases of `plan`; back-to-back add jobs in
    the ingesting ones. A phase lasts `phase_s`, the warm-up `warm_up_s`. Returns every
    query (in arrival order) and every phase."""
    gaps = random.Random(seed)
    phases: list[PhaseRun] = []
    records: list[QueryRecord] = []
    in_flight: set[asyncio.Task] = set()
    stop = asyncio.Event()

    async def arrivals() -> None:
        start = clock.now_s()
        offset = 0.0
        while True:
            delay = start + offset - clock.now_s()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
            if stop.is_set():
                return
            phase = phases[-1]
            record = QueryRecord(
                "load",
                len(records),
                next(questions),
                phase=phase.index,
                condition=phase.condition,
                scheduled_s=start + offset,
            )
            records.append(record)
            task = asyncio.create_task(
                ask(
                    client,
                    record,
                    clock,
                    collection=collection,
                    max_tokens=max_tokens,
                    hung_s=hung_s,
                )
            )
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
            offset += gaps.expovariate(rate)

    phases.append(PhaseRun(0, plan[0], clock.now_s()))
    arriving = asyncio.create_task(arrivals())
    path = f"/v1/collections/{collection}/documents"
    for index, condition in enumerate(plan):
        phase = phases[-1] if index == 0 else PhaseRun(index, condition, clock.now_s())
        if index:
            phases.append(phase)
        print(f"phase {index} ({condition}) at {phase.start_s:.0f} s", flush=True)
        if condition == INGESTING:
            while clock.now_s() - phase.start_s < phase_s:
                batch = {"documents": take(documents, docs_per_job)}
                try:
                    job, returned = await submit(client, "POST", path, batch)
                    phase.jobs.append(job_row(await finished_job(client, job["id"]), returned))
                except (JobFailed, httpx.HTTPError) as exc:  # recorded; the phase goes on
                    phase.jobs.append({"status": "refused", "error": str(exc)[:500]})
                    await asyncio.sleep(1.0)
        else:
            length_s = warm_up_s if condition == WARM_UP else phase_s
            await asyncio.sleep(max(0.0, phase.start_s + length_s - clock.now_s()))
        phase.end_s = clock.now_s()
    stop.set()
    await arriving
    if in_flight:
        await asyncio.gather(*in_flight)
    return records, phases


async def calibrate(
    client: httpx.AsyncClient,
    clock: Clock,
    args: argparse.Namespace,
    collection: str,
    questions: Iterator[str],
) -> tuple[dict[str, Any], list[QueryRecord]]:
    """Single-query E2E (one at a time) and the closed-loop throughput at concurrency 4,
    on questions of the kind the load will ask (`questions`: distinct questions cost more
    than repeated ones, whose whole prompts the prefix cache holds)."""
    options = {"collection": collection, "max_tokens": args.max_tokens, "hung_s": args.hung_s}
    warm = [QueryRecord("warm-up", i, next(questions)) for i in range(3)]
    await ask_all(client, warm, clock, 1, **options)
    single = [QueryRecord("single", i, next(questions)) for i in range(args.calibrate_queries)]
    await ask_all(client, single, clock, 1, **options)
    loop = [QueryRecord("capacity", i, next(questions)) for i in range(args.capacity_queries)]
    started = time.perf_counter()
    await ask_all(client, loop, clock, args.calibrate_concurrency, **options)
    elapsed = time.perf_counter() - started
    ok_loop = [r for r in loop if r.ok]
    single_e2e = [r.e2e_ms for r in single if r.ok and r.e2e_ms is not None]
    figures = {
        "single_e2e_ms": latency_summary(single_e2e),
        "capacity_concurrency": args.calibrate_concurrency,
        "capacity_per_s": len(ok_loop) / elapsed if elapsed > 0 else 0.0,
        "capacity_e2e_ms": latency_summary([r.e2e_ms for r in ok_loop if r.e2e_ms]),
        "failures": sum(not r.ok for r in [*warm, *single, *loop]),
    }
    return figures, [*warm, *single, *loop]


async def run_parts(
    base_url: str, args: argparse.Namespace, passages: Sequence[Passage]
) -> dict[str, Any]:
    """Set-up, calibration and the three parts against a running service."""
    from retrieval.documents import load_documents

    clock = Clock()
    collection = COLLECTION
    timings: dict[str, float] = {}
    headers = {"authorization": f"Bearer {API_KEY}"}
    timeout = httpx.Timeout(args.hung_s + 30, connect=10)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    async with httpx.AsyncClient(
        base_url=base_url, headers=headers, timeout=timeout, limits=limits, trust_env=False
    ) as client:
        await asyncio.to_thread(wait_for_every_stage, base_url)
        response = await client.post("/v1/collections", json={"name": collection})
        if response.status_code != 201:
            raise JobFailed(f"creating {collection}: {response.status_code} {response.text}")
        corpus = [
            {"id": d.doc_id, "title": d.title, "text": d.text} for d in load_documents(args.corpus)
        ]
        job, returned = await submit(
            client, "POST", f"/v1/collections/{collection}/documents", {"documents": corpus}
        )
        setup_job = job_row(await finished_job(client, job["id"]), returned)
        if setup_job["status"] != "succeeded":
            raise JobFailed(f"the corpus job failed: {setup_job}")
        print(f"collection {collection}: {len(corpus)} corpus documents", flush=True)
        timings["setup_s"] = clock.now_s()

        calibration, calibration_records = await calibrate(
            client,
            clock,
            args,
            collection,
            load_questions(args.load_questions, corpus, args.seed + 3),
        )
        rate = args.rate or choose_rate(calibration["capacity_per_s"], args.rate_fraction)
        print(
            f"calibration: {calibration['single_e2e_ms']['median']:.0f} ms single, "
            f"{calibration['capacity_per_s']:.2f}/s at concurrency "
            f"{args.calibrate_concurrency}; load rate {rate}/s",
            flush=True,
        )
        timings["calibration_s"] = clock.now_s()

        facts = invent_facts(args.adds, args.seed)
        adds: list[AddRun] = []
        for fact in facts:
            run = await add_and_find(
                client,
                fact,
                clock,
                collection=collection,
                max_tokens=args.max_tokens,
                hung_s=args.hung_s,
                timeout_s=args.add_timeout_s,
                first_index=sum(len(a.queries) for a in adds),
            )
            adds.append(run)
            cited = "-" if run.first_cited_s is None else f"{run.first_cited_s:.2f} s"
            print(
                f"add {fact.doc_id}: cited after {cited} ({len(run.queries)} queries), "
                f"job {run.job['duration_s']:.2f} s",
                flush=True,
            )
        timings["adds_s"] = clock.now_s()

        deletion = await delete_part(client, clock, args, collection, facts, adds)
        timings["delete_s"] = clock.now_s()

        documents = document_stream(passages, args.seed)
        load_records, phases = await steady_load(
            client,
            clock,
            phase_plan(args.phases, warm_up=args.warm_up_s > 0),
            documents,
            collection=collection,
            phase_s=args.phase_s,
            warm_up_s=args.warm_up_s,
            rate=rate,
            docs_per_job=args.docs_per_job,
            questions=load_questions(args.load_questions, corpus, args.seed),
            seed=args.seed,
            max_tokens=args.max_tokens,
            hung_s=args.hung_s,
        )
        timings["load_s"] = clock.now_s()

    return {
        "rate_per_s": rate,
        "rate_source": "--rate" if args.rate else f"{args.rate_fraction:g} x measured capacity",
        "setup_job": setup_job,
        "calibration": calibration,
        "timings_s": timings,
        "adds": adds,
        "deletion": deletion,
        "load_records": load_records,
        "phases": phases,
        "calibration_records": calibration_records,
    }


async def delete_part(
    client: httpx.AsyncClient,
    clock: Clock,
    args: argparse.Namespace,
    collection: str,
    facts: Sequence[Fact],
    adds: Sequence[AddRun],
) -> dict[str, Any] | None:
    """Pick a fact that is retrieved, delete it, then query for it."""
    options = {"collection": collection, "max_tokens": args.max_tokens, "hung_s": args.hung_s}
    cited = {run.doc_id for run in adds if run.first_cited_s is not None}
    checks: list[QueryRecord] = []
    target = None
    for fact in facts:
        if fact.doc_id not in cited:
            continue
        check = QueryRecord("delete-check", len(checks), fact.question, target=fact.doc_id)
        checks.append(await ask(client, check, clock, **options))
        if check.cites(fact.doc_id):
            target = fact
            break
    if target is None:
        print("no added document is retrieved: the delete part is skipped", flush=True)
        return None
    precheck = paraphrase_records(target, args.delete_precheck, args.seed + 4, "delete-precheck")
    await ask_all(client, precheck, clock, args.delete_concurrency, **options)
    job, returned = await submit(
        client, "DELETE", f"/v1/collections/{collection}/documents/{target.doc_id}"
    )
    job = job_row(await finished_job(client, job["id"]), returned)
    after = paraphrase_records(target, args.delete_queries, args.seed + 2, "delete")
    await ask_all(client, after, clock, args.delete_concurrency, **options)
    summary = delete_summary(precheck, after, target.doc_id, job)
    print(f"delete {target.doc_id}: {summary['verdict']['text']}", flush=True)
    return {"summary": summary, "records": [*checks, *precheck, *after]}
