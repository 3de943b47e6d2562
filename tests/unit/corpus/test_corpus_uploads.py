"""corpus.uploads: uploaded .txt/.md/.html/.pdf/.json/.jsonl files into Documents."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from crafted_pdfs import pdf_file

from corpus import uploads
from corpus.uploads import UnsupportedUpload, documents_from_records, parse_upload
from retrieval.documents import Document, DocumentError

ROOT = Path(__file__).resolve().parents[3]


def _pdf(pages: list[str | None], title: str | None = None) -> bytes:
    """A minimal valid PDF, written by hand: one page per entry, each a line of Helvetica text
    (None: a page with no text at all), and an /Info title if given."""
    font = b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"
    objects: list[bytes] = [b"<< /Type /Catalog /Pages 2 0 R >>", b"", font]
    page_numbers = []
    for text in pages:
        page_numbers.append(len(objects) + 1)
        contents = f"{len(objects) + 2} 0 R" if text is not None else "[]"
        page = (
            "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
            f"/Resources << /Font << /F1 3 0 R >> >> /Contents {contents} >>"
        )
        objects.append(page.encode())
        if text is not None:
            stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode()
            objects.append(b"<< /Length %d >>\nstream\n%s\nendstream" % (len(stream), stream))
    kids = " ".join(f"{number} 0 R" for number in page_numbers)
    objects[1] = f"<< /Type /Pages /Kids [{kids}] /Count {len(pages)} >>".encode()
    info = ""
    if title is not None:
        objects.append(f"<< /Title ({title}) >>".encode())
        info = f" /Info {len(objects)} 0 R"
    return pdf_file(objects, info)


# Text and Markdown


def test_markdown_is_one_document_titled_by_its_heading_with_the_stem_as_id():
    content = b"\n# KV cache basics\n\nThe cache holds keys.\n"

    assert parse_upload("kv-cache.md", content) == [
        Document("kv-cache", "KV cache basics", "# KV cache basics\n\nThe cache holds keys.")
    ]


def test_text_without_heading_is_titled_by_the_readable_stem_and_path_parts_are_dropped():
    [document] = parse_upload("C:\\Users\\me\\prefix_caching-notes.TXT", b"  Plain text.  \n")

    assert document == Document("prefix_caching-notes", "prefix caching notes", "Plain text.")


def test_a_leading_byte_order_mark_is_not_part_of_the_text():
    [document] = parse_upload("notes.txt", "\ufeff# Notes\nBody.".encode())

    assert document.title == "Notes"
    assert document.text == "# Notes\nBody."


def test_type_comes_from_the_content_type_when_the_name_has_no_known_suffix():
    [document] = parse_upload("README", b"# Read me\nHello.", "text/markdown; charset=utf-8")

    assert document == Document("README", "Read me", "# Read me\nHello.")


def test_the_suffix_wins_over_the_content_type():
    [document] = parse_upload("page.md", b"<p>kept as markup</p>", "text/html")

    assert document.text == "<p>kept as markup</p>"


@pytest.mark.parametrize(
    ("filename", "content_type"),
    [("report.docx", None), ("data.csv", "text/csv"), ("blob", "application/octet-stream")],
)
def test_an_unknown_type_is_an_unsupported_upload_naming_the_file(filename, content_type):
    with pytest.raises(UnsupportedUpload, match=f"{filename}: unsupported file type"):
        parse_upload(filename, b"anything", content_type)


def test_unsupported_upload_is_a_document_error():
    assert issubclass(UnsupportedUpload, DocumentError)


def test_text_that_is_not_utf8_is_a_document_error_naming_the_file():
    with pytest.raises(DocumentError, match=r"latin\.txt: not UTF-8 text"):
        parse_upload("latin.txt", "café".encode("latin-1"))


@pytest.mark.parametrize("content", [b"", b"  \n\t\n"])
def test_empty_text_is_a_document_error(content):
    with pytest.raises(DocumentError, match=r"empty\.txt: has no text"):
        parse_upload("empty.txt", content)


def test_a_nameless_text_upload_cannot_name_its_document():
    with pytest.raises(DocumentError, match="needs a file name"):
        parse_upload("", b"Some text.", "text/plain")


def test_text_over_the_limit_is_refused(monkeypatch):
    monkeypatch.setattr(uploads, "MAX_DOCUMENT_CHARS", 10)

    assert parse_upload("ok.txt", b"0123456789")[0].text == "0123456789"
    with pytest.raises(DocumentError, match=r"big\.txt: .*11 characters.*limit of 10"):
        parse_upload("big.txt", b"0123456789A")


def test_the_default_limit_is_two_million_characters():
    assert uploads.MAX_DOCUMENT_CHARS == 2_000_000
    with pytest.raises(DocumentError, match="limit of 2000000"):
        parse_upload("huge.txt", b"x" * 2_000_001)


# HTML

_PAGE = b"""<!DOCTYPE html>
<html><head>
  <title>  Prefix   caching &amp; you </title>
  <style>p { color: red; }</style>
  <script>var hidden = "<p>not text</p>";</script>
</head>
<body>
  <h1>Caching  overview</h1>
  <p>Reuse the <b>KV cache</b>
     across requests &mdash; it&#39;s &lt;fast&gt;.</p>
  <script type="text/javascript">document.write("nope");</script>
  <ul><li>One</li><li>Two&nbsp;items</li></ul>
  Tail<br>line
</body></html>"""


def test_html_keeps_visible_text_with_blocks_on_lines_and_entities_decoded():
    [document] = parse_upload("guide.html", _PAGE)

    assert document.doc_id == "guide"
    assert document.title == "Prefix caching & you"
    assert document.text == (
        "Caching overview\n"
        "Reuse the KV cache across requests — it's <fast>.\n"
        "One\n"
        "Two items\n"
        "Tail\n"
        "line"
    )


def test_html_title_falls_back_to_the_first_h1_then_the_stem():
    first_h1 = b"<body><h1>First <i>one</i></h1><h1>Second</h1><p>x</p></body>"
    no_heading = b"<p>Only a paragraph.</p>"

    assert parse_upload("a.htm", first_h1)[0].title == "First one"
    assert parse_upload("batch_size-tuning.htm", no_heading)[0].title == "batch size tuning"


def test_html_body_is_read_even_when_head_is_never_closed():
    [document] = parse_upload("p.html", b"<html><head><title>T</title><body><p>Body text.</p>")

    assert (document.title, document.text) == ("T", "Body text.")


def test_html_table_cells_are_separated():
    [document] = parse_upload("t.html", b"<table><tr><td>a</td><td>b</td></tr></table>")

    assert document.text == "a b"


def test_html_with_no_visible_text_is_a_document_error():
    page = b"<html><head><title>Only a title</title></head><body><script>x()</script></body>"

    with pytest.raises(DocumentError, match=r"blank\.html: has no text"):
        parse_upload("blank.html", page)


def test_html_by_content_type():
    [document] = parse_upload("upload", b"<p>Hi &amp; bye</p>", "TEXT/HTML")

    assert document.text == "Hi & bye"


# PDF


def test_pdf_text_of_every_page_joined_by_blank_lines_with_the_metadata_title():
    content = _pdf(["Batching raises throughput.", "Caching cuts latency."], title="Serving")

    [document] = parse_upload("serving-notes.pdf", content)

    assert document == Document(
        "serving-notes", "Serving", "Batching raises throughput.\n\nCaching cuts latency."
    )


def test_pdf_without_metadata_title_is_titled_by_the_stem_and_typed_by_content_type():
    [document] = parse_upload("scan_01", _pdf(["A sentence on one page."]), "application/pdf")

    assert document == Document("scan_01", "scan 01", "A sentence on one page.")


def test_pdf_pages_without_text_are_skipped():
    [document] = parse_upload("mixed.pdf", _pdf([None, "Only this page has text."]))

    assert document.text == "Only this page has text."


def test_pdf_without_extractable_text_is_a_document_error_saying_so():
    with pytest.raises(DocumentError, match=r"scan\.pdf: the PDF has no extractable text"):
        parse_upload("scan.pdf", _pdf([None, None], title="A scan"))


@pytest.mark.parametrize(
    "content",
    [b"", b"not a pdf at all", b"%PDF-1.4\n1 0 obj\n<< /Type /Catalog", b"\x00\xff" * 64],
)
def test_corrupt_pdf_is_a_document_error_naming_the_file(content):
    with pytest.raises(DocumentError, match=r"broken\.pdf: "):
        parse_upload("broken.pdf", content)


def test_pdf_text_over_the_limit_is_refused(monkeypatch):
    monkeypatch.setattr(uploads, "MAX_DOCUMENT_CHARS", 20)

    with pytest.raises(DocumentError, match=r"long\.pdf: .*limit of 20"):
        parse_upload("long.pdf", _pdf(["Fifteen chars..", "Fifteen more..."]))


def test_pypdf_is_imported_only_when_a_pdf_is_read():
    code = (
        "import sys, corpus.uploads as u; "
        "u.parse_upload('a.txt', b'x'); print('pypdf' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=False
    )

    assert result.stdout.strip() == "False", result.stderr


# JSON and JSONL


def test_json_file_with_a_documents_object():
    body = {
        "documents": [{"id": "a", "title": "Alpha", "text": " First. "}, {"id": 2, "text": "B"}]
    }

    documents = parse_upload("set.json", json.dumps(body).encode())

    assert documents == [Document("a", "Alpha", "First."), Document("2", "2", "B")]


def test_json_file_with_a_list_of_records():
    records = [{"id": "x", "text": "Ex."}, {"id": "y", "text": "Why."}]

    documents = parse_upload("list.json", json.dumps(records).encode())

    assert [d.doc_id for d in documents] == ["x", "y"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"{not json", r"bad\.json: not valid JSON"),
        (b'{"docs": []}', r"bad\.json: expected \{\"documents\""),
        (b'"a string"', r"bad\.json: expected"),
        (b'{"documents": {"id": "a"}}', r"bad\.json: 'documents' must be a list"),
        (b"[]", r"bad\.json: 'documents' is empty"),
        (b'[{"id": "a", "text": "ok"}, {"id": "b"}]', r"bad\.json: documents\[1\]: needs"),
        (b'[{"id": "a", "text": "1"}, {"id": "a", "text": "2"}]', "duplicate document id: 'a'"),
    ],
)
def test_malformed_json_file_is_a_document_error_naming_the_file(content, message):
    with pytest.raises(DocumentError, match=message):
        parse_upload("bad.json", content)


def test_jsonl_file_follows_the_jsonl_record_rules():
    content = b'{"id": "a", "title": "Alpha", "text": "First."}\r\n\n{"id": 7, "text": "Seven"}\n'

    documents = parse_upload("set.jsonl", content, "application/json")

    assert documents == [Document("a", "Alpha", "First."), Document("7", "7", "Seven")]


def test_jsonl_text_may_hold_a_unicode_line_separator():
    line = json.dumps({"id": "u", "text": "one\u2028two"}, ensure_ascii=False)

    [document] = parse_upload("u.jsonl", line.encode())

    assert document.text == "one\u2028two"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"id": "a", "text": "ok"}\n\n{"id": "b", "text": \n', r"bad\.jsonl:3: not valid JSON"),
        (b'{"id": 1.5, "text": "float id"}\n', r"bad\.jsonl:1: needs a string or integer"),
        (b'{"id": "a", "text": "1"}\n{"id": "a", "text": "2"}\n', r"bad\.jsonl: duplicate"),
        (b"\n\n", r"bad\.jsonl: contains no documents"),
        (b'{"id": "a", "text": "caf\xe9"}\n', r"bad\.jsonl: not UTF-8"),
    ],
)
def test_malformed_jsonl_file_is_a_document_error_naming_the_file(content, message):
    with pytest.raises(DocumentError, match=message):
        parse_upload("bad.jsonl", content)


# documents_from_records (the JSON request body)


def test_records_become_documents_with_the_title_defaulting_to_the_id():
    records = [{"id": "a", "title": "Alpha", "text": "First."}, {"id": 3, "text": " Third. "}]

    assert documents_from_records(records) == [
        Document("a", "Alpha", "First."),
        Document("3", "3", "Third."),
    ]


@pytest.mark.parametrize(
    ("records", "message"),
    [
        ({"id": "a", "text": "x"}, r"request: 'documents' must be a list"),
        ([], r"request: 'documents' is empty"),
        (["text only"], r"request: documents\[0\]: expected an object"),
        ([{"id": "a", "text": "x"}, {"id": True, "text": "y"}], r"request: documents\[1\]: needs"),
        ([{"id": " ", "text": "x"}], r"documents\[0\]: needs"),
        ([{"id": "a", "text": ""}], r"documents\[0\]: needs"),
        ([{"id": "a", "text": "x"}, {"id": "a", "text": "y"}], "duplicate document id: 'a'"),
        ([{"id": 1, "text": "x"}, {"id": "1", "text": "y"}], "duplicate document id: '1'"),
    ],
)
def test_invalid_records_are_a_document_error_naming_the_record(records, message):
    with pytest.raises(DocumentError, match=message):
        documents_from_records(records)


def test_records_errors_name_the_given_place_and_oversize_text_is_refused(monkeypatch):
    monkeypatch.setattr(uploads, "MAX_DOCUMENT_CHARS", 3)

    with pytest.raises(DocumentError, match=r"batch 2: document 'a' has 4 characters"):
        documents_from_records([{"id": "a", "text": "four"}], where="batch 2")
