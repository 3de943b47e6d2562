"""What a collection holds, as listings say it: a collection's description (documents,
chunks, version) and the documents of its current version, for a collection of the store
and for the shipped corpus (an index folder written by retrieval.build, read-only).

Records are plain dicts in the shape the collections API answers with."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from corpus.collection_store import CollectionNotFound, CollectionStore
from corpus.incremental import read_documents
from pipeline.messages import DEFAULT_COLLECTION
from retrieval.index import Manifest, manifest_version, read_chunks, read_manifest


def describe_collection(store: CollectionStore, name: str) -> dict[str, Any]:
    """Collection `name` of `store` as its current version stands; one with `deleted`
    set when it no longer exists (it went while being listed)."""
    try:
        current = store.current(name)
    except CollectionNotFound:
        return {"name": name, "object": "collection", "deleted": True}
    if current is None:
        return collection_record(name)
    return collection_record(
        name, read_manifest(current.path), version=current.version,
        updated_at=current.published_at,
    )  # fmt: skip


def describe_shipped(index: Path) -> dict[str, Any]:
    """The shipped corpus's index folder as the read-only default collection."""
    manifest = read_manifest(index)
    return collection_record(DEFAULT_COLLECTION, manifest, version=manifest_version(manifest),
                             read_only=True)  # fmt: skip


def collection_record(
    name: str,
    manifest: Manifest | None = None,
    *,
    version: str | None = None,
    updated_at: float | None = None,
    read_only: bool = False,
) -> dict[str, Any]:
    """A collection as the API lists it; without a manifest, one with nothing published."""
    return {
        "name": name,
        "object": "collection",
        "read_only": read_only,
        "documents": int(manifest.extra.get("num_documents", 0)) if manifest else 0,
        "chunks": manifest.num_chunks if manifest else 0,
        "version": version,
        "updated_at": updated_at,
    }


def collection_documents(store: CollectionStore, name: str) -> list[dict[str, Any]]:
    """The documents of collection `name`'s current version ([] before its first); raises
    CollectionNotFound (or InvalidCollectionName) as the store does."""
    current = store.current(name)
    if current is None:
        return []
    return [
        {"id": d.doc_id, "title": d.title, "chunks": d.chunks, "chars": d.chars,
         "updated_at": d.updated_at}
        for d in read_documents(current.path)
    ]  # fmt: skip


def shipped_documents(index: Path) -> list[dict[str, Any]]:
    """The documents of the shipped corpus's index, counted from its chunks (a folder of
    retrieval.build keeps no document list, so sizes and times are unknown: None)."""
    chunks = read_chunks(index)
    counts = Counter(item.chunk.doc_id for item in chunks)
    titles = {item.chunk.doc_id: item.chunk.title for item in chunks}
    return [
        {"id": doc_id, "title": titles[doc_id], "chunks": n, "chars": None, "updated_at": None}
        for doc_id, n in counts.items()
    ]
