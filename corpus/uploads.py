"""Turn uploaded files (and the documents API's JSON records) into Documents.

The documents API accepts text, Markdown, HTML, PDF, JSON and JSONL files. Each is read here
into the same `Document` records that `retrieval.documents` reads from a folder, with the same
title and record rules, so an uploaded collection indexes exactly like a prepared one. Anything
malformed is a DocumentError naming the file, which the HTTP layer can show to the client as is.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import PurePosixPath

from retrieval.documents import (
    Document,
    DocumentError,
    check_unique_ids,
    document_from_record,
    documents_from_jsonl,
    readable_title,
    title_of,
)

SUPPORTED_SUFFIXES = (".txt", ".md", ".html", ".htm", ".pdf", ".json", ".jsonl")
MAX_DOCUMENT_CHARS = 2_000_000  # a file whose text exceeds it is refused

# Used only when the file name has no supported suffix.
_SUFFIX_BY_CONTENT_TYPE = {
    "text/plain": ".txt",
    "text/markdown": ".md",
    "text/x-markdown": ".md",
    "text/html": ".html",
    "application/pdf": ".pdf",
    "application/json": ".json",
    "application/jsonl": ".jsonl",
    "application/x-ndjson": ".jsonl",
}


class UnsupportedUpload(DocumentError):
    """An uploaded file whose type (by suffix or content type) is not one we can read."""


def parse_upload(filename: str, content: bytes, content_type: str | None = None) -> list[Document]:
    """The Documents in one uploaded file.

    The type comes from the suffix of `filename`, else from `content_type`. `.txt`, `.md`,
    `.html`/`.htm` and `.pdf` give one document whose id is the file's stem (any folders in the
    name dropped); `.json` (`{"documents": [...]}` or a list of records) and `.jsonl` give one per
    record. Raises UnsupportedUpload for an unknown type and DocumentError, naming the file,
    for anything malformed: text that is not UTF-8, no text, duplicate ids, text over
    MAX_DOCUMENT_CHARS, a PDF that cannot be read or has no extractable text.
    """
    label = filename or "upload"
    suffix = _suffix_of(label, filename, content_type)
    documents = _PARSERS[suffix](label, _stem_of(filename), content)
    if not documents:
        raise DocumentError(f"{label}: contains no documents")
    for document in documents:
        _check_size(document, label)
    check_unique_ids(documents, where=label)
    return documents


def documents_from_records(records: object, where: str = "request") -> list[Document]:
    """The documents API's JSON `documents` list (already parsed) as Documents.

    Each record is `{id, title?, text}` with the rules of JSONL records; the list must be
    non-empty, ids unique and each text within MAX_DOCUMENT_CHARS. Errors name `where` and
    the record's index.
    """
    if not isinstance(records, list):
        raise DocumentError(f"{where}: 'documents' must be a list of {{id, title?, text}} records")
    if not records:
        raise DocumentError(f"{where}: 'documents' is empty")
    documents = [
        document_from_record(record, f"{where}: documents[{index}]")
        for index, record in enumerate(records)
    ]
    for document in documents:
        _check_size(document, where)
    check_unique_ids(documents, where=where)
    return documents


def upload_suffix(filename: str, content_type: str | None) -> str | None:
    """The supported suffix a file is read by: its name's, else its content type's; None
    when neither is supported."""
    suffix = PurePosixPath(_base_name(filename)).suffix.lower()
    if suffix in SUPPORTED_SUFFIXES:
        return suffix
    media_type = (content_type or "").split(";")[0].strip().lower()
    return _SUFFIX_BY_CONTENT_TYPE.get(media_type)


def _suffix_of(label: str, filename: str, content_type: str | None) -> str:
    suffix = upload_suffix(filename, content_type)
    if suffix is not None:
        return suffix
    named = PurePosixPath(_base_name(filename)).suffix.lower()
    media_type = (content_type or "").split(";")[0].strip().lower()
    raise UnsupportedUpload(
        f"{label}: unsupported file type (suffix {named or 'none'}, content type "
        f"{media_type or 'none'}); supported: {', '.join(SUPPORTED_SUFFIXES)}"
    )


def _base_name(filename: str) -> str:
    # Browsers on Windows may send the whole path, with backslashes.
    return filename.replace("\\", "/").rsplit("/", 1)[-1]


def _stem_of(filename: str) -> str:
    return PurePosixPath(_base_name(filename)).stem


def _check_size(document: Document, label: str) -> None:
    if len(document.text) > MAX_DOCUMENT_CHARS:
        raise DocumentError(
            f"{label}: document {document.doc_id!r} has {len(document.text)} characters of text,"
            f" more than the limit of {MAX_DOCUMENT_CHARS}"
        )


def _decode(label: str, content: bytes) -> str:
    try:
        return content.decode("utf-8-sig")  # -sig: a leading byte-order mark is dropped
    except UnicodeDecodeError as exc:
        raise DocumentError(
            f"{label}: not UTF-8 text (invalid byte at offset {exc.start})"
        ) from exc


def _single_document(label: str, stem: str, title: str | None, text: str) -> list[Document]:
    if not stem:
        raise DocumentError(f"{label}: needs a file name to name the document")
    if not text.strip():
        raise DocumentError(f"{label}: has no text")
    return [Document(doc_id=stem, title=title or readable_title(stem), text=text.strip())]


def _parse_text(label: str, stem: str, content: bytes) -> list[Document]:
    text = _decode(label, content)
    return _single_document(label, stem, title_of(text, fallback=stem), text)


def _parse_html(label: str, stem: str, content: bytes) -> list[Document]:
    page = _VisibleText()
    page.feed(_decode(label, content))
    page.close()
    return _single_document(label, stem, page.title(), page.text())


def _parse_json(label: str, stem: str, content: bytes) -> list[Document]:
    try:
        body = json.loads(_decode(label, content))
    except json.JSONDecodeError as exc:
        raise DocumentError(f"{label}: not valid JSON ({exc.msg}, line {exc.lineno})") from exc
    if isinstance(body, dict) and "documents" in body:
        return documents_from_records(body["documents"], where=label)
    if isinstance(body, list):
        return documents_from_records(body, where=label)
    raise DocumentError(f'{label}: expected {{"documents": [...]}} or a list of records')


def _parse_jsonl(label: str, stem: str, content: bytes) -> list[Document]:
    # Split on "\n" only: str.splitlines would also split inside strings at U+2028 and the like.
    return documents_from_jsonl(_decode(label, content).split("\n"), source=label)


def _parse_pdf(label: str, stem: str, content: bytes) -> list[Document]:
    title, pages = _read_pdf(label, content)
    text = "\n\n".join(page for page in pages if page)
    if not text:
        raise DocumentError(
            f"{label}: the PDF has no extractable text (a scan? run OCR on it first)"
        )
    return _single_document(label, stem, title, text)


def _read_pdf(label: str, content: bytes) -> tuple[str, list[str]]:
    """The PDF's metadata title ("" if none) and the stripped text of each page."""
    from pypdf import PdfReader  # heavy; only PDF uploads need it

    try:
        reader = PdfReader(io.BytesIO(content))
        if reader.is_encrypted and not reader.decrypt(""):
            raise DocumentError(f"{label}: the PDF is password-protected")
        title = (reader.metadata.title or "") if reader.metadata else ""
        pages: list[str] = []
        total_chars = 0
        for page in reader.pages:
            pages.append((page.extract_text() or "").strip())
            total_chars += len(pages[-1])
            if total_chars > MAX_DOCUMENT_CHARS:  # stop early: the document is refused anyway
                break
    except DocumentError:
        raise
    except Exception as exc:  # pypdf raises many types (not only PyPdfError) on broken files
        raise DocumentError(f"{label}: not a readable PDF ({type(exc).__name__}: {exc})") from exc
    return " ".join(str(title).split()), pages


_PARSERS: dict[str, Callable[[str, str, bytes], list[Document]]] = {
    ".txt": _parse_text,
    ".md": _parse_text,
    ".html": _parse_html,
    ".htm": _parse_html,
    ".pdf": _parse_pdf,
    ".json": _parse_json,
    ".jsonl": _parse_jsonl,
}

# Elements whose content is not visible text. `head` also ends where `body` starts.
_HIDDEN_TAGS = frozenset({"script", "style", "head", "template"})
_BLOCK_TAGS = frozenset({
    "address", "article", "aside", "blockquote", "br", "dd", "details", "dialog", "div", "dl",
    "dt", "fieldset", "figcaption", "figure", "footer", "form", "h1", "h2", "h3", "h4", "h5",
    "h6", "header", "hr", "li", "main", "nav", "ol", "p", "pre", "section", "summary", "table",
    "tbody", "tfoot", "thead", "tr", "ul",
})  # fmt: skip
_CELL_TAGS = frozenset({"td", "th"})
_WHITESPACE = re.compile(r"\s+")


class _VisibleText(HTMLParser):
    """Collects an HTML page's visible text (blocks on their own lines), <title> and first <h1>."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)  # entities arrive decoded in handle_data
        self._parts: list[str] = []
        self._title_parts: list[str] = []
        self._h1_parts: list[str] = []
        self._hidden: list[str] = []  # the hidden elements now open
        self._in_title = False
        self._h1_state = "before"  # "before", "inside", then "done" after the first </h1>

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title":
            self._in_title = True
        elif tag == "body":
            self._hidden = [open_tag for open_tag in self._hidden if open_tag != "head"]
        elif tag in _HIDDEN_TAGS:
            self._hidden.append(tag)
        elif tag in _BLOCK_TAGS:
            self._parts.append("\n")
        elif tag in _CELL_TAGS:
            self._parts.append(" ")
        if tag == "h1" and self._h1_state == "before":
            self._h1_state = "inside"

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False
        elif tag in _HIDDEN_TAGS and tag in self._hidden:
            del self._hidden[len(self._hidden) - 1 - self._hidden[::-1].index(tag) :]
        elif tag in _BLOCK_TAGS:
            self._parts.append("\n")
        if tag == "h1" and self._h1_state == "inside":
            self._h1_state = "done"

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self._title_parts.append(data)
        elif not self._hidden:
            self._parts.append(_WHITESPACE.sub(" ", data))
            if self._h1_state == "inside":
                self._h1_parts.append(data)

    def text(self) -> str:
        """The visible text: one line per block, whitespace collapsed, blank lines dropped."""
        lines = (" ".join(line.split()) for line in "".join(self._parts).split("\n"))
        return "\n".join(line for line in lines if line)

    def title(self) -> str:
        """The <title>, else the first <h1>, else ""; whitespace collapsed."""
        return " ".join("".join(self._title_parts).split()) or " ".join(
            "".join(self._h1_parts).split()
        )
