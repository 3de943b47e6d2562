"""Ingestion jobs: documents in, the collection's next version published, one job at a time.

A job reads what was sent (JSON records or uploaded files; a document that cannot be read is
reported and skipped, the rest go on), builds the next version from the current one
(corpus.incremental: only new documents are embedded) under the store's writer lock, and
publishes it (corpus.collection_store: the CURRENT switch is the commit point). Every
retriever replica reads CURRENT at the start of each query, so once a job says `succeeded`
no query that starts afterwards is served from an older version.

Job records are kept in memory and written to `<root>/.jobs/<id>.json`, so a job's status
outlives a restart of the writer; a job the writer was running or holding when it stopped is
marked failed when it starts again (its version was never published: the last one is served).
"""

from __future__ import annotations

import copy
import json
import logging
import shutil
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from corpus.collection_store import CollectionNotFound, CollectionStore, write_atomically
from corpus.incremental import DocumentChanges, build_next_version
from corpus.uploads import documents_from_records, parse_upload
from retrieval.chunking import ChunkingParams
from retrieval.documents import Document, DocumentError
from retrieval.embedding import Embedder
from retrieval.index import IndexParams

logger = logging.getLogger(__name__)

JOBS_DIR = ".jobs"
JobStatus = Literal["queued", "running", "succeeded", "failed"]
JobAction = Literal["add", "delete"]


@dataclass(frozen=True)
class Upload:
    """One uploaded file, in the writer's spool (corpus.spool) until its job ends."""

    filename: str
    path: Path
    content_type: str | None = None


@dataclass(frozen=True)
class JobInput:
    """What a job changes: documents to add or replace (JSON records, files) and ids to
    delete."""

    records: tuple[Any, ...] = ()
    files: tuple[Upload, ...] = ()
    deletes: tuple[str, ...] = ()

    @property
    def size(self) -> int:
        return len(self.records) + len(self.files) + len(self.deletes)


@dataclass
class JobRecord:
    """A job's status as `GET /v1/jobs/{id}` shows it."""

    id: str
    collection: str
    action: JobAction
    status: JobStatus = "queued"
    created_at: float = field(default_factory=time.time)
    started_at: float | None = None
    finished_at: float | None = None
    progress: float = 0.0
    counts: dict[str, int] = field(default_factory=dict)
    errors: list[dict[str, str]] = field(default_factory=list)
    version: str | None = None

    @property
    def finished(self) -> bool:
        return self.status in ("succeeded", "failed")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class JobBook:
    """Every job's record: the latest `keep` finished ones and all unfinished ones, in
    memory and in `<root>/.jobs/`."""

    def __init__(self, root: Path, keep: int = 1000) -> None:
        self._folder = Path(root) / JOBS_DIR
        self._folder.mkdir(parents=True, exist_ok=True)
        self._keep = keep
        self._jobs: OrderedDict[str, JobRecord] = OrderedDict()
        # Saved from the job's thread (progress) and the event loop (new jobs).
        self._lock = threading.RLock()
        for path in sorted(self._folder.glob("job-*.json"), key=lambda p: p.stat().st_mtime):
            try:
                job = JobRecord(**json.loads(path.read_text()))
            except (OSError, ValueError, TypeError) as exc:
                logger.warning("unreadable job record %s: %s", path, exc)
                continue
            self._jobs[job.id] = job

    def new(self, collection: str, action: JobAction) -> JobRecord:
        job = JobRecord(id=f"job-{uuid.uuid4().hex[:16]}", collection=collection, action=action)
        self.save(job)
        return job

    def get(self, job_id: str) -> JobRecord | None:
        with self._lock:
            stored = self._jobs.get(job_id)
            return copy.deepcopy(stored) if stored is not None else None

    def save(self, job: JobRecord) -> None:
        """Record a copy of `job`'s current state (memory and disk; the job's runner goes on
        changing its own) and forget the oldest finished jobs beyond `keep`."""
        with self._lock:
            self._jobs[job.id] = copy.deepcopy(job)
            self._jobs.move_to_end(job.id)
            write_atomically(self._folder / f"{job.id}.json", json.dumps(job.to_dict()).encode())
            finished = [j for j in self._jobs.values() if j.finished]
            for old in finished[: max(0, len(finished) - self._keep)]:
                del self._jobs[old.id]
                (self._folder / f"{old.id}.json").unlink(missing_ok=True)

    def fail_unfinished(self, reason: str) -> list[str]:
        """Mark every queued or running job failed (after a restart: nobody runs them)."""
        failed = []
        with self._lock:
            unfinished = [job for job in self._jobs.values() if not job.finished]
        for job in unfinished:
            job.status, job.finished_at = "failed", time.time()
            job.errors.append({"document": "", "message": reason})
            self.save(job)
            failed.append(job.id)
        return failed


class Ingestor:
    """Runs jobs against a CollectionStore with one embedder (the retriever's model)."""

    def __init__(
        self,
        store: CollectionStore,
        embedder: Embedder,
        embedding_model: str,
        chunking: ChunkingParams,
        *,
        index_params: IndexParams | None = None,
        keep_versions: int = 3,
        version_grace_s: float = 300.0,
        lock_timeout_s: float = 60.0,
        cpu_share: float = 1.0,
        parse: Callable[[str, bytes, str | None], list[Document]] = parse_upload,
    ) -> None:
        """`cpu_share` (0-1] bounds the job's use of its CPU: after each block of embedding
        it pauses for as long as (1 - share) / share times the block took, so ingestion
        leaves the rest to queries (1.0: no pause). `parse` reads one uploaded file
        (corpus.parse_worker.BoundedParser in the service: risky formats in a child process
        with a time and memory limit)."""
        if not 0 < cpu_share <= 1:
            raise ValueError("cpu_share must be in (0, 1]")
        self.store = store
        self._embedder = embedder
        self._embedding_model = embedding_model
        self._chunking = chunking
        self._index_params = index_params or IndexParams(kind="auto")
        self._keep_versions = keep_versions
        self._version_grace_s = version_grace_s
        self._lock_timeout_s = lock_timeout_s
        self._cpu_share = cpu_share
        self._parse = parse

    def run(self, job: JobRecord, work: JobInput, on_progress=lambda job: None) -> None:
        """Run `job` to the end: `job` holds the outcome (never raises for bad input or a
        failed build; the collection keeps its last version then)."""
        job.status, job.started_at = "running", time.time()
        on_progress(job)
        try:
            documents = self._read(work, job)
            if not documents and not work.deletes:
                raise DocumentError("no document could be read")
            changes = DocumentChanges(upserts=tuple(documents), deletes=work.deletes)

            last = time.perf_counter()

            def progress(done: int, total: int) -> None:
                nonlocal last
                job.progress = round(0.05 + 0.9 * done / max(total, 1), 3)
                on_progress(job)
                if self._cpu_share < 1 and 0 < done < total:
                    worked_s = time.perf_counter() - last
                    time.sleep(worked_s * (1 - self._cpu_share) / self._cpu_share)
                last = time.perf_counter()

            self._publish(job, changes, progress)
            job.status = "succeeded"
        except (DocumentError, CollectionNotFound, ValueError) as exc:
            job.status = "failed"
            job.errors.append({"document": "", "message": str(exc)})
        except Exception as exc:  # a failed build must not take the writer down
            logger.exception("job %s failed", job.id)
            job.status = "failed"
            job.errors.append({"document": "", "message": f"internal error: {type(exc).__name__}"})
        job.progress = 1.0 if job.status == "succeeded" else job.progress
        job.finished_at = time.time()
        on_progress(job)

    def _read(self, work: JobInput, job: JobRecord) -> list[Document]:
        """Every readable document of the job; the others become the job's errors. A later
        document with an id already read is an error (one job, one text per id)."""
        documents: dict[str, Document] = {}
        sources: list[tuple[str, Any]] = [
            (f"documents[{i}]", record) for i, record in enumerate(work.records)
        ] + [(upload.filename, upload) for upload in work.files]
        for where, source in sources:
            try:
                read = (
                    self._parse(source.filename, _content(source), source.content_type)
                    if isinstance(source, Upload)
                    else documents_from_records([source], where=where)
                )
            except DocumentError as exc:
                job.errors.append({"document": where, "message": str(exc)})
                continue
            for document in read:
                if document.doc_id in documents:
                    message = f"document id {document.doc_id!r} appears more than once"
                    job.errors.append({"document": where, "message": message})
                    continue
                documents[document.doc_id] = document
        job.counts["received"] = len(work.records) + len(work.files)
        job.counts["unreadable"] = len(job.errors)
        return list(documents.values())

    def _publish(self, job: JobRecord, changes: DocumentChanges, progress) -> None:
        with self.store.writer(timeout_s=self._lock_timeout_s):
            current = self.store.current(job.collection)  # CollectionNotFound if deleted
            staging = self.store.new_staging(job.collection)
            try:
                build = build_next_version(
                    current.path if current is not None else None,
                    changes,
                    staging,
                    self._embedder,
                    embedding_model=self._embedding_model,
                    chunking=self._chunking,
                    index_params=self._index_params,
                    progress=progress,
                )
                published = self.store.publish(job.collection, staging)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
            self.store.collect_garbage(
                job.collection, keep=self._keep_versions, min_age_s=self._version_grace_s
            )
        job.version = published.version
        job.counts.update(
            added=build.added,
            replaced=build.replaced,
            deleted=build.deleted,
            not_found=len(build.not_found),
            documents=build.num_documents,
            chunks=build.num_chunks,
            embedded_chunks=build.embedded_chunks,
        )
        for doc_id in build.not_found:
            job.errors.append({"document": doc_id, "message": "no such document"})
        logger.info(
            "job %s: %s version %s published (%d documents, %d chunks, %d embedded)",
            job.id,
            job.collection,
            published.version,
            build.num_documents,
            build.num_chunks,
            build.embedded_chunks,
        )


def _content(upload: Upload) -> bytes:
    """The uploaded file's bytes, read when its job parses it (one file at a time)."""
    try:
        return upload.path.read_bytes()
    except OSError:
        message = f"{upload.filename}: the uploaded file was lost before it was read"
        raise DocumentError(message) from None
