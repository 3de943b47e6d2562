"""The ingress side of uploads (deployments.collection_handles): each file goes to the
writer's spool in pieces, the job names the spooled files, and a refusal or a failure on the
way leaves nothing in the spool. The writer is a fake over a real UploadSpool."""

from __future__ import annotations

import asyncio
import io
from typing import Any

import pytest

from corpus.spool import SpoolError, UploadSpool, UploadTooLarge
from deployments.collection_handles import SPOOL_PIECE_BYTES, HandleCollections
from pipeline.messages import StageError

MIB = 1 << 20


class Method:
    """A handle method: `.remote()` schedules the call at once, as Serve does."""

    def __init__(self, run: Any) -> None:
        self.run = run

    def remote(self, *args: Any) -> asyncio.Future:
        return asyncio.ensure_future(self.run(*args))


class FakeWriter:
    def __init__(self, spool: UploadSpool, queue_full: bool = False) -> None:
        self.spool = spool
        self.queue_full = queue_full
        self.pieces: list[int] = []
        self.jobs: list[dict[str, Any]] = []
        self.begin_upload = Method(self._begin)
        self.append_upload = Method(self._append)
        self.submit = Method(self._submit)
        self.discard_upload = Method(self._discard)

    async def _begin(self, name: str) -> str | StageError:
        return StageError(404, "no such collection") if name == "missing" else self.spool.begin()

    async def _append(self, upload_id: str, piece: bytes) -> StageError | None:
        self.pieces.append(len(piece))
        try:
            self.spool.append(upload_id, piece)
        except UploadTooLarge as exc:
            return StageError(413, str(exc))
        return None

    async def _submit(self, name, action, work, uploads) -> dict[str, Any] | StageError:
        if self.queue_full:
            for upload in uploads:
                self.spool.discard(upload.upload_id)
            return StageError(503, "queue full")
        paths = [self.spool.claim(upload.upload_id) for upload in uploads]
        job = {
            "files": [
                (u.filename, p.read_bytes(), u.content_type)
                for u, p in zip(uploads, paths, strict=True)
            ]
        }
        self.jobs.append(job)
        return job

    async def _discard(self, upload_id: str) -> None:
        self.spool.discard(upload_id)


class Reader:
    """An uploaded file as the form gives it; `fail_after` bytes, then the client is gone."""

    def __init__(self, content: bytes, fail_after: int | None = None) -> None:
        self.file = io.BytesIO(content)
        self.fail_after = fail_after

    async def read(self, size: int = -1) -> bytes:
        if self.fail_after is not None and self.file.tell() >= self.fail_after:
            raise ConnectionResetError("the client went away")
        return self.file.read(size)


def submit(writer: FakeWriter, files, name: str = "docs") -> Any:
    async def go() -> Any:
        try:
            return await HandleCollections(writer).submit(name, "add", [], files, [])
        finally:
            await asyncio.sleep(0)  # let the discards sent on the way out run

    return asyncio.run(go())


@pytest.fixture
def spool(tmp_path) -> UploadSpool:
    return UploadSpool(tmp_path / "uploads", max_file_bytes=3 * MIB)


def test_each_file_crosses_in_pieces_and_the_job_names_what_arrived(spool):
    writer = FakeWriter(spool)
    big = bytes(range(256)) * (10 * MIB // 256 // 4)  # 2.5 MiB
    files = [("big.txt", Reader(big), "text/plain"), ("small.md", Reader(b"# Hi"), None)]

    job = submit(writer, files)

    assert job["files"] == [("big.txt", big, "text/plain"), ("small.md", b"# Hi", None)]
    assert max(writer.pieces) == SPOOL_PIECE_BYTES and len(writer.pieces) == 4


@pytest.mark.parametrize(
    "case", ["file too large", "collection missing", "queue full", "client gone"]
)
def test_a_refusal_or_a_failure_on_the_way_leaves_nothing_in_the_spool(spool, case):
    writer = FakeWriter(spool, queue_full=case == "queue full")
    first = ("a.txt", Reader(b"a" * MIB), None)
    second = {
        "file too large": ("b.txt", Reader(b"b" * 4 * MIB), None),
        "client gone": ("b.txt", Reader(b"b" * 2 * MIB, fail_after=MIB), None),
    }.get(case, ("b.txt", Reader(b"b"), None))
    name = "missing" if case == "collection missing" else "docs"

    if case == "client gone":
        with pytest.raises(ConnectionResetError):
            submit(writer, [first, second], name)
    else:
        assert isinstance(submit(writer, [first, second], name), StageError)

    assert list(spool.root.iterdir()) == [] and writer.jobs == []
    with pytest.raises(SpoolError):
        spool.claim("0" * 32)
