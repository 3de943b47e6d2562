"""Collections under change: how soon an added document is answered from, whether a deleted
one ever comes back, and what continuous ingestion does to the queries (issue 11's goals).

    python -m bench.ingestion [--adds 20] [--delete-queries 1000] [--phase-s 150] \\
        [--phases 4] [--rate R] [--docs-per-job 20] [--seed 0] [--out bench-results/ingestion]

One `serve run` of serve_config.yaml as shipped (CPU: SmolLM2-135M in vLLM inside Ray, one
replica per stage, the real generator: its CPU use competes with the writer's as it would in
production), with only the HTTP port and `collections.root` (a temporary folder, never
indexes/) changed. A collection is created and filled with the 36 documents of data/corpus
(retrieval.documents.load_documents, sent as JSON records). Answers are kept short
(`--max-tokens`, default 2): the figures are about retrieval and the pipeline under
ingestion, not about generating answers. Every query is a non-streaming POST /v1/rag/query
naming the collection, timed on the client (E2E); the service's default top_k (5).

0. Calibration: a few warm-up queries, `--calibrate-queries` one at a time (single-query
   E2E), then `--capacity-queries` closed loop at concurrency 4 (what one generator replica
   sustains, roughly). The load's rate is `--rate-fraction` (0.45) of that throughput,
   unless `--rate` is given.
1. Add, then query (goal: answered from within one publish cycle). `--adds` documents, each
   one invented fact in seeded random words (a place with a made-up name, a count, a
   keeper), added one at a time. t0: the moment the 202 returns. Queries about the fact go
   one after another until one cites the document; the time from t0 to that answer's
   return, and the job's own duration (finished_at - created_at), are recorded. The goal is
   met when every query *sent after its job had finished* cited the document: then the first
   answer after publication always has it. Median, p95, max with a bootstrap 95% CI of the
   median (n = adds).
2. Delete (goal: 0 of 1,000 later queries retrieve it). A fact shown to be retrieved (one
   query, then `--delete-precheck` paraphrases, whose hit rate shows that the check can see
   the document at all) is deleted; once its job has succeeded, `--delete-queries`
   paraphrases (drawn with a fixed seed) run at concurrency `--delete-concurrency`, and any
   answer whose sources hold the document counts against the goal, as does any non-200.
3. Steady load with and without ingestion (goal: 0 failed or hung queries, p99 within 1.5x
   of no ingestion). Open-loop Poisson arrivals (seeded) at the fixed rate, questions from
   bench.questions, over `--phases` phases alternating quiet / ingesting / quiet / ... (ABAB,
   so drift over the run falls on both conditions). In an ingesting phase, jobs run back to
   back, each adding `--docs-per-job` new documents of real text (SQuAD dev paragraphs when
   bench.squad's cache holds them, else data/corpus split into paragraphs; nothing is
   downloaded); a phase ends after `--phase-s` seconds, an ingesting one once the job then
   running has finished, so no job spills into a quiet phase. The same load runs for
   `--warm-up-s` first, not counted: after part 2's different questions, vLLM's prefix cache
   holds none of the load's prompts, and the first quiet phase would pay for refilling it.
   A query belongs to the phase it was sent in; one with no answer within `--hung-s` is
   hung. Per condition: n, p50, p99 E2E of the 200s, non-200s, hung, documents/s; p99 and
   p50 ingesting / quiet with `ratio_ci` (independent samples, 95%). A ratio whose interval
   holds 1 is no detectable difference.

Writes OUT/<label>.json (config, summary, every request and job) and OUT/<label>.md; the
service's log is OUT/<label>.serve.log.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import math
import os
import random
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.bootstrap import Interval, median, paired_ci, quantile, ratio_ci
from bench.outputs import label, positive_float, positive_int, write_json_and_markdown
from bench.questions import DEFAULT_QUESTIONS
from bench.service import ROOT, free_port, started_service
from bench.squad import DEFAULT_CACHE_DIR, SQUAD_DEV_FILENAME, load_squad
from bench.stats import format_ms, percentile
from bench.variant import write_variant
from retrieval.sentences import split_sentences

DEFAULT_OUT = Path("bench-results/ingestion")
COLLECTION = "ingestion-lab"
API_KEY = "bench-ingestion-key-0123456789"
QUIET, INGESTING, WARM_UP = "quiet", "ingesting", "warm-up"
# Goal 3: p99 E2E under ingestion at most this many times that of no ingestion.
P99_RATIO_LIMIT = 1.5
JOB_POLL_S = 0.25
JOB_TIMEOUT_S = 600.0
READY_TIMEOUT_S = 420.0
# Shorter paragraphs (headings, list stubs) are not documents of their own.
MIN_PARAGRAPH_CHARS = 200

PLACES = (
    "lighthouse",
    "library",
    "granary",
    "observatory",
    "monastery",
    "harbour",
    "archive",
    "orchard",
    "foundry",
    "mill",
)
THINGS = (
    "brass lanterns",
    "silver keys",
    "glass jars",
    "copper bells",
    "clay tablets",
    "wool banners",
    "oak barrels",
    "iron anchors",
)
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
REGIONS = ("northern valley", "eastern coast", "southern hills", "western marshes")
_ONSETS = (
    "b",
    "d",
    "f",
    "g",
    "k",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "t",
    "v",
    "z",
    "br",
    "dr",
    "gl",
    "kr",
    "pl",
    "st",
    "th",
    "tr",
    "qu",
)
_VOWELS = ("a", "e", "i", "o", "u", "ae", "ou", "y")
_CODAS = ("", "", "n", "r", "l", "s", "th", "x")


# --- documents -------------------------------------------------------------------------


def pseudo_word(rng: random.Random, syllables: int = 3) -> str:
    """A pronounceable invented word, capitalised (e.g. 'Quaelorvin')."""
    parts = [rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables)]
    return ("".join(parts) + rng.choice(_CODAS)).capitalize()


@dataclass(frozen=True)
class Fact:
    """One invented fact: `count` `things` are kept in the `place` of `name`, counted every
    `day` by `keeper`. Its names occur in no other document."""

    doc_id: str
    name: str
    place: str
    count: int
    things: str
    keeper: str
    day: str
    region: str
    land: str

    @property
    def title(self) -> str:
        return f"The {self.place} of {self.name}"

    @property
    def text(self) -> str:
        return (
            f"{self.name} is a small {self.place} in the {self.region} of {self.land}. "
            f"The {self.place} of {self.name} keeps exactly {self.count} {self.things}. "
            f"Every {self.day} its keeper, {self.keeper}, counts the {self.things} and "
            f"writes the number in a ledger."
        )

    @property
    def question(self) -> str:
        return f"How many {self.things} does the {self.place} of {self.name} keep?"

    @property
    def paraphrases(self) -> tuple[str, ...]:
        """Questions aimed at this document, worded in different ways."""
        return (
            self.question,
            f"Who is the keeper of the {self.place} of {self.name}?",
            f"What does {self.keeper} count every {self.day}?",
            f"Where is {self.name}?",
            f"{self.name} {self.place}",
            f"Tell me about {self.keeper}.",
            f"Which {self.place} keeps {self.count} {self.things}?",
            f"What is kept in the {self.place} of {self.name}?",
            f"How many {self.things} are there in {self.name}?",
            f"Who writes the number of {self.things} in the ledger of {self.name}?",
        )

    def record(self) -> dict[str, str]:
        return {"id": self.doc_id, "title": self.title, "text": self.text}


def invent_facts(n: int, seed: int) -> list[Fact]:
    """`n` facts from `random.Random(seed)`; every invented word is used once."""
    rng = random.Random(seed)
    used: set[str] = set()

    def fresh() -> str:
        while True:
            word = pseudo_word(rng)
            if word not in used:
                used.add(word)
                return word

    return [
        Fact(
            doc_id=f"fact-{i:03d}",
            name=fresh(),
            place=rng.choice(PLACES),
            count=rng.randint(12, 9_999),
            things=rng.choice(THINGS),
            keeper=f"{fresh()} {fresh()}",
            day=rng.choice(DAYS),
            region=rng.choice(REGIONS),
            land=fresh(),
        )
        for i in range(n)
    ]


def paragraphs_from_text(text: str, min_chars: int = MIN_PARAGRAPH_CHARS) -> list[str]:
    """The blank-line separated paragraphs of `text` of at least `min_chars` characters,
    Markdown headings left out, each on one line."""
    paragraphs = []
    for block in text.split("\n\n"):
        lines = [line.strip() for line in block.splitlines() if line.strip()]
        lines = [line for line in lines if not line.startswith("#")]
        paragraph = " ".join(lines)
        if len(paragraph) >= min_chars:
            paragraphs.append(paragraph)
    return paragraphs


@dataclass(frozen=True)
class Passage:
    """A paragraph of real text to ingest: where it came from, a title and the text."""

    source: str
    title: str
    text: str


def load_passages(corpus: Path, squad_file: Path) -> tuple[str, list[Passage]]:
    """(what they are, the passages): SQuAD dev's paragraphs when its cache file exists
    (never downloaded here), else the corpus documents split into paragraphs."""
    if squad_file.is_file():
        squad = load_squad(squad_file)
        return f"SQuAD dev paragraphs ({squad_file})", [
            Passage(p.paragraph_id, p.title.replace("_", " "), p.context) for p in squad.paragraphs
        ]
    from retrieval.documents import load_documents

    passages = [
        Passage(f"{document.doc_id}#{n}", document.title, text)
        for document in load_documents(corpus)
        for n, text in enumerate(paragraphs_from_text(document.text))
    ]
    return f"paragraphs of {corpus}", passages


def load_questions(kind: str, corpus: Sequence[dict[str, str]], seed: int) -> Iterator[str]:
    """The steady load's questions, endlessly. `repeated`: drawn at random from
    bench.questions' few questions, so the same prompts recur and vLLM's prefix cache holds
    whole prompts while the collection stands still. `distinct`: one per sentence of the
    corpus documents, shuffled (then again, reshuffled), so no two queries of a run share
    more than the system prompt unless they retrieve the same chunks."""
    rng = random.Random(seed + 1)
    if kind == "repeated":
        while True:
            yield rng.choice(DEFAULT_QUESTIONS)
    sentences = [
        document["text"][start:end].strip()
        for document in corpus
        for start, end in split_sentences(document["text"])
    ]
    pool = [f"What do the documents say about this: {s}" for s in sentences if len(s) > 20]
    while True:
        rng.shuffle(pool)
        yield from pool


def document_stream(passages: Sequence[Passage], seed: int) -> Iterator[dict[str, str]]:
    """Endless JSON records of new documents: the passages in a seeded order, then again
    in another; every record has an id never used before (`ingest-000000`, ...)."""
    if not passages:
        raise ValueError("no passages to ingest")
    rng = random.Random(seed)
    counter = itertools.count()
    while True:
        order = list(passages)
        rng.shuffle(order)
        for passage in order:
            yield {
                "id": f"ingest-{next(counter):06d}",
                "title": passage.title,
                "text": passage.text,
            }


def take(stream: Iterator[dict[str, str]], k: int) -> list[dict[str, str]]:
    return list(itertools.islice(stream, k))


def phase_plan(phases: int, warm_up: bool = False) -> list[str]:
    """Conditions of `phases` phases, alternating from quiet: quiet, ingesting, quiet, ...;
    with `warm_up`, a warm-up phase (load, no ingestion, not counted) comes first."""
    if phases < 2:
        raise ValueError("at least 2 phases (one of each condition) are needed")
    return [WARM_UP] * warm_up + [QUIET if i % 2 == 0 else INGESTING for i in range(phases)]


def choose_rate(capacity_per_s: float, fraction: float) -> float:
    """The load's arrival rate: `fraction` of the measured capacity, to 2 decimals (at
    least 0.01/s)."""
    if not capacity_per_s > 0:
        raise ValueError(f"capacity must be positive, got {capacity_per_s}")
    return max(0.01, round(capacity_per_s * fraction, 2))


# --- requests --------------------------------------------------------------------------


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
            total = (answer.get("timings_ms") or {}).get("total")
            record.server_total_ms = float(total) if isinstance(total, int | float) else None
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


# --- part 1: add, then query -----------------------------------------------------------


@dataclass
class AddRun:
    """One added fact: its job and the queries that followed until one cited it."""

    doc_id: str
    t0_wall: float
    job: dict[str, Any]
    queries: list[QueryRecord]
    first_cited_s: float | None  # from t0 to the return of the first answer citing it
    timed_out: bool = False

    @property
    def first_cited_sent_s(self) -> float | None:
        """From t0 to the send of the first query whose answer cited the document."""
        for q in self.queries:
            if q.cites(self.doc_id) and q.sent_wall is not None:
                return q.sent_wall - self.t0_wall
        return None

    @property
    def published_s(self) -> float | None:
        """From t0 to the job's finished_at (the new version is served by then)."""
        finished = self.job.get("finished_at")
        return finished - self.t0_wall if finished else None

    @property
    def misses_after_publish(self) -> int:
        """Queries sent after the job had finished whose answer did not cite the document:
        what the goal allows none of."""
        finished = self.job.get("finished_at")
        if not finished:
            return 0
        return sum(
            1
            for q in self.queries
            if q.sent_wall is not None and q.sent_wall >= finished and not q.cites(self.doc_id)
        )


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


def latency_summary(values: Sequence[float]) -> dict[str, Any]:
    """n, median, p95, p99, max and mean of `values` (None figures when there are none)."""
    if not values:
        return {"n": 0, "median": None, "p95": None, "p99": None, "max": None, "mean": None}
    return {
        "n": len(values),
        "median": percentile(values, 50),
        "p95": percentile(values, 95),
        "p99": percentile(values, 99),
        "max": float(max(values)),
        "mean": float(np.mean(values)),
    }


def median_interval(values: Sequence[float], seed: int = 0) -> Interval:
    """The median of `values` with a percentile bootstrap 95% interval (paired_ci against
    zeros: the statistic of the values themselves)."""
    return paired_ci(list(values), [0.0] * len(values), stat=median, seed=seed)


def add_summary(runs: Sequence[AddRun], seed: int = 0) -> dict[str, Any]:
    """Figures of part 1: time to the first citing answer, the job's duration, publication
    (t0 to finished_at), queries needed, and the verdict's inputs."""
    cited = [run.first_cited_s for run in runs if run.first_cited_s is not None]
    durations = [run.job["duration_s"] for run in runs if run.job.get("duration_s") is not None]
    published = [run.published_s for run in runs if run.published_s is not None]
    summary: dict[str, Any] = {
        "adds": len(runs),
        "cited": len(cited),
        "timed_out": sum(run.timed_out for run in runs),
        "jobs_failed": sum(run.job.get("status") != "succeeded" for run in runs),
        "queries": sum(len(run.queries) for run in runs),
        "queries_not_200": sum(not q.ok for run in runs for q in run.queries),
        "misses_after_publish": sum(run.misses_after_publish for run in runs),
        "first_cited_s": latency_summary(cited),
        "first_cited_sent_s": latency_summary(
            [run.first_cited_sent_s for run in runs if run.first_cited_sent_s is not None]
        ),
        "job_duration_s": latency_summary(durations),
        "published_s": latency_summary(published),
        "lag_after_publish_s": latency_summary(
            [
                run.first_cited_s - run.published_s
                for run in runs
                if run.first_cited_s is not None and run.published_s is not None
            ]
        ),
    }
    for name, values in (("first_cited_s", cited), ("job_duration_s", durations)):
        if values:
            summary[name]["median_ci"] = asdict(median_interval(values, seed))
    summary["verdict"] = add_verdict(summary)
    return summary


def add_verdict(summary: dict[str, Any]) -> dict[str, Any]:
    """Met when every added document was cited and no query sent after its job had
    finished missed it: the first answer after each publication cited the new document."""
    met = (
        summary["adds"] > 0
        and summary["cited"] == summary["adds"]
        and summary["misses_after_publish"] == 0
        and summary["jobs_failed"] == 0
    )
    if met:
        text = (
            f"met: all {summary['adds']} added documents were cited by the first query sent "
            "after their job finished (0 misses after publication)"
        )
    else:
        text = (
            f"not met: {summary['cited']}/{summary['adds']} cited, "
            f"{summary['misses_after_publish']} queries sent after publication missed the "
            f"document, {summary['jobs_failed']} jobs failed"
        )
    return {"met": met, "text": text}


# --- part 2: delete --------------------------------------------------------------------


def paraphrase_records(
    fact: Fact, n: int, seed: int, part: str, first_index: int = 0
) -> list[QueryRecord]:
    """`n` questions aimed at `fact`, drawn with replacement from its paraphrases by
    `random.Random(seed)`."""
    rng = random.Random(seed)
    return [
        QueryRecord(part, first_index + i, rng.choice(fact.paraphrases), target=fact.doc_id)
        for i in range(n)
    ]


def delete_summary(
    precheck: Sequence[QueryRecord],
    after: Sequence[QueryRecord],
    doc_id: str,
    job: dict[str, Any],
) -> dict[str, Any]:
    """Figures of part 2: how often the document was retrieved before and after its delete,
    non-200s, and the versions answered from after it."""
    versions = sorted({q.index_version for q in after if q.index_version})
    summary = {
        "doc_id": doc_id,
        "job": job,
        "precheck_n": len(precheck),
        "precheck_retrieved": sum(q.cites(doc_id) for q in precheck),
        "n": len(after),
        "ok": sum(q.ok for q in after),
        "not_ok": sum(not q.ok for q in after),
        "errors": _count(q.error_kind for q in after if not q.ok),
        "retrieved": sum(q.cites(doc_id) for q in after),
        "versions": versions,
        "older_versions": sum(
            1 for q in after if q.index_version and q.index_version != job.get("version")
        ),
        "e2e_ms": latency_summary([q.e2e_ms for q in after if q.ok and q.e2e_ms is not None]),
    }
    summary["verdict"] = delete_verdict(summary)
    return summary


def delete_verdict(summary: dict[str, Any]) -> dict[str, Any]:
    met = (
        summary["n"] > 0
        and summary["retrieved"] == 0
        and summary["not_ok"] == 0
        and summary["job"].get("status") == "succeeded"
    )
    verdict = "met" if met else "not met"
    return {
        "met": met,
        "text": f"{verdict}: {summary['retrieved']}/{summary['n']} queries after the delete "
        f"retrieved it, {summary['ok']}/{summary['n']} answered 200",
    }


# --- part 3: steady load, with and without ingestion -----------------------------------


@dataclass
class PhaseRun:
    index: int
    condition: str
    start_s: float
    end_s: float = math.nan
    jobs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def documents_added(self) -> int:
        return sum(
            int((job.get("counts") or {}).get("added", 0))
            for job in self.jobs
            if job.get("status") == "succeeded"
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


def condition_summary(
    records: Sequence[QueryRecord], phases: Sequence[PhaseRun], condition: str
) -> dict[str, Any]:
    """One condition over all its phases: counts, E2E of the 200s (ms), documents/s."""
    mine = [r for r in records if r.condition == condition]
    e2e = [r.e2e_ms for r in mine if r.ok and r.e2e_ms is not None]
    own = [p for p in phases if p.condition == condition]
    duration = sum(p.duration_s for p in own)
    added = sum(p.documents_added for p in own)
    jobs = [job for p in own for job in p.jobs]
    return {
        "condition": condition,
        "phases": len(own),
        "duration_s": duration,
        "n": len(mine),
        "ok": len(e2e),
        "not_200": sum(1 for r in mine if r.status is not None and r.status != 200),
        "hung": sum(r.hung for r in mine),
        "other_failures": sum(1 for r in mine if not r.ok and r.status is None and not r.hung),
        "errors": _count(r.error_kind for r in mine if not r.ok),
        "degraded": sum(1 for r in mine if r.degraded),
        "offered_per_s": len(mine) / duration if duration > 0 else None,
        "e2e_ms_p50": percentile(e2e, 50) if e2e else None,
        "e2e_ms_p99": percentile(e2e, 99) if e2e else None,
        "e2e_ms_max": max(e2e) if e2e else None,
        "versions": len({r.index_version for r in mine if r.index_version}),
        "jobs": len(jobs),
        "jobs_failed": sum(1 for job in jobs if job.get("status") != "succeeded"),
        "documents_added": added,
        "documents_per_s": added / duration if duration > 0 else 0.0,
        "job_duration_s": latency_summary([j["duration_s"] for j in jobs if j.get("duration_s")]),
    }


def load_summary(
    records: Sequence[QueryRecord], phases: Sequence[PhaseRun], seed: int = 0
) -> dict[str, Any]:
    """Both conditions and the ingesting / quiet ratios of p99 and p50 E2E with 95% CIs."""
    summary: dict[str, Any] = {
        "conditions": {c: condition_summary(records, phases, c) for c in (QUIET, INGESTING)},
        "phases": [
            {
                "index": p.index,
                "condition": p.condition,
                "start_s": p.start_s,
                "duration_s": p.duration_s,
                "jobs": len(p.jobs),
                "documents_added": p.documents_added,
                "n": sum(1 for r in records if r.phase == p.index),
                **_phase_e2e([r for r in records if r.phase == p.index]),
            }
            for p in phases
        ],
    }
    e2e = {
        c: [r.e2e_ms for r in records if r.condition == c and r.ok and r.e2e_ms is not None]
        for c in (QUIET, INGESTING)
    }
    if e2e[QUIET] and e2e[INGESTING]:
        summary["p99_ratio"] = asdict(ratio_ci(e2e[INGESTING], e2e[QUIET], quantile(99), seed=seed))
        summary["p50_ratio"] = asdict(ratio_ci(e2e[INGESTING], e2e[QUIET], median, seed=seed))
    summary["verdict"] = load_verdict(summary)
    return summary


def _phase_e2e(records: Sequence[QueryRecord]) -> dict[str, float | None]:
    e2e = [r.e2e_ms for r in records if r.ok and r.e2e_ms is not None]
    return {
        "e2e_ms_p50": percentile(e2e, 50) if e2e else None,
        "e2e_ms_p99": percentile(e2e, 99) if e2e else None,
    }


def ratio_reading(interval: dict[str, float]) -> str:
    """How a ratio's 95% interval reads."""
    if interval["low"] <= 1 <= interval["high"]:
        return "no detectable difference"
    return "higher under ingestion" if interval["low"] > 1 else "lower under ingestion"


def load_verdict(summary: dict[str, Any], limit: float = P99_RATIO_LIMIT) -> dict[str, Any]:
    """Goal 3: no failed or hung query in either condition, and p99 ingesting / quiet at
    most `limit`: met when the estimate is, and shown with confidence when the interval's
    upper end is too."""
    conditions = summary["conditions"].values()
    failures = sum(c["n"] - c["ok"] for c in conditions)
    hung = sum(c["hung"] for c in conditions)
    ratio = summary.get("p99_ratio")
    no_failures = failures == 0
    if ratio is None:
        return {
            "met": False,
            "no_failures": no_failures,
            "p99_within": None,
            "text": "not measured: a condition has no successful query",
        }
    within = ratio["estimate"] <= limit
    confident = ratio["high"] <= limit
    parts = [
        f"{failures} failed or hung queries ({hung} hung)",
        f"p99 ratio {ratio['estimate']:.2f} [{ratio['low']:.2f}, {ratio['high']:.2f}] "
        + (
            f"<= {limit:g}" + ("" if confident else f", but the interval reaches above {limit:g}")
            if within
            else f"> {limit:g}"
        ),
    ]
    met = no_failures and within
    return {
        "met": met,
        "no_failures": no_failures,
        "p99_within": within,
        "p99_within_confidently": confident,
        "text": ("met: " if met else "not met: ") + "; ".join(parts),
    }


# --- the run ---------------------------------------------------------------------------


def _count(values: Iterable[str | None]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for value in values:
        key = value or "unknown"
        counts[key] = counts.get(key, 0) + 1
    return counts


async def wait_for_every_stage(client: httpx.AsyncClient, timeout_s: float = 300) -> None:
    """/readyz 200 means the required stages run; wait for the optional compressor too."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        response = await client.get("/readyz")
        if response.status_code == 200 and response.json().get("degraded") == []:
            return
        await asyncio.sleep(2)
    raise RuntimeError(f"a stage is still not running after {timeout_s:.0f} s")


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
        await wait_for_every_stage(client)
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


def git_state() -> dict[str, Any]:
    def git(*argv: str) -> str:
        result = subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True)
        return result.stdout.strip()

    return {
        "commit": git("rev-parse", "HEAD"),
        "changed_files": git("status", "--porcelain").splitlines(),
    }


def build_document(
    measured: dict[str, Any], config: dict[str, Any], seed: int, duration_s: float
) -> dict[str, Any]:
    adds: list[AddRun] = measured["adds"]
    deletion = measured["deletion"]
    summary = {
        "rate_per_s": measured["rate_per_s"],
        "rate_source": measured["rate_source"],
        "calibration": measured["calibration"],
        "setup_job": measured["setup_job"],
        "adds": add_summary(adds, seed),
        "delete": None if deletion is None else deletion["summary"],
        "load": load_summary(measured["load_records"], measured["phases"], seed),
        "timings_s": measured["timings_s"],
        "duration_s": duration_s,
    }
    return {
        "config": config,
        "summary": summary,
        "records": {
            "calibration": [asdict(r) for r in measured["calibration_records"]],
            "adds": [
                {
                    **{k: v for k, v in asdict(run).items() if k != "queries"},
                    "queries": [asdict(q) for q in run.queries],
                    "misses_after_publish": run.misses_after_publish,
                    "published_s": run.published_s,
                    "first_cited_sent_s": run.first_cited_sent_s,
                }
                for run in adds
            ],
            "delete": [] if deletion is None else [asdict(r) for r in deletion["records"]],
            "load": [asdict(r) for r in measured["load_records"]],
            "phases": [asdict(p) for p in measured["phases"]],
        },
    }


def _s(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _ci(interval: dict[str, Any] | None, digits: int = 2) -> str:
    if not interval:
        return "-"
    return (
        f"{interval['estimate']:.{digits}f} [{interval['low']:.{digits}f}, "
        f"{interval['high']:.{digits}f}]"
    )


def markdown(document: dict[str, Any]) -> str:
    """The report: set-up, then each goal's table and verdict."""
    config, summary = document["config"], document["summary"]
    calibration, adds, load = summary["calibration"], summary["adds"], summary["load"]
    deletion = summary["delete"]
    single = calibration["single_e2e_ms"]
    lines = [
        "# Collections under change: add, delete, and queries during ingestion",
        "",
        f"{config['date']}, {config['cpu_count']} CPUs (shared), `{config['base']}` as shipped "
        f"(generator `{config['model']}` in vLLM, one replica per stage) with only the HTTP "
        f"port and `collections.root` changed. Collection `{config['collection']}` starts "
        f"with the {config['corpus_documents']} documents of `{config['corpus']}`. Answers are "
        f"capped at {config['max_tokens']} tokens and the service's default top_k is used: "
        "the figures are about retrieval and the pipeline under ingestion, not about "
        "generating answers. Times are client-side (E2E of a non-streaming "
        "`POST /v1/rag/query`). Seed "
        f"{config['seed']}. The run took {summary['duration_s'] / 60:.1f} min.",
        "",
        f"Calibration: one query at a time, E2E median {format_ms(single['median'])} ms "
        f"(n = {single['n']}); closed loop at concurrency {calibration['capacity_concurrency']}: "
        f"{calibration['capacity_per_s']:.2f} queries/s. Load rate: "
        f"**{summary['rate_per_s']:g} queries/s** ({summary['rate_source']}).",
        "",
        "## 1. Add a document, query it within one publish cycle",
        "",
        f"{adds['adds']} documents, each one invented fact, added one at a time; t0 = the add's "
        "202. Queries about the fact run one after another until an answer cites the document.",
        "",
        "| seconds | n | median [95% CI] | p95 | max |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, key in (
        ("t0 -> first answer citing it", "first_cited_s"),
        ("t0 -> send of the first query whose answer cited it", "first_cited_sent_s"),
        ("job duration (finished - created)", "job_duration_s"),
        ("t0 -> job finished (published)", "published_s"),
        ("first citing answer - published", "lag_after_publish_s"),
    ):
        row = adds[key]
        middle = _ci(row.get("median_ci")) if row.get("median_ci") else _s(row["median"])
        lines.append(f"| {name} | {row['n']} | {middle} | {_s(row['p95'])} | {_s(row['max'])} |")
    lines += [
        "",
        f"{adds['queries']} queries ({adds['queries_not_200']} not 200); queries sent after "
        f"the job had finished that did not cite the document: {adds['misses_after_publish']}. "
        f"**Goal 1 {adds['verdict']['text']}.**",
        "",
        "## 2. Delete it: 0 of 1,000 later queries retrieve it",
        "",
    ]
    if deletion is None:
        lines += ["Not measured: no added document was retrieved.", ""]
    else:
        job = deletion["job"]
        e2e = deletion["e2e_ms"]
        lines += [
            f"`{deletion['doc_id']}` was retrieved before the delete by "
            f"{deletion['precheck_retrieved']}/{deletion['precheck_n']} of the paraphrased "
            f"questions (the check can see it). Delete job: {job['status']}, "
            f"{_s(job['duration_s'])} s. Then {deletion['n']} paraphrases (seeded) at "
            f"concurrency {config['delete_concurrency']}:",
            "",
            "| queries | 200 | retrieved the deleted document | versions answered from | "
            "E2E p50 ms | p99 ms |",
            "|---:|---:|---:|---|---:|---:|",
            f"| {deletion['n']} | {deletion['ok']} | {deletion['retrieved']} | "
            f"{', '.join(f'`{v}`' for v in deletion['versions'])} | "
            f"{format_ms(e2e['median'])} | {format_ms(e2e['p99'])} |",
            "",
            f"**Goal 2 {deletion['verdict']['text']}.**",
            "",
        ]
    quiet, ingesting = load["conditions"][QUIET], load["conditions"][INGESTING]
    lines += [
        "## 3. Steady query load during continuous ingestion",
        "",
        f"Open-loop Poisson arrivals at {summary['rate_per_s']:g}/s over {config['phases']} "
        f"phases of {config['phase_s']:g} s, alternating quiet / ingesting (ABAB); in "
        f"ingesting phases, add jobs of {config['docs_per_job']} new documents ran back to "
        f"back ({config['passages']}). Before them, {config['warm_up_s']:g} s of the same load "
        "as warm-up, not counted (it refills vLLM's prefix cache after part 2's other "
        f"questions). A query with no answer within {config['hung_s']:g} s is hung. E2E over "
        "the queries answered 200.",
        "",
        "| condition | phases | s | queries | 200 | non-200 | hung | E2E p50 ms | p99 ms | "
        "max ms | jobs | documents | documents/s | versions seen |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in (quiet, ingesting):
        lines.append(
            f"| {row['condition']} | {row['phases']} | {row['duration_s']:.0f} | {row['n']} | "
            f"{row['ok']} | {row['not_200']} | {row['hung']} | {format_ms(row['e2e_ms_p50'])} "
            f"| {format_ms(row['e2e_ms_p99'])} | {format_ms(row['e2e_ms_max'])} | "
            f"{row['jobs']} | {row['documents_added']} | {row['documents_per_s']:.2f} | "
            f"{row['versions']} |"
        )
    job_s = ingesting["job_duration_s"]
    lines += [
        "",
        f"Add jobs: median {_s(job_s['median'])} s, max {_s(job_s['max'])} s (n = "
        f"{job_s['n']}, {ingesting['jobs_failed']} failed).",
        "",
        "| ingesting / quiet | estimate [95% CI] | n (smaller side) | reading |",
        "|---|---:|---:|---|",
    ]
    for name, key in (("p99 E2E", "p99_ratio"), ("p50 E2E", "p50_ratio")):
        interval = load.get(key)
        if interval:
            lines.append(
                f"| {name} | {_ci(interval)} | {interval['n']} | {ratio_reading(interval)} |"
            )
    lines += [
        "",
        f"**Goal 3 {load['verdict']['text']}.** A p99 from a few hundred queries rests on "
        "its few slowest ones; its interval says how far that carries.",
        "",
        "Per phase:",
        "",
        "| phase | condition | s | queries | E2E p50 ms | p99 ms | jobs | documents |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
        *(
            f"| {p['index']} | {p['condition']} | {p['duration_s']:.0f} | {p['n']} | "
            f"{format_ms(p['e2e_ms_p50'])} | {format_ms(p['e2e_ms_p99'])} | {p['jobs']} | "
            f"{p['documents_added']} |"
            for p in load["phases"]
        ),
        "",
        f"Command: `{config['command']}`",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.ingestion", description=__doc__.splitlines()[0]
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
    from bench.variant import first_application
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


if __name__ == "__main__":
    sys.exit(main())
