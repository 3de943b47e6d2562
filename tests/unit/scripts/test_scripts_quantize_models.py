"""scripts.quantize_models, the parts that run without llmcompressor: where a checkpoint
goes, what counts as complete, and the seeded calibration windows from the corpus."""

from __future__ import annotations

from pathlib import Path

from scripts import quantize_models as qm


def test_output_sits_beside_the_model_named_by_scheme() -> None:
    model = Path(".models/qwen2.5-coder-1.5b-instruct")
    assert qm.output_for(model, "int4") == Path(".models/qwen2.5-coder-1.5b-instruct-w4a16")
    assert qm.output_for(model, "int8") == Path(".models/qwen2.5-coder-1.5b-instruct-w8a8")
    rtn = qm.output_for(model, "int8", "rtn")
    assert rtn == Path(".models/qwen2.5-coder-1.5b-instruct-w8a8-rtn")


def test_windows_are_whole_seeded_and_never_overlap() -> None:
    stream = list(range(1000))
    first = qm.windows(stream, 100, 4, seed=0)
    assert first == qm.windows(stream, 100, 4, seed=0)
    assert first != qm.windows(stream, 100, 4, seed=1)
    assert all(len(w) == 100 and w[0] % 100 == 0 for w in first)
    assert len({w[0] for w in first}) == 4
    assert len(qm.windows(stream, 100, 50, seed=0)) == 10  # fewer when the stream is short


def test_the_corpus_is_read_in_name_order_and_must_not_be_empty(tmp_path: Path) -> None:
    (tmp_path / "b.md").write_text("second")
    (tmp_path / "a.txt").write_text("first")
    (tmp_path / "c.png").write_bytes(b"\x89PNG")
    assert qm.corpus_texts(tmp_path) == ["first", "second"]
    empty = tmp_path / "empty"
    empty.mkdir()
    try:
        qm.corpus_texts(empty)
    except SystemExit as exc:
        assert "no .md or .txt" in str(exc)
    else:
        raise AssertionError("an empty corpus must stop the run")


def test_complete_means_a_manifest_and_a_config(tmp_path: Path) -> None:
    assert not qm.is_complete(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    assert not qm.is_complete(tmp_path)
    (tmp_path / qm.MANIFEST).write_text("{}")
    assert qm.is_complete(tmp_path)


def test_the_project_corpus_calibrates() -> None:
    assert len(qm.corpus_texts(qm.CORPUS)) >= 10
