"""`app.collections_api.CollectionsBackend` over the collection writer's deployment handle.

Uploaded files stream to the writer's spool (corpus.spool) in pieces before the job that
names them is submitted, so neither side holds a whole file in memory. A writer that is at
capacity, not running, or lost under a call is `StageUnavailable` (the HTTP layer answers
503 `writer_unavailable` or `overloaded` with Retry-After). Nothing is sent again: a
submission is not idempotent (each makes a job).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from ray.serve.handle import DeploymentHandle, DeploymentResponse

from app.collections_api import UploadedFile
from corpus.ingestion import JobInput
from corpus.spool import SpooledUpload
from deployments.handles import REPLICA_LOST, call_stage
from pipeline.messages import StageError
from pipeline.stages import StageName, StageUnavailable

# The piece of an upload one call to the writer carries: what the ingress and the writer
# hold of a file in memory at once.
SPOOL_PIECE_BYTES = 1 << 20


class HandleCollections:
    def __init__(
        self,
        writer: DeploymentHandle,
        available: Callable[[StageName], bool] = lambda stage: True,
    ) -> None:
        self.writer = writer
        self._available = available

    async def create_collection(self, name: str) -> dict[str, Any] | StageError:
        return await self._call(lambda: self.writer.create_collection.remote(name))

    async def delete_collection(self, name: str) -> dict[str, Any] | StageError:
        return await self._call(lambda: self.writer.delete_collection.remote(name))

    async def list_collections(self) -> dict[str, Any] | StageError:
        return await self._call(lambda: self.writer.list_collections.remote())

    async def list_documents(
        self, name: str, offset: int, limit: int
    ) -> dict[str, Any] | StageError:
        return await self._call(lambda: self.writer.list_documents.remote(name, offset, limit))

    async def submit(
        self,
        name: str,
        action: str,
        records: list[dict[str, Any]],
        files: list[UploadedFile],
        deletes: list[str],
    ) -> dict[str, Any] | StageError:
        """Stream each file to the writer's spool in SPOOL_PIECE_BYTES pieces, then submit
        the job naming them. Whatever stops it on the way leaves no upload in the spool."""
        uploads: list[SpooledUpload] = []
        try:
            for filename, reader, content_type in files:
                upload_id = await self._call(lambda: self.writer.begin_upload.remote(name))
                if isinstance(upload_id, StageError):
                    return upload_id
                uploads.append(SpooledUpload(filename, upload_id, content_type))
                while piece := await reader.read(SPOOL_PIECE_BYTES):
                    append = partial(self.writer.append_upload.remote, upload_id, piece)
                    refused = await self._call(append)
                    if refused is not None:
                        return refused
            work = JobInput(records=tuple(records), deletes=tuple(deletes))
            sent, uploads = tuple(uploads), []  # from here the writer owns them
            return await self._call(lambda: self.writer.submit.remote(name, action, work, sent))
        finally:
            for upload in uploads:  # not awaited: a cancelled request still cleans up
                self.writer.discard_upload.remote(upload.upload_id)

    async def job(self, job_id: str) -> dict[str, Any] | StageError:
        return await self._call(lambda: self.writer.job.remote(job_id))

    async def _call(self, send: Callable[[], DeploymentResponse]) -> Any:
        try:
            return await call_stage("writer", send, self._available)
        except REPLICA_LOST as exc:
            raise StageUnavailable("writer", "unavailable", type(exc).__name__) from None
