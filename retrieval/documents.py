"""Load a document collection from a folder of .txt / .md files and JSONL records.

The record and title rules here are also those of uploaded files (corpus.uploads).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

TEXT_SUFFIXES = (".txt", ".md")
JSONL_SUFFIXES = (".jsonl",)


@dataclass(frozen=True)
class Document:
    """One source document; `doc_id` is stable across rebuilds of the index."""

    doc_id: str
    title: str
    text: str


class DocumentError(ValueError):
    """A document file that cannot be read as the format its suffix promises."""


def load_documents(root: Path) -> list[Document]:
    """Read every supported file under `root` (recursively, sorted) into Documents.

    `.txt`/`.md`: one document per file, id = path relative to root without suffix,
    title = first Markdown heading or the file name. `.jsonl`: one record per line with
    `id`, `text` and optional `title`. Raises DocumentError on malformed records or duplicate ids.
    """
    root = Path(root)
    if not root.is_dir():
        raise DocumentError(f"document folder not found: {root}")
    documents: list[Document] = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        suffix = path.suffix.lower()
        if suffix in TEXT_SUFFIXES:
            documents.append(_read_text_file(root, path))
        elif suffix in JSONL_SUFFIXES:
            documents.extend(_read_jsonl_file(path))
    check_unique_ids(documents)
    return documents


def _read_text_file(root: Path, path: Path) -> Document:
    text = path.read_text(encoding="utf-8")
    doc_id = path.relative_to(root).with_suffix("").as_posix()
    return Document(doc_id=doc_id, title=title_of(text, fallback=path.stem), text=text.strip())


def title_of(text: str, fallback: str) -> str:
    """The Markdown heading that opens `text` (after blank lines), else `fallback` made readable."""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#") and stripped.lstrip("#").strip():
            return stripped.lstrip("#").strip()
        if stripped:
            break
    return readable_title(fallback)


def readable_title(name: str) -> str:
    """A file name as a title: dashes and underscores become spaces."""
    return name.replace("-", " ").replace("_", " ")


def _read_jsonl_file(path: Path) -> list[Document]:
    with path.open(encoding="utf-8") as lines:
        return documents_from_jsonl(lines, source=str(path))


def documents_from_jsonl(lines: Iterable[str], source: str) -> list[Document]:
    """One Document per non-blank JSON line; errors name `source:line`."""
    documents = []
    for line_number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{source}:{line_number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DocumentError(f"{where}: not valid JSON ({exc.msg})") from exc
        documents.append(document_from_record(record, where))
    return documents


def document_from_record(record: object, where: str) -> Document:
    """A parsed JSON record `{id, title?, text}` as a Document; DocumentError naming `where`.

    The id is a non-empty string or an integer, the text non-empty; the title defaults to the id.
    """
    if not isinstance(record, dict):
        raise DocumentError(f"{where}: expected an object with id/title/text")
    doc_id, text = record.get("id"), record.get("text")
    valid_id = (isinstance(doc_id, str) and doc_id.strip()) or (
        isinstance(doc_id, int) and not isinstance(doc_id, bool)
    )
    if not valid_id or not isinstance(text, str) or not text.strip():
        raise DocumentError(f"{where}: needs a string or integer 'id' and non-empty 'text'")
    title = record.get("title") or str(doc_id)
    return Document(doc_id=str(doc_id), title=str(title), text=text.strip())


def check_unique_ids(documents: Iterable[Document], where: str = "") -> None:
    """Raise DocumentError naming the first repeated id; `where`, if given, prefixes the message."""
    prefix = f"{where}: " if where else ""
    seen: set[str] = set()
    for document in documents:
        if document.doc_id in seen:
            raise DocumentError(f"{prefix}duplicate document id: {document.doc_id!r}")
        seen.add(document.doc_id)
