"""`weights: fastest`: the reader's INT8 checkpoint on a CPU with AMX-INT8 that holds it,
the given weights everywhere else; `given` never swaps."""

from __future__ import annotations

from pathlib import Path

import pytest

from generation.weights import FINISHED_MARK, fastest_weights, int8_checkpoint, resolve_weights

AMX = {"avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"}
AVX512_WITHOUT_AMX = {"avx512f", "avx512_bf16", "avx512_vnni"}


def _reader(tmp_path: Path, int8: str | None) -> str:
    """A reader folder, and beside it its INT8 checkpoint: finished, half written, none."""
    reader = tmp_path / "qwen"
    reader.mkdir()
    if int8 is not None:
        folder = int8_checkpoint(str(reader))
        folder.mkdir()
        (folder / "config.json").write_text("{}")
        if int8 == "finished":
            (folder / FINISHED_MARK).write_text("{}")
    return str(reader)


def test_the_int8_checkpoint_is_where_make_models_int8_writes_it() -> None:
    from scripts.quantize_models import MANIFEST, output_for

    reader = Path(".models/qwen2.5-coder-1.5b-instruct")
    assert int8_checkpoint(str(reader)) == output_for(reader, "int8", "rtn")
    assert FINISHED_MARK == MANIFEST


def test_a_cpu_with_amx_int8_serves_the_finished_int8_checkpoint(tmp_path: Path) -> None:
    reader = _reader(tmp_path, "finished")
    assert fastest_weights(reader, AMX, has_gpu=False) == str(tmp_path / "qwen-w8a8-rtn")


@pytest.mark.parametrize(
    ("int8", "flags", "has_gpu"),
    [
        (None, AMX, False),  # never made
        ("half written", AMX, False),  # a quantization that did not finish
        ("finished", AVX512_WITHOUT_AMX, False),  # never measured without AMX
        ("finished", set(), False),
        ("finished", AMX, True),  # a GPU node: vLLM's CUDA kernels, another choice
    ],
)
def test_anywhere_else_the_given_weights_are_served(
    tmp_path: Path, int8: str | None, flags: set[str], has_gpu: bool
) -> None:
    reader = _reader(tmp_path, int8)
    assert fastest_weights(reader, flags, has_gpu) == reader


def test_given_weights_are_never_swapped(tmp_path: Path) -> None:
    reader = _reader(tmp_path, "finished")
    assert resolve_weights("given", reader, AMX, has_gpu=False) == reader
    assert resolve_weights("fastest", reader, AMX, has_gpu=False) != reader
