"""deployments.collection_metrics against a fake `ray.serve.metrics` that checks what Ray's
does (declared tag keys only, every one given; counters refuse increments of zero or less);
the real export runs in tests/integration/test_monitoring.py."""

from __future__ import annotations

import types
from typing import Any

import pytest
import ray.serve

from corpus.ingestion import JobRecord
from deployments.collection_metrics import IngestionMetrics, VersionLoadMetrics


class _Metric:
    def __init__(
        self,
        name: str,
        description: str = "",
        boundaries: list[float] | None = None,
        tag_keys: tuple[str, ...] = (),
    ) -> None:
        self.name = name
        self.tag_keys = tuple(tag_keys)
        self.recorded: list[tuple[float, dict[str, str]]] = []
        registry[name] = self

    def _record(self, value: float, tags: dict[str, str] | None) -> None:
        tags = dict(tags or {})
        assert set(tags) == set(self.tag_keys), (self.name, tags, self.tag_keys)
        self.recorded.append((value, tags))


class FakeCounter(_Metric):
    def inc(self, value: float = 1.0, tags: dict[str, str] | None = None) -> None:
        if value <= 0:
            raise ValueError(f"value must be >0, got {value}")
        self._record(value, tags)


class FakeHistogram(_Metric):
    def observe(self, value: float, tags: dict[str, str] | None = None) -> None:
        self._record(value, tags)


registry: dict[str, Any] = {}


@pytest.fixture(autouse=True)
def fake_metrics(monkeypatch):
    registry.clear()
    fake = types.SimpleNamespace(Counter=FakeCounter, Histogram=FakeHistogram)
    monkeypatch.setattr(ray.serve, "metrics", fake)
    return registry


def job(**changes: Any) -> JobRecord:
    record = JobRecord(
        id="job-1",
        collection="notes",
        action="add",
        status="succeeded",
        created_at=100.0,
        started_at=102.5,
        finished_at=106.0,
        counts={"received": 3, "unreadable": 1, "added": 2, "replaced": 0, "deleted": 0,
                "not_found": 0, "documents": 2, "chunks": 4, "embedded_chunks": 4},
    )  # fmt: skip
    for name, value in changes.items():
        setattr(record, name, value)
    return record


def test_a_finished_job_is_counted_timed_and_its_documents_by_outcome():
    metrics = IngestionMetrics()

    metrics.observe(job())

    assert registry["rag_ingestion_jobs"].recorded == [
        (1.0, {"action": "add", "status": "succeeded"})
    ]
    assert registry["rag_ingestion_job_seconds"].recorded == [(3.5, {"action": "add"})]
    assert registry["rag_ingestion_queue_seconds"].recorded == [(2.5, {})]
    # Zeros are skipped (Ray refuses them); totals and chunk counts are no outcome.
    assert registry["rag_ingestion_documents"].recorded == [
        (2, {"outcome": "added"}),
        (1, {"outcome": "unreadable"}),
    ]


def test_a_failed_delete_job_without_counts():
    metrics = IngestionMetrics()

    metrics.observe(job(action="delete", status="failed", counts={}))

    assert registry["rag_ingestion_jobs"].recorded == [
        (1.0, {"action": "delete", "status": "failed"})
    ]
    assert registry["rag_ingestion_job_seconds"].recorded == [(3.5, {"action": "delete"})]
    assert registry["rag_ingestion_documents"].recorded == []


def test_a_delete_counts_deleted_and_not_found():
    metrics = IngestionMetrics()

    metrics.observe(job(action="delete", counts={"deleted": 1, "not_found": 2}))

    assert registry["rag_ingestion_documents"].recorded == [
        (1, {"outcome": "deleted"}),
        (2, {"outcome": "not_found"}),
    ]


def test_an_unfinished_job_is_not_recorded():
    metrics = IngestionMetrics()

    metrics.observe(job(status="running", finished_at=None))

    assert all(not metric.recorded for metric in registry.values())


def test_a_job_that_never_started_is_counted_without_times():
    metrics = IngestionMetrics()

    metrics.observe(job(status="failed", started_at=None, counts={}))

    assert len(registry["rag_ingestion_jobs"].recorded) == 1
    assert registry["rag_ingestion_job_seconds"].recorded == []
    assert registry["rag_ingestion_queue_seconds"].recorded == []


def test_version_loads_are_counted_and_timed_without_the_collection():
    metrics = VersionLoadMetrics()

    metrics.observe_load("notes", 42.0)
    metrics.observe_load("other", 7.0, "background")

    assert registry["rag_collection_version_loads"].recorded == [(1.0, {}), (1.0, {})]
    assert registry["rag_collection_version_load_ms"].recorded == [(42.0, {}), (7.0, {})]


def test_no_metric_is_labelled_by_collection():
    IngestionMetrics()
    VersionLoadMetrics()

    assert registry
    assert all("collection" not in metric.tag_keys for metric in registry.values())
