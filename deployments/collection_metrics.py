"""Collections as Ray Serve metrics: ingestion jobs at the writer, version loads at the
retrievers (Prometheus via Ray's metrics export, like deployments/metrics.py).

No metric is labelled by collection: collection names are the users' own and unbounded, and
every name would be a set of series for good. Jobs and documents are counted by action,
status and outcome (a handful of values each); a job's collection is in its record
(`GET /v1/jobs/{id}`) and the writer's log.
"""

from __future__ import annotations

from corpus.ingestion import JobRecord

# Seconds: a job of a few short documents takes about a second on CPU, a large upload minutes.
_JOB_BOUNDARIES_S = [0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800]
_QUEUE_BOUNDARIES_S = [0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800]
_LOAD_BOUNDARIES_MS = [5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000]
# JobRecord.counts keys counted as documents, by outcome (the others, `received`,
# `documents`, `chunks` and `embedded_chunks`, are totals or chunks, not outcomes).
DOCUMENT_OUTCOMES = ("added", "replaced", "deleted", "unreadable", "not_found")


class IngestionMetrics:
    """The collection writer's jobs; created inside the writer replica (Ray metrics need a
    running worker)."""

    def __init__(self) -> None:
        from ray.serve import metrics

        self._jobs = metrics.Counter(
            "rag_ingestion_jobs",
            description="Ingestion jobs finished, by action (add|delete) and status "
            "(succeeded|failed).",
            tag_keys=("action", "status"),
        )
        self._job_s = metrics.Histogram(
            "rag_ingestion_job_seconds",
            description="Time an ingestion job ran: started to finished, by action.",
            boundaries=_JOB_BOUNDARIES_S,
            tag_keys=("action",),
        )
        self._queue_s = metrics.Histogram(
            "rag_ingestion_queue_seconds",
            description="Time an ingestion job waited in the writer's queue before it started.",
            boundaries=_QUEUE_BOUNDARIES_S,
        )
        self._documents = metrics.Counter(
            "rag_ingestion_documents",
            description="Documents of finished ingestion jobs, by outcome "
            "(added|replaced|deleted|unreadable|not_found).",
            tag_keys=("outcome",),
        )

    def observe(self, job: JobRecord) -> None:
        """Record a finished job (the runner's record: status, times and counts)."""
        if not job.finished:
            return
        self._jobs.inc(tags={"action": job.action, "status": job.status})
        if job.started_at is not None:
            if job.finished_at is not None:
                self._job_s.observe(
                    max(0.0, job.finished_at - job.started_at), tags={"action": job.action}
                )
            self._queue_s.observe(max(0.0, job.started_at - job.created_at))
        for outcome in DOCUMENT_OUTCOMES:
            # Ray counters reject increments of zero.
            count = job.counts.get(outcome, 0)
            if count > 0:
                self._documents.inc(count, tags={"outcome": outcome})


class VersionLoadMetrics:
    """A retriever replica opening a collection's newly published version
    (corpus.catalog.RetrieverCatalog's `on_load`), whether a query waited for it or it
    was opened in the background; created inside the replica.

    One series, not one per path: a series a single opening creates shows no increase to
    Prometheus's rate(), and most replicas open few versions. The catalog's log says which
    path each opening took."""

    def __init__(self) -> None:
        from ray.serve import metrics

        self._loads = metrics.Counter(
            "rag_collection_version_loads",
            description="Collection versions a retriever replica opened (on the query path or "
            "in the background).",
        )
        self._load_ms = metrics.Histogram(
            "rag_collection_version_load_ms",
            description="Time a retriever replica took to open a collection's new version.",
            boundaries=_LOAD_BOUNDARIES_MS,
        )

    def observe_load(self, collection: str, ms: float, path: str = "query") -> None:
        """Neither `collection` (unbounded) nor `path` is a label: see the class."""
        del collection, path
        self._loads.inc()
        self._load_ms.observe(ms)
