"""corpus.collection_store: versioned collections, the CURRENT commit point, the writer lock.

Everything is real on a temporary folder; a staging folder holds only a manifest, which is all
the store reads of an index. Crashes are simulated by stopping a writer part way (or making
the CURRENT replacement fail), and the lock is contended by a second store and a second
process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import asdict
from pathlib import Path

import pytest

from corpus.collection_store import (
    DEFAULT_COLLECTION,
    CollectionExists,
    CollectionNotFound,
    CollectionStore,
    InvalidCollectionName,
    WriterBusy,
)
from retrieval.index import MANIFEST_FILE, Manifest, manifest_version

REPO = Path(__file__).resolve().parents[3]


def write_manifest(folder: Path, build_id: str | None = None) -> str:
    """A valid manifest in `folder` (a random build id unless given); returns its version."""
    manifest = Manifest(
        embedding_model="test-model",
        dimension=8,
        num_chunks=1,
        num_sentences=1,
        index={"kind": "flat"},
        chunking={"chunk_tokens": 64},
        extra={"build_id": build_id or uuid.uuid4().hex},
    )
    (folder / MANIFEST_FILE).write_text(json.dumps(asdict(manifest)))
    return manifest_version(manifest)


def staged(store: CollectionStore, name: str, build_id: str | None = None) -> Path:
    staging = store.new_staging(name)
    write_manifest(staging, build_id)
    return staging


@pytest.fixture
def store(tmp_path: Path) -> CollectionStore:
    return CollectionStore(tmp_path / "collections")


@pytest.fixture
def docs(store: CollectionStore) -> str:
    store.create("docs")
    return "docs"


# Names


@pytest.mark.parametrize("name", ["a", "0", "docs", "team-a_2024", "x" * 63])
def test_check_name_accepts_lowercase_names_up_to_63_characters(store, name):
    assert store.check_name(name) == name


@pytest.mark.parametrize(
    "name",
    ["", "Docs", "-docs", "_docs", ".docs", "../x", "x/y", "a b", "x" * 64, "docs\n", "naïve"],
)
def test_check_name_refuses_names_that_could_not_be_folders_of_the_store(store, name):
    with pytest.raises(InvalidCollectionName, match="lowercase letters"):
        store.check_name(name)


def test_the_default_collection_name_is_reserved(store):
    with pytest.raises(InvalidCollectionName, match="reserved"):
        store.check_name(DEFAULT_COLLECTION)
    with pytest.raises(InvalidCollectionName):
        store.create(DEFAULT_COLLECTION)


@pytest.mark.parametrize(
    "call",
    [
        lambda s, n: s.exists(n),
        lambda s, n: s.create(n),
        lambda s, n: s.delete(n),
        lambda s, n: s.current(n),
        lambda s, n: s.versions(n),
        lambda s, n: s.new_staging(n),
        lambda s, n: s.version_path(n, "abc123"),
        lambda s, n: s.publish(n, s.root / n / ".staging-x"),
        lambda s, n: s.collect_garbage(n),
    ],
    ids=["exists", "create", "delete", "current", "versions", "new_staging", "version_path",
         "publish", "collect_garbage"],
)  # fmt: skip
def test_every_method_refuses_a_name_that_leads_outside_the_root(store, call):
    (store.root.parent / "x" / "versions").mkdir(parents=True)

    with pytest.raises(InvalidCollectionName):
        call(store, "../x")
    assert (store.root.parent / "x" / "versions").is_dir()


@pytest.mark.parametrize("version", ["", "ABCDEF", "../docs", "12ab/..", "g1", "a" * 65])
def test_version_path_accepts_only_lowercase_hex(store, docs, version):
    with pytest.raises(ValueError, match="lowercase hex"):
        store.version_path(docs, version)


def test_version_path_names_the_folder_under_versions_without_checking_it(store, docs):
    assert store.version_path(docs, "0123abcd") == store.root / "docs" / "versions" / "0123abcd"


# Collections


def test_create_exists_names_and_delete(store):
    assert store.names() == []
    assert not store.exists("docs")

    store.create("docs")
    store.create("alpha")

    assert store.exists("docs")
    assert store.names() == ["alpha", "docs"]
    assert sorted(p.name for p in store.root.iterdir()) == ["alpha", "docs"]

    store.delete("docs")

    assert not store.exists("docs")
    assert store.names() == ["alpha"]
    assert sorted(p.name for p in store.root.iterdir()) == ["alpha"]


def test_creating_a_collection_twice_fails(store, docs):
    with pytest.raises(CollectionExists, match="docs"):
        store.create(docs)


def test_a_missing_collection_is_not_found(store):
    for call in (
        lambda: store.delete("nope"),
        lambda: store.current("nope"),
        lambda: store.versions("nope"),
        lambda: store.new_staging("nope"),
        lambda: store.collect_garbage("nope"),
    ):
        with pytest.raises(CollectionNotFound, match="nope"):
            call()


def test_names_lists_only_fully_created_collections(store, docs):
    (store.root / ".new-123" / "versions").mkdir(parents=True)  # a create that crashed
    (store.root / ".trash-456").mkdir()  # a delete that crashed
    (store.root / "stray").mkdir()  # not a collection: no versions/
    (store.root / "file").write_text("")
    (store.root / DEFAULT_COLLECTION / "versions").mkdir(parents=True)
    store.new_staging(docs)

    assert store.names() == ["docs"]


def test_a_deleted_collection_can_be_created_again_empty(store, docs):
    store.publish(docs, staged(store, docs))
    store.delete(docs)
    store.create(docs)

    assert store.current(docs) is None
    assert store.versions(docs) == []


# Publishing


def test_nothing_is_current_before_the_first_publish(store, docs):
    assert store.current(docs) is None
    assert store.versions(docs) == []


def test_publish_makes_the_staged_index_current(store, docs):
    staging = store.new_staging(docs)
    version = write_manifest(staging)

    before = time.time()
    published = store.publish(docs, staging)

    assert published.collection == docs
    assert published.version == version
    assert published.sequence == 1
    assert before <= published.published_at <= time.time()
    assert published.path == store.root / docs / "versions" / version
    assert (published.path / MANIFEST_FILE).is_file()
    assert not staging.exists()
    assert store.current(docs) == published
    assert json.loads((store.root / docs / "CURRENT").read_text()) == {
        "version": version,
        "published_at": published.published_at,
        "sequence": 1,
    }


def test_each_publish_adds_a_version_and_a_history_line(store, docs):
    published = [store.publish(docs, staged(store, docs)) for _ in range(3)]

    assert [p.sequence for p in published] == [1, 2, 3]
    assert store.current(docs) == published[-1]
    assert store.versions(docs) == published
    history = (store.root / docs / "history.jsonl").read_text().splitlines()
    assert [json.loads(line)["version"] for line in history] == [p.version for p in published]
    assert sorted(p.name for p in (store.root / docs / "versions").iterdir()) == sorted(
        p.version for p in published
    )


def test_publishing_an_identical_manifest_points_at_the_existing_folder(store, docs):
    first = store.publish(docs, staged(store, docs, build_id="same"))
    other = store.publish(docs, staged(store, docs))
    staging = staged(store, docs, build_id="same")

    again = store.publish(docs, staging)

    assert again.version == first.version
    assert again.path == first.path
    assert again.sequence == 3
    assert store.current(docs) == again
    assert not staging.exists()
    assert len(list((store.root / docs / "versions").iterdir())) == 2
    assert [v.version for v in store.versions(docs)] == [
        first.version,
        other.version,
        first.version,
    ]


def test_publish_refuses_a_folder_that_is_not_a_staging_folder_of_the_collection(
    store, docs, tmp_path
):
    store.create("other")
    elsewhere = tmp_path / "built"
    elsewhere.mkdir()
    write_manifest(elsewhere)

    with pytest.raises(ValueError, match="staging"):
        store.publish(docs, elsewhere)
    with pytest.raises(ValueError, match="staging"):
        store.publish(docs, staged(store, "other"))
    assert store.current(docs) is None


def test_publish_without_a_manifest_fails_and_changes_nothing(store, docs):
    published = store.publish(docs, staged(store, docs))

    with pytest.raises(FileNotFoundError):
        store.publish(docs, store.new_staging(docs))
    assert store.current(docs) == published


# Crashes and recovery


def test_a_writer_that_crashed_before_publishing_leaves_the_current_version(store, docs):
    published = store.publish(docs, staged(store, docs))
    staging = staged(store, docs)  # the writer dies here

    assert store.current(docs) == published
    assert store.names() == [docs]

    assert store.recover() == [staging]
    assert not staging.exists()
    assert store.current(docs) == published
    assert store.versions(docs) == [published]


def test_a_crash_at_the_commit_point_leaves_the_current_version(store, docs, monkeypatch):
    published = store.publish(docs, staged(store, docs))
    real_replace = os.replace

    def crash_on_current(source, target):
        if Path(target).name == "CURRENT":
            raise OSError("the writer died")
        real_replace(source, target)

    monkeypatch.setattr(os, "replace", crash_on_current)
    with pytest.raises(OSError, match="died"):
        store.publish(docs, staged(store, docs))
    monkeypatch.undo()

    assert store.current(docs) == published
    removed = store.recover()

    # The version renamed into place but never made current goes, with its history line.
    assert len(removed) == 1 and removed[0].parent == store.root / docs / "versions"
    assert store.versions(docs) == [published]
    assert sorted(p.name for p in (store.root / docs).iterdir()) == [
        "CURRENT",
        "history.jsonl",
        "versions",
    ]
    assert store.publish(docs, staged(store, docs)).sequence == 2


def test_a_crash_during_the_first_publish_leaves_nothing_published(store, docs, monkeypatch):
    def crash(source, target):
        raise OSError("the writer died")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="died"):
        store.publish(docs, staged(store, docs))
    monkeypatch.undo()

    assert store.current(docs) is None
    assert len(store.recover()) == 1
    assert list((store.root / docs / "versions").iterdir()) == []
    assert store.versions(docs) == []


def test_recover_removes_half_created_and_half_deleted_collections(store, docs):
    leftovers = [store.root / ".new-1" / "versions", store.root / ".trash-2" / "versions" / "ab"]
    for path in leftovers:
        path.mkdir(parents=True)
    (store.root / docs / ".tmp-3-CURRENT").write_text("{")

    removed = store.recover()

    assert sorted(removed) == sorted(
        [store.root / ".new-1", store.root / ".trash-2", store.root / docs / ".tmp-3-CURRENT"]
    )
    assert sorted(p.name for p in store.root.iterdir()) == ["docs"]
    assert store.names() == [docs]


def test_recover_keeps_every_published_version(store, docs):
    published = [store.publish(docs, staged(store, docs)) for _ in range(3)]

    assert store.recover() == []
    assert store.versions(docs) == published


# Garbage collection


def test_collect_garbage_keeps_the_newest_versions_once_old_ones_are_old_enough(store, docs):
    published = [store.publish(docs, staged(store, docs)) for _ in range(5)]
    last = published[-1].published_at

    assert store.collect_garbage(docs, keep=2, min_age_s=300, now=last + 10) == []
    assert len(store.versions(docs)) == 5

    removed = store.collect_garbage(docs, keep=2, min_age_s=300, now=last + 301)

    assert removed == [p.version for p in published[:3]]
    assert store.versions(docs) == published[3:]
    assert not published[0].path.exists()
    assert sorted(p.name for p in store.root.iterdir()) == ["docs"]  # no trash left


def test_collect_garbage_counts_age_from_when_a_version_was_superseded(store, docs):
    first = store.publish(docs, staged(store, docs))
    second = store.publish(docs, staged(store, docs))
    time.sleep(0.05)
    store.publish(docs, staged(store, docs))

    # `first` was superseded 300 s before `now`, `second` under 299.95 s before.
    removed = store.collect_garbage(docs, keep=1, min_age_s=300, now=second.published_at + 300)

    assert removed == [first.version]
    assert second.path.is_dir()


def test_collect_garbage_never_removes_the_current_version(store, docs):
    rollback_to = store.publish(docs, staged(store, docs, build_id="a"))
    later = store.publish(docs, staged(store, docs))
    store.publish(docs, staged(store, docs, build_id="a"))  # back to the first build

    removed = store.collect_garbage(docs, keep=0, min_age_s=0, now=time.time() + 3600)

    assert removed == [later.version]
    assert store.current(docs).version == rollback_to.version
    assert rollback_to.path.is_dir()


def test_collect_garbage_with_nothing_published_removes_nothing(store, docs):
    assert store.collect_garbage(docs, keep=0, min_age_s=0) == []
    with pytest.raises(ValueError, match="keep"):
        store.collect_garbage(docs, keep=-1)


# The writer lock


def test_two_stores_on_one_root_cannot_both_write(store):
    other = CollectionStore(store.root)

    with store.writer():
        with pytest.raises(WriterBusy, match=r"\.writer\.lock"), other.writer():
            pass
        with pytest.raises(WriterBusy), store.writer():  # not reentrant either
            pass

    with other.writer():
        pass


def test_the_writer_lock_is_released_when_the_block_raises(store):
    with pytest.raises(KeyError), store.writer():
        raise KeyError("boom")

    with CollectionStore(store.root).writer():
        pass


def test_a_writer_waits_up_to_its_timeout(store):
    other = CollectionStore(store.root)
    held = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with store.writer():
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(10)
    started = time.monotonic()
    with pytest.raises(WriterBusy), other.writer(timeout_s=0.2):
        pass
    assert time.monotonic() - started >= 0.2

    threading.Timer(0.2, release.set).start()
    with other.writer(timeout_s=10):
        pass
    holder.join(10)


def test_a_hold_taken_on_one_thread_can_be_released_on_another(store):
    hold = store.writer()
    for step in (hold.__enter__, lambda: hold.__exit__(None, None, None)):
        thread = threading.Thread(target=step)
        thread.start()
        thread.join(10)

    with CollectionStore(store.root).writer():
        pass


def test_a_negative_timeout_is_refused(store):
    with pytest.raises(ValueError, match="timeout_s"), store.writer(timeout_s=-1):
        pass


CHILD_WRITER = """
import sys
from pathlib import Path
from corpus.collection_store import CollectionStore, WriterBusy

try:
    with CollectionStore(Path(sys.argv[1])).writer(timeout_s=float(sys.argv[2])):
        print("held", flush=True)
        sys.stdin.readline()
except WriterBusy:
    print("busy", flush=True)
"""


def child_writer(root: Path, timeout_s: float) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-c", CHILD_WRITER, str(root), str(timeout_s)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=env,
    )


def test_the_writer_lock_is_exclusive_across_processes(store):
    child = child_writer(store.root, 0)
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "held"
        with pytest.raises(WriterBusy), store.writer():
            pass
        child.stdin.write("\n")
        child.stdin.flush()
        with store.writer(timeout_s=10):
            assert child_writer(store.root, 0).communicate(timeout=30)[0].strip() == "busy"
    finally:
        child.kill()
        child.wait(10)


# Readers during publishes


def test_readers_never_see_a_torn_or_unpublished_current(store, docs):
    store.publish(docs, staged(store, docs))
    done = threading.Event()
    errors: list[BaseException] = []
    seen: list[int] = []

    def read() -> None:
        try:
            while not done.is_set():
                current = store.current(docs)
                assert current is not None
                assert (current.path / MANIFEST_FILE).is_file()
                assert not seen or current.sequence >= seen[-1]
                seen.append(current.sequence)
        except BaseException as error:
            errors.append(error)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        with store.writer():
            for _ in range(50):
                store.publish(docs, staged(store, docs))
    finally:
        done.set()
        reader.join(10)

    assert errors == []
    assert len(seen) > 1
    assert store.current(docs).sequence == 51
