"""Figures and verdicts of the three goals from the records (no service)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from bench.bootstrap import Interval, median, paired_ci, quantile, ratio_ci
from bench.ingestion.client import QueryRecord
from bench.stats import percentile

QUIET, INGESTING, WARM_UP = "quiet", "ingesting", "warm-up"


# Goal 3: p99 E2E under ingestion at most this many times that of no ingestion.
P99_RATIO_LIMIT = 1.5
# The service's timings_ms the per-phase table gives medians of.
PHASE_STAGES = ("retrieve", "compress", "queue", "ttft")


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
    """E2E p50/p99 of the phase's answers, and the medians of the service's own stage
    times and prompt tokens (None where no answer carried them)."""
    ok = [r for r in records if r.ok]
    e2e = [r.e2e_ms for r in ok if r.e2e_ms is not None]

    def p50(values: list[float]) -> float | None:
        return percentile(values, 50) if values else None

    figures = {
        "e2e_ms_p50": p50(e2e),
        "e2e_ms_p99": percentile(e2e, 99) if e2e else None,
        "prompt_tokens_p50": p50([float(r.prompt_tokens) for r in ok if r.prompt_tokens]),
    }
    for stage in PHASE_STAGES:
        figures[f"{stage}_ms_p50"] = p50([r.timings_ms[stage] for r in ok if stage in r.timings_ms])
    return figures


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


def _count(values: Iterable[str | None]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for value in values:
        key = value or "unknown"
        counts[key] = counts.get(key, 0) + 1
    return counts
