"""corpus.parse_worker.BoundedParser: PDF and HTML parsed in a child process that a time or
memory limit stops, the file failing with a clear error; other formats parsed in place."""

from __future__ import annotations

import os
import time

import pytest
from crafted_pdfs import slow_pdf

from corpus.parse_worker import BoundedParser, ParseLimits
from retrieval.documents import Document, DocumentError

MIB = 1 << 20


# The child process imports these by name (forkserver): module-level functions only.
def never_ends(filename: str, content: bytes, content_type: str | None) -> list[Document]:
    while True:
        time.sleep(0.05)


def hoards_memory(filename: str, content: bytes, content_type: str | None) -> list[Document]:
    hoard = []
    while True:
        hoard.append(bytearray(16 * MIB))


def crashes(filename: str, content: bytes, content_type: str | None) -> list[Document]:
    os._exit(3)


def has_a_bug(filename: str, content: bytes, content_type: str | None) -> list[Document]:
    raise KeyError("oops")


@pytest.fixture
def bounded():
    """Makes BoundedParsers, and stops their server processes when the test ends."""
    made: list[BoundedParser] = []

    def make(limits: ParseLimits | None = None, parse=None) -> BoundedParser:
        limits = limits or ParseLimits()
        made.append(BoundedParser(limits, parse) if parse else BoundedParser(limits))
        return made[-1]

    yield make
    for parser in made:
        parser.close()


def test_html_is_parsed_in_the_child_like_in_place(bounded):
    parser = bounded(ParseLimits(timeout_s=30))

    [document] = parser("page.html", b"<title>T</title><p>Visible text.</p>", "text/html")

    assert (document.doc_id, document.title, document.text) == ("page", "T", "Visible text.")


def test_a_parse_past_its_deadline_is_stopped_and_fails_its_file(bounded):
    parser = bounded(ParseLimits(timeout_s=1), parse=never_ends)
    started = time.monotonic()

    with pytest.raises(DocumentError, match=r"report\.pdf: parsing took longer than 1 s"):
        parser("report.pdf", b"%PDF-1.4", "application/pdf")

    assert time.monotonic() - started < 10


def test_a_parse_past_its_memory_is_stopped_and_fails_its_file(bounded):
    parser = bounded(ParseLimits(timeout_s=60, memory_bytes=128 * MIB), parse=hoards_memory)

    with pytest.raises(DocumentError, match=r"page\.html: parsing needed more than 128 MiB"):
        parser("page.html", b"<p>x</p>", None)


@pytest.mark.parametrize(
    ("parse", "message"),
    [(crashes, r"stopped without an answer \(exit code 3\)"), (has_a_bug, r"\(KeyError\)")],
)
def test_a_parser_that_dies_or_breaks_fails_its_file_only(bounded, parse, message):
    with pytest.raises(DocumentError, match=message):
        bounded(parse=parse)("a.pdf", b"%PDF-1.4", None)


def test_the_server_answers_file_after_file_and_comes_back_if_killed(bounded):
    parser = bounded()
    page = b"<p>Visible text.</p>"

    assert parser("a.html", page, None)[0].text == "Visible text."
    assert parser._server is not None
    parser._server.kill()
    parser._server.wait()

    assert parser("b.html", page, None)[0].doc_id == "b"


def test_plain_text_and_json_are_parsed_in_place(bounded):
    parser = bounded(parse=crashes)  # would fail if a child were used

    [document] = parser("notes.md", b"# Notes\nBody.", None)

    assert document.title == "Notes"


def test_a_crafted_pdf_that_keeps_pypdf_busy_fails_within_the_limit(bounded):
    # 1 page inflating to 5 MB of operators that show nothing: ~8 s of pypdf here.
    parser = bounded(ParseLimits(timeout_s=2))
    started = time.monotonic()

    with pytest.raises(DocumentError, match="took longer than 2 s"):
        parser("slow.pdf", slow_pdf(), "application/pdf")

    assert time.monotonic() - started < 10
