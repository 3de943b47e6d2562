"""Which loaded index serves a collection: the shipped corpus, or a collection's version.

A collection is a series of immutable version folders with a CURRENT pointer
(corpus.collection_store). The retriever reads CURRENT at the start of every query (one
small file) and opens the version it names when that is new to this replica, so no query that
starts after a publish searches an older version. A query keeps the Retriever it started
with, and its Retrieval names the collection and version, which is the one folder the
compressor then reads the sentences from: a query sees one version from start to end.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from corpus.collection_store import CollectionNotFound, CollectionStore
from pipeline.messages import DEFAULT_COLLECTION
from prepare.sentence_store import SentenceStore
from retrieval.retriever import Retriever

logger = logging.getLogger(__name__)


class CollectionEmpty(ValueError):
    """The collection exists but holds no documents (nothing published, or all deleted)."""


@dataclass(frozen=True)
class _Loaded:
    version: str
    retriever: Retriever


class RetrieverCatalog:
    """The retriever for each collection's current version, opened on first use."""

    def __init__(
        self,
        default: Retriever,
        store: CollectionStore | None,
        open_version: Callable[[Path, str], Retriever],
        on_load: Callable[[str, float, str], None] | None = None,
    ) -> None:
        """`default` serves DEFAULT_COLLECTION; `store` holds the others (None: collections
        are off); `open_version(folder, collection)` opens one version's index;
        `on_load(collection, ms, path)` is told how long each opening took, and where:
        "query" (the query that found the new version waited that long) or "background"
        (`refresh`)."""
        self._default = default
        self._store = store
        self._open_version = open_version
        self._on_load = on_load
        self._loaded: dict[str, _Loaded] = {}
        self._loading = threading.Lock()

    @property
    def default(self) -> Retriever:
        return self._default

    def retriever_for(self, collection: str | None) -> Retriever:
        """The retriever of `collection`'s current version (the shipped corpus for None).

        Raises CollectionNotFound (no such collection, or collections are off),
        CollectionEmpty (nothing to search yet), InvalidCollectionName."""
        if collection is None or collection == DEFAULT_COLLECTION:
            return self._default
        if self._store is None:
            raise CollectionNotFound(f"collection {collection!r} does not exist")
        try:
            published = self._store.current(collection)
        except CollectionNotFound:
            self._loaded.pop(collection, None)
            raise
        if published is None:
            raise CollectionEmpty(f"collection {collection!r} has no documents yet")
        loaded = self._loaded.get(collection)
        if loaded is None or loaded.version != published.version:
            # The version current now: the one read above, or one published since.
            loaded = self._open_current(collection, "query")
        if loaded is None or loaded.retriever.num_chunks == 0:
            raise CollectionEmpty(f"collection {collection!r} has no documents")
        return loaded.retriever

    def served_versions(self) -> dict[str, str]:
        """Collection -> the version this replica last opened for it."""
        return {name: loaded.version for name, loaded in self._loaded.items()}

    def refresh(self) -> list[str]:
        """Open the current version of each collection this replica has served, where it
        changed, so that the next query finds it open (called off the query path; a query
        arriving meanwhile waits for the same opening, never for a second one). Collections
        that are gone are forgotten. The collections refreshed, in order."""
        refreshed = []
        for collection, loaded in list(self._loaded.items()):
            try:
                published = self._store.current(collection) if self._store else None
                if published is None or published.version == loaded.version:
                    continue
                self._open_current(collection, "background")
            except CollectionNotFound:
                self._loaded.pop(collection, None)
                continue
            refreshed.append(collection)
        return refreshed

    def _open_current(self, collection: str, path: str) -> _Loaded | None:
        """Open the version CURRENT names now, unless it is the one already open. CURRENT is
        read again under the lock, so an opening never replaces a version with an older one
        (a refresh that read CURRENT just before a publish, a query that waited)."""
        if self._store is None:
            raise CollectionNotFound(f"collection {collection!r} does not exist")
        with self._loading:
            published = self._store.current(collection)
            if published is None:
                return None
            loaded = self._loaded.get(collection)
            if loaded is not None and loaded.version == published.version:
                return loaded
            started = time.perf_counter()
            loaded = _Loaded(published.version, self._open_version(published.path, collection))
            load_ms = (time.perf_counter() - started) * 1000
            self._loaded[collection] = loaded
        logger.info(
            "collection %s: now serving version %s (opened in %.0f ms, %s)",
            collection,
            published.version,
            load_ms,
            path,
        )
        if self._on_load is not None:
            try:
                self._on_load(collection, load_ms, path)
            except Exception:  # a metric must not fail the query that loaded the version
                logger.exception("on_load failed for collection %s", collection)
        return loaded


class SentenceStoreCatalog:
    """The sentence store of any collection version a retrieval names, the most recently
    used `max_loaded` of them kept in memory (the shipped corpus's store is the preparer's
    own)."""

    def __init__(self, store: CollectionStore, max_loaded: int = 8) -> None:
        self._store = store
        self._max_loaded = max_loaded
        self._loaded: OrderedDict[tuple[str, str], SentenceStore] = OrderedDict()
        self._loading = threading.Lock()

    def refresh(self) -> list[str]:
        """Load the current version's sentences of each collection this replica has served,
        where they are not loaded yet (off the query path: the next retrieval will name that
        version). The collections refreshed."""
        refreshed = []
        for collection in dict.fromkeys(name for name, _ in list(self._loaded)):
            try:
                published = self._store.current(collection)
            except CollectionNotFound:
                continue
            if published is not None and (collection, published.version) not in self._loaded:
                self.store_for(collection, published.version)
                refreshed.append(collection)
        return refreshed

    def store_for(self, collection: str, version: str) -> SentenceStore | None:
        """The sentences of that version, or None when it cannot be read (the collection
        was deleted, or the version collected as garbage): the caller goes on without
        sentence selection."""
        key = (collection, version)
        with self._loading:
            found = self._loaded.get(key)
            if found is not None:
                self._loaded.move_to_end(key)
                return found
            try:
                found = SentenceStore.load(self._store.version_path(collection, version))
            except (OSError, ValueError) as exc:
                logger.warning("no sentences for %s version %s: %s", collection, version, exc)
                return None
            self._loaded[key] = found
            while len(self._loaded) > self._max_loaded:
                self._loaded.popitem(last=False)
        return found
