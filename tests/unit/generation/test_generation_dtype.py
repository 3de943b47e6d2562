"""`dtype: fastest`: bfloat16 on CPUs with native bf16, float32 on the others, bfloat16 for
a 4-bit weight-only checkpoint anywhere, vLLM's own `auto` on a GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from generation.dtype import cpu_flags, fastest_dtype, resolve_engine_kwargs

AVX2 = {"fpu", "sse4_2", "avx", "avx2", "fma"}
AVX512_BF16 = AVX2 | {"avx512f", "avx512_vnni", "avx512_bf16"}
AMX = AVX2 | {"avx512f", "amx_tile", "amx_bf16", "amx_int8"}
AVX512_WITHOUT_BF16 = AVX2 | {"avx512f", "avx512bw", "avx512_vnni"}


def _checkpoint(tmp_path: Path, quantization: dict | None = None) -> str:
    config: dict = {"architectures": ["Qwen2ForCausalLM"], "torch_dtype": "bfloat16"}
    if quantization is not None:
        config["quantization_config"] = quantization
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (AVX2, "float32"),
        (AVX512_WITHOUT_BF16, "float32"),
        (AVX512_BF16, "bfloat16"),
        (AMX, "bfloat16"),
        (set(), "float32"),
    ],
)
def test_the_cpu_decides_for_full_precision_weights(
    tmp_path: Path, flags: set[str], expected: str
) -> None:
    assert fastest_dtype(_checkpoint(tmp_path), flags, has_gpu=False) == expected


def test_a_4_bit_weight_only_checkpoint_gets_bfloat16_even_without_native_bf16(
    tmp_path: Path,
) -> None:
    gptq = _checkpoint(tmp_path, {"quant_method": "gptq", "bits": 4})
    assert fastest_dtype(gptq, AVX2, has_gpu=False) == "bfloat16"


def test_a_gpu_leaves_the_choice_to_vllm(tmp_path: Path) -> None:
    assert fastest_dtype(_checkpoint(tmp_path), AVX512_BF16, has_gpu=True) == "auto"


def test_only_fastest_is_replaced(tmp_path: Path) -> None:
    source = _checkpoint(tmp_path)
    kwargs = {"dtype": "fastest", "enforce_eager": True}
    assert resolve_engine_kwargs(kwargs, source, AVX2, has_gpu=False) == {
        "dtype": "float32", "enforce_eager": True}  # fmt: skip
    assert kwargs["dtype"] == "fastest"  # the caller's dict is left as it was
    for asked in ({"dtype": "float16"}, {"dtype": "auto"}, {}):
        assert resolve_engine_kwargs(asked, source, AVX512_BF16, has_gpu=False) == asked


def test_cpu_flags_reads_the_first_processor(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 avx512_bf16\n\n"
        "processor\t: 1\nflags\t\t: fpu\n"
    )
    assert cpu_flags(cpuinfo) == {"fpu", "avx2", "avx512_bf16"}
    assert cpu_flags(tmp_path / "absent") == frozenset()


def test_this_machine_s_flags_are_read() -> None:
    if not Path("/proc/cpuinfo").is_file():
        pytest.skip("no /proc/cpuinfo on this system")
    assert cpu_flags() & {"sse2", "avx", "avx2", "neon", "asimd", "fp"}
