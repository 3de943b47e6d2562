"""Document collections on disk: each a series of immutable, versioned index folders.

Layout under the store's root:

    <root>/<name>/CURRENT                {"version": digest, "published_at": unix_s, "sequence": n}
    <root>/<name>/versions/<digest>/     one index folder per published version, never changed
    <root>/<name>/history.jsonl          one line per publish: version, published_at, sequence
    <root>/<name>/.staging-<uuid>/       a version being built
    <root>/.writer.lock                  held by the one writer allowed at a time

A version is the digest of its index's manifest (`retrieval.index.manifest_version`), so the
folder name says what is in it. One writer at a time (`CollectionStore.writer`) builds the next
version in a staging folder and publishes it: the folder is renamed into `versions/`, the
history is rewritten, and CURRENT is replaced through a temporary file (`os.replace`). That
replacement is the commit point: a reader sees the old CURRENT or the new one, never a torn
one, and a crash anywhere before it leaves the previous version served. `recover` removes
what a crashed writer left behind.

Versions are immutable because a query reads one version from start to end: the retriever
reads CURRENT once, and the compressor loads the same folder the retriever searched, even if
a newer version was published in between. So a version folder is never written after it is
published, and an old one is only removed (`collect_garbage`) once it was superseded long
enough ago that no query can still be on it.

The shipped index (`DEFAULT_COLLECTION`) is served from `retriever.index_path`, not from here.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout

from pipeline.messages import COLLECTION_NAME_PATTERN, DEFAULT_COLLECTION
from retrieval.index import manifest_version, read_manifest

logger = logging.getLogger(__name__)

# The API's schemas check the same pattern; both come from pipeline.messages.
NAME_PATTERN = COLLECTION_NAME_PATTERN
VERSION_PATTERN = r"[0-9a-f]{1,64}"
CURRENT_FILE = "CURRENT"
HISTORY_FILE = "history.jsonl"
VERSIONS_DIR = "versions"
LOCK_FILE = ".writer.lock"
STAGING_PREFIX = ".staging-"
TRASH_PREFIX = ".trash-"
NEW_PREFIX = ".new-"
TEMP_PREFIX = ".tmp-"


class CollectionError(ValueError):
    """A request about a collection that cannot be met as asked."""


class InvalidCollectionName(CollectionError):
    pass


class CollectionNotFound(CollectionError):
    pass


class CollectionExists(CollectionError):
    pass


class WriterBusy(RuntimeError):
    """Another writer (this process or another) holds the store's writer lock."""


@dataclass(frozen=True)
class PublishedVersion:
    collection: str
    version: str
    path: Path
    published_at: float
    sequence: int


class CollectionStore:
    """The collections under `root`; readers need no lock, writers take `writer()`."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    # Names and paths

    def check_name(self, name: str) -> str:
        """`name` itself when it can name a collection; InvalidCollectionName saying why not."""
        if not isinstance(name, str) or re.fullmatch(NAME_PATTERN, name) is None:
            raise InvalidCollectionName(
                f"invalid collection name {name!r}: use 1 to 63 lowercase letters, digits, '_' "
                "or '-', starting with a letter or a digit"
            )
        if name == DEFAULT_COLLECTION:
            raise InvalidCollectionName(
                f"the collection name {DEFAULT_COLLECTION!r} is reserved for the shipped index"
            )
        return name

    def version_path(self, name: str, version: str) -> Path:
        """The folder of `version` of collection `name`, whether or not it exists; ValueError
        unless `version` is lowercase hex (so it cannot lead outside the collection)."""
        if not isinstance(version, str) or re.fullmatch(VERSION_PATTERN, version) is None:
            raise ValueError(f"invalid version {version!r}: expected a lowercase hex digest")
        return self._folder(name) / VERSIONS_DIR / version

    def _folder(self, name: str) -> Path:
        return self.root / self.check_name(name)

    def _existing_folder(self, name: str) -> Path:
        if not self.exists(name):
            raise CollectionNotFound(f"no collection named {name!r}")
        return self._folder(name)

    # Collections

    def names(self) -> list[str]:
        """The collections, sorted; folders being created, deleted or staged are not ones."""
        return sorted(
            entry.name
            for entry in self.root.iterdir()
            if re.fullmatch(NAME_PATTERN, entry.name)
            and entry.name != DEFAULT_COLLECTION
            and (entry / VERSIONS_DIR).is_dir()
        )

    def exists(self, name: str) -> bool:
        """Whether collection `name` exists (InvalidCollectionName for a name it cannot have)."""
        return (self._folder(name) / VERSIONS_DIR).is_dir()

    def create(self, name: str) -> None:
        """Create an empty collection, all at once (built aside, then renamed into place);
        CollectionExists when there is one by that name."""
        folder = self._folder(name)
        if self.exists(name):
            raise CollectionExists(f"a collection named {name!r} exists")
        new = self.root / f"{NEW_PREFIX}{uuid.uuid4().hex}"
        (new / VERSIONS_DIR).mkdir(parents=True)
        try:
            # A concurrent create got there first when the rename finds a non-empty folder.
            new.rename(folder)
        except OSError as error:
            shutil.rmtree(new, ignore_errors=True)
            raise CollectionExists(f"a collection named {name!r} exists") from error
        _fsync_directory(self.root)
        logger.info("created collection %s", name)

    def delete(self, name: str) -> None:
        """Remove a collection and every version of it: it disappears at once (renamed aside),
        then its files are removed; CollectionNotFound when there is none."""
        folder = self._existing_folder(name)
        trash = self.root / f"{TRASH_PREFIX}{uuid.uuid4().hex}"
        try:
            folder.rename(trash)
        except FileNotFoundError as error:
            raise CollectionNotFound(f"no collection named {name!r}") from error
        _fsync_directory(self.root)
        shutil.rmtree(trash, ignore_errors=True)
        logger.info("deleted collection %s", name)

    # Reading

    def current(self, name: str) -> PublishedVersion | None:
        """The version queries of collection `name` use now; None while none is published.

        Cheap enough for every query: one read of a small file, no folder listing."""
        folder = self._folder(name)
        try:
            record = json.loads((folder / CURRENT_FILE).read_bytes())
        except FileNotFoundError:
            if not self.exists(name):
                raise CollectionNotFound(f"no collection named {name!r}") from None
            return None
        return self._published(name, record)

    def versions(self, name: str) -> list[PublishedVersion]:
        """Every publish of collection `name` whose folder is still there, oldest first (a
        version published twice appears twice, with its two sequence numbers)."""
        self._existing_folder(name)
        published = (self._published(name, record) for record in self._history(name))
        return [version for version in published if version.path.is_dir()]

    def _published(self, name: str, record: dict) -> PublishedVersion:
        return PublishedVersion(
            collection=name,
            version=record["version"],
            path=self.version_path(name, record["version"]),
            published_at=float(record["published_at"]),
            sequence=int(record["sequence"]),
        )

    def _history(self, name: str) -> list[dict]:
        try:
            text = (self._folder(name) / HISTORY_FILE).read_text()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    # Writing: only while holding `writer()`

    def new_staging(self, name: str) -> Path:
        """A new, empty folder inside collection `name` to build the next version in."""
        staging = self._existing_folder(name) / f"{STAGING_PREFIX}{uuid.uuid4().hex}"
        staging.mkdir()
        return staging

    def publish(self, name: str, staging: Path) -> PublishedVersion:
        """Make the index built in `staging` (from `new_staging`) the current version of
        collection `name` and return it. Its version is its manifest's digest; when that
        version exists already (an identical manifest), `staging` is discarded and CURRENT
        points at the existing folder again. The CURRENT replacement is the commit point."""
        folder = self._existing_folder(name)
        staging = Path(staging)
        if staging.parent != folder or not staging.name.startswith(STAGING_PREFIX):
            raise ValueError(f"{staging} is not a staging folder of collection {name!r}")
        version = manifest_version(read_manifest(staging))
        target = self.version_path(name, version)
        if target.exists():
            shutil.rmtree(staging)
        else:
            _fsync_tree(staging)
            staging.rename(target)
            _fsync_directory(target.parent)
        history = self._history(name)
        current = self.current(name)
        sequences = [int(line["sequence"]) for line in history]
        record = {
            "version": version,
            "published_at": time.time(),
            "sequence": 1 + max([*sequences, current.sequence if current else 0]),
        }
        write_atomically(folder / HISTORY_FILE, _jsonl([*history, record]))
        write_atomically(folder / CURRENT_FILE, json.dumps(record).encode())
        logger.info("published %s version %s (#%d)", name, version, record["sequence"])
        return self._published(name, record)

    def collect_garbage(
        self, name: str, keep: int = 3, min_age_s: float = 300.0, now: float | None = None
    ) -> list[str]:
        """Remove the version folders of collection `name` beyond the newest `keep` published
        versions, never CURRENT's, and only those superseded (by the next publish) at least
        `min_age_s` before `now` (default: the time now), since a query that started on an old
        version may still be loading it. Returns the removed versions, oldest first."""
        if keep < 0:
            raise ValueError(f"keep must be at least 0, not {keep}")
        now = time.time() if now is None else now
        current = self.current(name)
        protected = {current.version} if current else set()
        history = self._history(name)
        last_publish = {line["version"]: index for index, line in enumerate(history)}
        newest_first = sorted(last_publish, key=last_publish.__getitem__, reverse=True)
        removed = []
        for version in reversed(newest_first[keep:]):
            path = self.version_path(name, version)
            superseded_at = _superseded_at(history, last_publish[version])
            if version in protected or superseded_at is None or not path.is_dir():
                continue
            if now - superseded_at >= min_age_s:
                self._discard(path)
                removed.append(version)
        if removed:
            logger.info("removed %d old versions of %s: %s", len(removed), name, removed)
        return removed

    def recover(self) -> list[Path]:
        """Remove what a crashed writer left behind and return the removed paths: staging
        folders, collections half created or half deleted, temporary files, and versions
        written but never made current (with their lines in the history).

        Only correct while holding the writer lock: a live writer's staging folder looks
        exactly like a crashed one's."""
        removed = [
            entry
            for entry in self.root.iterdir()
            if entry.name.startswith((TRASH_PREFIX, NEW_PREFIX))
        ]
        for entry in removed:
            shutil.rmtree(entry, ignore_errors=True)
        for name in self.names():
            removed += self._recover_collection(name)
        if removed:
            logger.info("recovered the collection store: removed %s", [str(p) for p in removed])
        return removed

    def _recover_collection(self, name: str) -> list[Path]:
        folder = self._folder(name)
        removed = [p for p in folder.iterdir() if p.name.startswith((STAGING_PREFIX, TEMP_PREFIX))]
        for path in removed:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
        current = self.current(name)
        history = self._history(name)
        # Lines after CURRENT's are publishes that crashed before their commit point.
        published = [line for line in history if current and line["sequence"] <= current.sequence]
        if len(published) != len(history):
            write_atomically(folder / HISTORY_FILE, _jsonl(published))
        referenced = {line["version"] for line in published}
        referenced |= {current.version} if current else set()
        for path in sorted((folder / VERSIONS_DIR).iterdir()):
            if path.name not in referenced:
                self._discard(path)
                removed.append(path)
        return removed

    def _discard(self, path: Path) -> None:
        # Renamed away first, so a crash halfway through removing it leaves no partial folder
        # under a version's name; `recover` finishes the removal.
        trash = self.root / f"{TRASH_PREFIX}{uuid.uuid4().hex}"
        path.rename(trash)
        shutil.rmtree(trash, ignore_errors=True)

    @contextmanager
    def writer(self, timeout_s: float = 0.0) -> Iterator[None]:
        """Hold the store's writer lock for the `with` block; WriterBusy when it is not free
        within `timeout_s` seconds (0: one try).

        Exclusive against every other holder: other processes, other stores on this root, and
        another `writer()` of this same store (it is not reentrant), because each call takes
        its own `flock` on a fresh descriptor (a new, non-singleton FileLock)."""
        if timeout_s < 0:
            raise ValueError(f"timeout_s must be at least 0, not {timeout_s}")
        path = self.root / LOCK_FILE
        # thread_local=False: the hold belongs to this call, not to the thread that took it, so
        # a block that ends on another thread releases it there (a thread-local lock would
        # ignore that release and leave the hold to its finalizer).
        lock = FileLock(path, thread_local=False)
        try:
            lock.acquire(timeout=timeout_s)
        except Timeout as error:
            raise WriterBusy(f"another writer holds {path}") from error
        try:
            yield
        finally:
            lock.release()


def _superseded_at(history: list[dict], index: int) -> float | None:
    """When the publish after `history[index]` replaced it; None for the last publish."""
    if index + 1 >= len(history):
        return None
    return float(history[index + 1]["published_at"])


def _jsonl(records: list[dict]) -> bytes:
    return "".join(json.dumps(record) + "\n" for record in records).encode()


def write_atomically(path: Path, data: bytes) -> None:
    """Replace `path` with `data` so a reader sees the old content or the new, never a part."""
    temporary = path.with_name(f"{TEMP_PREFIX}{uuid.uuid4().hex}-{path.name}")
    try:
        with temporary.open("wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    _fsync_directory(path.parent)


def _fsync_tree(directory: Path) -> None:
    """Flush every file under `directory`, then the folders, so a published version survives
    a power loss along with the CURRENT that names it."""
    for folder, _, files in os.walk(directory):
        for file in files:
            descriptor = os.open(os.path.join(folder, file), os.O_RDONLY)
            try:
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
        _fsync_directory(Path(folder))


def _fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    except OSError as error:
        # Some filesystems cannot sync a folder; the rename is still atomic there.
        if error.errno != errno.EINVAL:
            raise
    finally:
        os.close(descriptor)
