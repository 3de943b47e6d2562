"""What an API key may do: its scopes, and the one place a request's collection access is
decided.

Scopes, as written in the key file (RAG_API_KEYS_FILE, app.settings):
- `admin`: everything (the keys of RAG_API_KEYS are admin keys);
- `read:<collection>`: query the collection, list its documents, read its jobs;
- `write:<collection>`: create it, add and delete its documents, delete it (and read it);
- `<collection>` may be `*`: every collection.
Every key may read the shipped `default` collection, which no key may change.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from app.errors import ApiError
from pipeline.messages import COLLECTION_NAME_PATTERN, DEFAULT_COLLECTION

ANY_COLLECTION = "*"
_SCOPE = re.compile(r"^(read|write):(\*|[a-z0-9][a-z0-9_-]{0,62})$")


class KeyFileError(ValueError):
    """The key file cannot be read, or names a scope that does not exist."""


@dataclass(frozen=True)
class Grant:
    """The collections one key may read and change."""

    admin: bool = False
    read: frozenset[str] = frozenset()
    write: frozenset[str] = frozenset()

    def can_read(self, collection: str) -> bool:
        return (
            collection == DEFAULT_COLLECTION
            or self.can_write(collection)
            or bool({collection, ANY_COLLECTION} & self.read)
        )

    def can_write(self, collection: str) -> bool:
        return self.admin or bool({collection, ANY_COLLECTION} & self.write)


ADMIN = Grant(admin=True)


def grant_of(scopes: Iterable[str]) -> Grant:
    """The grant of a list of scopes; KeyFileError naming the first one that is not a scope."""
    read: set[str] = set()
    write: set[str] = set()
    for scope in scopes:
        if scope == "admin":
            return ADMIN
        match = _SCOPE.match(scope)
        if match is None:
            raise KeyFileError(
                f"unknown scope {scope!r}: use admin, read:<collection> or write:<collection> "
                "(collection names as in the API, or *)"
            )
        (read if match[1] == "read" else write).add(match[2])
    return Grant(read=frozenset(read), write=frozenset(write))


def load_key_file(path: Path) -> dict[str, Grant]:
    """Keys and their grants from a YAML list of `{key: ..., scopes: [...]}`."""
    try:
        entries: Any = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise KeyFileError(f"cannot read the key file {path}: {exc}") from None
    if not isinstance(entries, list):
        raise KeyFileError(f"{path} must hold a list of {{key, scopes}} entries")
    grants: dict[str, Grant] = {}
    for number, entry in enumerate(entries, 1):
        if not isinstance(entry, Mapping) or set(entry) != {"key", "scopes"}:
            raise KeyFileError(f"{path}, entry {number}: give exactly key and scopes")
        key, scopes = entry["key"], entry["scopes"]
        if not isinstance(key, str) or not key.strip() or not isinstance(scopes, list):
            raise KeyFileError(f"{path}, entry {number}: key is a string, scopes a list")
        if key.strip() in grants:
            raise KeyFileError(f"{path}, entry {number}: the key appears twice")
        grants[key.strip()] = grant_of(str(scope) for scope in scopes)
    return grants


def forbidden(action: str, collection: str) -> ApiError:
    """The 403 for a key whose scopes do not cover `action` on `collection`."""
    return ApiError(
        403,
        f"this API key may not {action} collection {collection!r}",
        "permission_error",
        code="insufficient_scope",
    )


def read_refusal(grant: Grant, collection: str) -> ApiError | None:
    return None if grant.can_read(collection) else forbidden("read", collection)


def write_refusal(grant: Grant, collection: str) -> ApiError | None:
    # The default collection is read-only whatever the key: the route says so itself.
    if collection == DEFAULT_COLLECTION or grant.can_write(collection):
        return None
    return forbidden("change", collection)


def check_read(grant: Grant, collection: str) -> None:
    if refusal := read_refusal(grant, collection):
        raise refusal


def check_write(grant: Grant, collection: str) -> None:
    if refusal := write_refusal(grant, collection):
        raise refusal


# Paths whose collection is in the URL: checked by the guard before any body byte is read.
_COLLECTION_PATH = re.compile(rf"^/v1/collections/({COLLECTION_NAME_PATTERN[1:-1]})(/.*)?$")


def path_refusal(grant: Grant, method: str, path: str) -> ApiError | None:
    """For /v1/collections/<name>[/...]: a GET needs read, anything else write."""
    match = _COLLECTION_PATH.match(path)
    if match is None:
        return None
    if method in ("GET", "HEAD"):
        return read_refusal(grant, match[1])
    return write_refusal(grant, match[1])
