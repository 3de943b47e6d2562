"""Uploaded files on the collection writer's disk, from their first byte until the job that
reads them ends.

The ingress streams each uploaded file to the writer in pieces (`append`), so no process
holds a whole upload in memory while it crosses the cluster or waits in the job queue: a
queued job holds paths. The job reads one file at a time when it parses it and removes its
files when it ends (`release`). A file is `.part` while it arrives and `.job` once a job has
claimed it; a `.part` nobody claimed (the ingress died mid-upload, the request went away)
is removed once it has been idle for `abandoned_after_s`, and a writer that starts removes
every file, since the jobs that would have read them failed with its restart.
"""

from __future__ import annotations

import os
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

SPOOL_DIR = ".uploads"  # in the collections root: not a collection name
PART, CLAIMED = ".part", ".job"
_UPLOAD_ID = re.compile(r"^[0-9a-f]{32}$")


class SpoolError(Exception):
    """An upload the spool does not hold."""


class UploadTooLarge(SpoolError):
    """An upload past the spool's size limit for one file."""


@dataclass(frozen=True)
class SpooledUpload:
    """An uploaded file as a job names it: the spool holds its bytes under `upload_id`."""

    filename: str
    upload_id: str
    content_type: str | None = None


class UploadSpool:
    def __init__(self, root: Path, max_file_bytes: int, abandoned_after_s: float = 600.0) -> None:
        self.root = root
        self.max_file_bytes = max_file_bytes
        self.abandoned_after_s = abandoned_after_s
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        for leftover in root.iterdir():
            leftover.unlink(missing_ok=True)

    def begin(self) -> str:
        """A new, empty upload; its id."""
        self._remove_abandoned()
        upload_id = secrets.token_hex(16)
        self._path(upload_id, PART).touch(mode=0o600, exist_ok=False)
        return upload_id

    def append(self, upload_id: str, piece: bytes) -> None:
        """Add `piece` to the upload (SpoolError, and the upload removed, past the limit)."""
        path = self._existing(upload_id, PART)
        if path.stat().st_size + len(piece) > self.max_file_bytes:
            path.unlink(missing_ok=True)
            raise UploadTooLarge(f"an uploaded file is larger than {self.max_file_bytes} bytes")
        with path.open("ab") as file:
            file.write(piece)

    def claim(self, upload_id: str) -> Path:
        """The finished upload's path, now a job's to read and release."""
        path = self._existing(upload_id, PART)
        return path.rename(self._path(upload_id, CLAIMED))

    def discard(self, upload_id: str) -> None:
        """Remove an upload no job has claimed (a claimed one is its job's to release)."""
        if _UPLOAD_ID.match(upload_id):
            self._path(upload_id, PART).unlink(missing_ok=True)

    @staticmethod
    def release(paths: list[Path]) -> None:
        """A job's files, once it has read them (or failed)."""
        for path in paths:
            path.unlink(missing_ok=True)

    def _existing(self, upload_id: str, suffix: str) -> Path:
        path = self._path(upload_id, suffix) if _UPLOAD_ID.match(upload_id) else None
        if path is None or not path.is_file():
            raise SpoolError(f"upload {upload_id!r} is not in the spool")
        return path

    def _path(self, upload_id: str, suffix: str) -> Path:
        return self.root / f"{upload_id}{suffix}"

    def _remove_abandoned(self) -> None:
        oldest = time.time() - self.abandoned_after_s
        for entry in self.root.glob(f"*{PART}"):
            try:
                if os.stat(entry).st_mtime < oldest:
                    entry.unlink(missing_ok=True)
            except FileNotFoundError:
                continue
