"""Collection writer deployment: the one replica that changes collections.

Creates and deletes collections, queues ingestion jobs and runs them one at a time in a
thread (`corpus.ingestion`), and answers job status and listings. The builder gives it
exactly one replica; the store's file lock also keeps out a writer of another application
on the same folder. Answers are plain dicts (the API's response bodies) or StageErrors.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from app.config import RagAppConfig
from corpus.collection_listing import (
    collection_documents,
    describe_collection,
    describe_shipped,
    shipped_documents,
)
from corpus.collection_store import (
    CollectionExists,
    CollectionNotFound,
    CollectionStore,
    InvalidCollectionName,
    WriterBusy,
)
from corpus.ingestion import Ingestor, JobBook, JobInput, JobRecord, Upload
from corpus.job_thread import job_executor
from corpus.parse_worker import MIB, BoundedParser, ParseLimits
from corpus.spool import SPOOL_DIR, SpooledUpload, SpoolError, UploadSpool, UploadTooLarge
from deployments.collection_metrics import IngestionMetrics
from pipeline.config_base import PROJECT_ROOT, resolve_path
from pipeline.log import get_logger
from pipeline.messages import DEFAULT_COLLECTION, StageError
from retrieval.chunking import ChunkingParams
from retrieval.embedding import Embedder
from retrieval.models import resolve_model_reference

logger = get_logger(__name__)

# Progress is written to disk at most this often while a job runs.
PROGRESS_SAVE_INTERVAL_S = 0.5
# Longest wait for another writer on the same folder (another pod's) before failing.
WRITER_LOCK_TIMEOUT_S = 60.0
# Finished jobs whose status stays readable.
JOBS_KEPT = 1000
# The job thread's nice value with job_scheduling 'nice' (or where SCHED_IDLE is missing).
JOB_NICENESS = 10


class CollectionWriterDeployment:
    def __init__(self, config: RagAppConfig) -> None:
        import torch

        settings = config.collections
        torch.set_num_threads(1)  # the query path's threads keep the other cores
        root = resolve_path(settings.root)
        self._store = CollectionStore(root)
        self._settings = settings
        self._retry_after_s = config.ingress.retry_after_s
        embedding = config.retriever.embedding
        embedder = Embedder.load(
            resolve_model_reference(embedding.model, PROJECT_ROOT), device=settings.device
        )
        self._ingestor = Ingestor(
            self._store,
            embedder,
            embedding.model,
            ChunkingParams(settings.chunk_tokens, settings.overlap_tokens),
            keep_versions=settings.keep_versions,
            version_grace_s=settings.version_grace_s,
            lock_timeout_s=WRITER_LOCK_TIMEOUT_S,
            cpu_share=settings.job_cpu_share,
            parse=BoundedParser(
                ParseLimits(settings.parse_timeout_s, settings.parse_memory_mb * MIB)
            ),
        )
        self._default_path = resolve_path(config.retriever.index_path)
        self._default = describe_shipped(self._default_path)
        with self._store.writer(timeout_s=WRITER_LOCK_TIMEOUT_S):
            leftovers = self._store.recover()
            self._jobs = JobBook(root, keep=JOBS_KEPT)
            # Uploads of jobs that died with the last writer go with them.
            self._spool = UploadSpool(root / SPOOL_DIR, settings.max_upload_bytes)
            failed = self._jobs.fail_unfinished(
                "the writer restarted before the job finished; the collection serves its "
                "last published version"
            )
        self._queue: asyncio.Queue[tuple[JobRecord, JobInput]] = asyncio.Queue(
            maxsize=settings.max_queued_jobs
        )
        self._writing = asyncio.Lock()  # one change at a time within this replica
        self._job_thread = job_executor(settings.job_scheduling, JOB_NICENESS)
        self._worker: asyncio.Task | None = None
        self._metrics = IngestionMetrics()
        logger.info(
            "collection writer ready: %s, %d collections; removed %d unfinished builds, "
            "failed %d interrupted jobs",
            root,
            len(self._store.names()),
            len(leftovers),
            len(failed),
        )

    async def create_collection(self, name: str) -> dict[str, Any] | StageError:
        """Create an empty collection: its description, or why not (400, 409)."""
        async with self._writing:
            refused = await self._write(lambda: self._store.create(name))
        if isinstance(refused, StageError):
            return refused
        return await asyncio.to_thread(describe_collection, self._store, name)

    async def delete_collection(self, name: str) -> dict[str, Any] | StageError:
        """Delete a collection and every version of it (after the job running, if any)."""
        if name == DEFAULT_COLLECTION:
            return _read_only()
        async with self._writing:
            refused = await self._write(lambda: self._store.delete(name))
        if isinstance(refused, StageError):
            return refused
        return {"name": name, "object": "collection", "deleted": True}

    async def list_collections(self) -> dict[str, Any]:
        described = await asyncio.to_thread(
            lambda: [describe_collection(self._store, name) for name in self._store.names()]
        )
        # A collection deleted while it was being listed is left out.
        data = [self._default] + [c for c in described if not c.get("deleted")]
        return {"object": "list", "data": data}

    async def list_documents(
        self, name: str, offset: int = 0, limit: int = 100
    ) -> dict[str, Any] | StageError:
        """One page of the documents the collection's current version holds."""
        try:
            documents = (
                await asyncio.to_thread(shipped_documents, self._default_path)
                if name == DEFAULT_COLLECTION
                else await asyncio.to_thread(collection_documents, self._store, name)
            )
        except (CollectionNotFound, InvalidCollectionName):
            return _not_found(name)
        page = documents[offset : offset + limit]
        return {"object": "list", "data": page, "total": len(documents), "offset": offset}

    async def begin_upload(self, name: str) -> str | StageError:
        """A new, empty file in the spool for a document of collection `name`: its id."""
        refused = self._refusal(name)
        return refused if refused is not None else self._spool.begin()

    async def append_upload(self, upload_id: str, piece: bytes) -> StageError | None:
        """The next piece of an upload begun with begin_upload."""
        try:
            await asyncio.to_thread(self._spool.append, upload_id, piece)
        except UploadTooLarge as exc:
            return StageError(413, str(exc), code="request_too_large")
        except SpoolError as exc:
            return _upload_lost(exc)
        return None

    async def discard_upload(self, upload_id: str) -> None:
        self._spool.discard(upload_id)

    async def submit(
        self, name: str, action: str, work: JobInput, uploads: tuple[SpooledUpload, ...] = ()
    ) -> dict[str, Any] | StageError:
        """Queue a job that adds (or replaces) and deletes documents: the job, queued.
        `uploads` are files streamed to the spool (begin_upload, append_upload); the job
        owns them from here, and a refused submission removes them."""
        refused = self._refusal(name)
        size = work.size + len(uploads)
        if refused is None and size == 0:
            refused = StageError(400, "no documents were sent", param="documents")
        if refused is None and size > self._settings.max_documents_per_request:
            limit = self._settings.max_documents_per_request
            refused = StageError(400, f"at most {limit} documents per request", param="documents")
        if refused is None and self._queue.full():
            refused = StageError(
                503,
                f"the writer has {self._queue.qsize()} jobs queued; retry shortly",
                "service_unavailable",
                code="overloaded",
            )
        files: list[Upload] = []
        try:
            if refused is None:
                for upload in uploads:
                    path = self._spool.claim(upload.upload_id)
                    files.append(Upload(upload.filename, path, upload.content_type))
        except SpoolError as exc:
            refused = _upload_lost(exc)
        if refused is not None:
            self._spool.release([file.path for file in files])
            for upload in uploads:
                self._spool.discard(upload.upload_id)
            return refused
        job = self._jobs.new(name, "delete" if action == "delete" else "add")
        self._queue.put_nowait((job, replace(work, files=(*work.files, *files))))
        self._ensure_worker()
        return job.to_dict()

    async def job(self, job_id: str) -> dict[str, Any] | StageError:
        found = self._jobs.get(job_id)
        if found is None:
            return StageError(
                404, f"job {job_id!r} does not exist", "not_found_error", code="job_not_found"
            )
        return found.to_dict()

    async def check_health(self) -> None:
        """Serve's health check: a job worker that died takes the replica with it."""
        if self._worker is not None and self._worker.done():
            raise RuntimeError("the job worker stopped")

    def _ensure_worker(self) -> None:
        if self._worker is None:
            self._worker = asyncio.get_running_loop().create_task(self._run_jobs())

    async def _run_jobs(self) -> None:
        while True:
            job, work = await self._queue.get()
            async with self._writing:
                # The job thread's priority is below the queries' (corpus.job_thread);
                # torch runs its one intra-op thread on it.
                await asyncio.get_running_loop().run_in_executor(
                    self._job_thread, self._run_job, job, work
                )
            try:
                self._metrics.observe(job)
            except Exception:  # a metric must not stop the worker (and the replica with it)
                logger.exception("job %s: its metrics were not recorded", job.id)
            self._queue.task_done()

    def _run_job(self, job: JobRecord, work: JobInput) -> None:
        try:
            self._ingestor.run(job, work, self._progress_saver())
        finally:
            self._spool.release([file.path for file in work.files])

    def _refusal(self, name: str) -> StageError | None:
        """Why documents cannot be added to `name` (read-only, no such collection), or None."""
        if name == DEFAULT_COLLECTION:
            return _read_only()
        try:
            exists = self._store.exists(name)
        except InvalidCollectionName:
            exists = False
        return None if exists else _not_found(name)

    def _progress_saver(self) -> Callable[[JobRecord], None]:
        last_saved = 0.0

        def save(job: JobRecord) -> None:
            nonlocal last_saved
            now = time.monotonic()
            starting = job.status == "running" and job.progress == 0.0
            if job.finished or starting or now - last_saved >= PROGRESS_SAVE_INTERVAL_S:
                self._jobs.save(job)
                last_saved = now

        return save

    async def _write(self, change: Callable[[], None]) -> StageError | None:
        """Run `change` under the store's writer lock; a refusal as a StageError."""

        def locked() -> None:
            with self._store.writer(timeout_s=WRITER_LOCK_TIMEOUT_S):
                change()

        try:
            await asyncio.to_thread(locked)
        except InvalidCollectionName as exc:
            return StageError(400, str(exc), param="name", code="invalid_collection_name")
        except CollectionExists as exc:
            return StageError(409, str(exc), param="name", code="collection_exists")
        except CollectionNotFound as exc:
            return StageError(404, str(exc), "not_found_error", code="collection_not_found")
        except WriterBusy as exc:
            return StageError(503, str(exc), "service_unavailable", code="writer_busy")
        return None


def _not_found(name: str) -> StageError:
    return StageError(
        404, f"collection {name!r} does not exist", "not_found_error", code="collection_not_found"
    )


def _upload_lost(exc: SpoolError) -> StageError:
    return StageError(
        503,
        f"{exc}: the writer may have restarted; send the documents again",
        "service_unavailable",
        code="writer_unavailable",
    )


def _read_only() -> StageError:
    return StageError(
        403,
        f"the {DEFAULT_COLLECTION!r} collection is the shipped corpus and cannot be changed "
        "over the API: create a collection of your own",
        "permission_error",
        code="collection_read_only",
    )
