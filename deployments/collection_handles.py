"""`app.collections_api.CollectionsBackend` over the collection writer's deployment handle.

A writer that is at capacity, not running, or lost under a call is `StageUnavailable` (the
HTTP layer answers 503 `writer_unavailable` or `overloaded` with Retry-After). Nothing is
sent again: a submission is not idempotent (each makes a job).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ray.serve.handle import DeploymentHandle, DeploymentResponse

from corpus.ingestion import JobInput, Upload
from deployments.handles import REPLICA_LOST, call_stage
from pipeline.messages import StageError
from pipeline.stages import StageName, StageUnavailable


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
        files: list[tuple[str, bytes, str | None]],
        deletes: list[str],
    ) -> dict[str, Any] | StageError:
        work = JobInput(
            records=tuple(records),
            files=tuple(Upload(*file) for file in files),
            deletes=tuple(deletes),
        )
        return await self._call(lambda: self.writer.submit.remote(name, action, work))

    async def job(self, job_id: str) -> dict[str, Any] | StageError:
        return await self._call(lambda: self.writer.job.remote(job_id))

    async def _call(self, send: Callable[[], DeploymentResponse]) -> Any:
        try:
            return await call_stage("writer", send, self._available)
        except REPLICA_LOST as exc:
            raise StageUnavailable("writer", "unavailable", type(exc).__name__) from None
