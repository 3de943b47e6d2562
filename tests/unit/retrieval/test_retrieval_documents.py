"""retrieval.documents: a folder of .md/.txt files and JSONL records into Documents."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from retrieval.documents import Document, DocumentError, load_documents


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_markdown_title_comes_from_first_heading_and_id_from_relative_path(tmp_path):
    _write(tmp_path / "guides" / "kv-cache.md", "\n# KV cache basics\n\nThe cache holds keys.\n")

    [document] = load_documents(tmp_path)

    assert document == Document(
        doc_id="guides/kv-cache",
        title="KV cache basics",
        text="# KV cache basics\n\nThe cache holds keys.",
    )


def test_markdown_without_heading_falls_back_to_file_name_with_spaces(tmp_path):
    _write(tmp_path / "prefix_caching-notes.md", "Plain text first.\n# Late heading\n")

    [document] = load_documents(tmp_path)

    assert document.title == "prefix caching notes"


def test_text_file_is_one_stripped_document(tmp_path):
    _write(tmp_path / "notes.txt", "  Batching raises throughput.  \n\n")

    [document] = load_documents(tmp_path)

    assert document == Document("notes", "notes", "Batching raises throughput.")


def test_jsonl_records_become_documents_with_optional_title(tmp_path):
    records = [
        {"id": "a", "title": "Alpha", "text": " First text. "},
        {"id": 7, "text": "Seventh text."},
    ]
    _write(tmp_path / "set.jsonl", "\n".join(json.dumps(r) for r in records) + "\n\n")

    documents = load_documents(tmp_path)

    assert documents == [
        Document("a", "Alpha", "First text."),
        Document("7", "7", "Seventh text."),
    ]


def test_files_are_read_recursively_in_sorted_order_and_other_suffixes_ignored(tmp_path):
    _write(tmp_path / "b.txt", "B")
    _write(tmp_path / "a" / "z.md", "Z")
    _write(tmp_path / "c.csv", "ignored,1")
    _write(tmp_path / "d.MD", "Upper-case suffix counts too.")

    assert [d.doc_id for d in load_documents(tmp_path)] == ["a/z", "b", "d"]


def test_malformed_jsonl_line_error_names_file_and_line(tmp_path):
    path = _write(tmp_path / "bad.jsonl", '{"id": "ok", "text": "fine"}\n\n{"id": "x", "text": \n')

    with pytest.raises(DocumentError) as excinfo:
        load_documents(tmp_path)

    assert f"{path}:3" in str(excinfo.value)
    assert "not valid JSON" in str(excinfo.value)


@pytest.mark.parametrize(
    "line",
    [
        '["not", "an", "object"]',
        '{"id": "x"}',
        '{"id": "x", "text": "   "}',
        '{"id": 1.5, "text": "float ids are not allowed"}',
        '{"text": "no id"}',
    ],
)
def test_jsonl_record_without_usable_id_or_text_is_rejected_with_location(tmp_path, line):
    path = _write(tmp_path / "records.jsonl", line + "\n")

    with pytest.raises(DocumentError, match=f"{path}:1"):
        load_documents(tmp_path)


def test_duplicate_ids_across_files_are_rejected(tmp_path):
    _write(tmp_path / "faq.md", "# FAQ\nText.")
    _write(tmp_path / "more.jsonl", json.dumps({"id": "faq", "text": "Clash."}) + "\n")

    with pytest.raises(DocumentError, match="duplicate document id: 'faq'"):
        load_documents(tmp_path)


def test_missing_folder_is_an_error(tmp_path):
    with pytest.raises(DocumentError, match="document folder not found"):
        load_documents(tmp_path / "nowhere")


def test_empty_folder_gives_no_documents(tmp_path):
    assert load_documents(tmp_path) == []
