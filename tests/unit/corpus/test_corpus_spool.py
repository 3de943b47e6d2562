"""The writer's upload spool (corpus.spool): files on disk from the first piece until their
job releases them, and nothing left behind by uploads that never became a job."""

from __future__ import annotations

import os
import time

import pytest

from corpus.spool import SpoolError, UploadSpool, UploadTooLarge


@pytest.fixture
def spool(tmp_path) -> UploadSpool:
    return UploadSpool(tmp_path / "uploads", max_file_bytes=10)


def test_pieces_become_one_file_that_a_job_claims_and_releases(spool):
    upload_id = spool.begin()
    spool.append(upload_id, b"abc")
    spool.append(upload_id, b"defg")

    path = spool.claim(upload_id)

    assert path.read_bytes() == b"abcdefg"
    with pytest.raises(SpoolError):  # claimed: no more pieces, no second claim
        spool.append(upload_id, b"h")
    spool.discard(upload_id)  # a late discard from the ingress leaves a claimed file alone
    assert path.exists()
    spool.release([path])
    assert list(spool.root.iterdir()) == []


def test_a_file_past_the_limit_is_refused_and_removed(spool):
    upload_id = spool.begin()
    spool.append(upload_id, b"x" * 10)

    with pytest.raises(UploadTooLarge):
        spool.append(upload_id, b"y")
    assert list(spool.root.iterdir()) == []


@pytest.mark.parametrize("upload_id", ["nope", "../../etc/passwd", "0" * 32])
def test_an_id_the_spool_never_gave_is_refused(spool, upload_id):
    with pytest.raises(SpoolError):
        spool.append(upload_id, b"x")
    with pytest.raises(SpoolError):
        spool.claim(upload_id)


def test_an_upload_left_idle_is_removed_and_a_new_writer_starts_with_an_empty_spool(tmp_path):
    spool = UploadSpool(tmp_path / "uploads", max_file_bytes=10, abandoned_after_s=60)
    idle, recent = spool.begin(), spool.begin()
    claimed = spool.begin()
    claimed_path = spool.claim(claimed)
    long_ago = time.time() - 120
    for path in (spool.root / f"{idle}.part", claimed_path):
        os.utime(path, (long_ago, long_ago))

    spool.begin()  # each new upload sweeps the idle ones; a queued job's file stays

    assert not (spool.root / f"{idle}.part").exists()
    assert (spool.root / f"{recent}.part").exists() and claimed_path.exists()
    restarted = UploadSpool(tmp_path / "uploads", max_file_bytes=10)
    assert list(restarted.root.iterdir()) == []
