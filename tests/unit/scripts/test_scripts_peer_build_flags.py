"""llama.cpp's build flags for the peer: this CPU's extensions, never AMX."""

from __future__ import annotations

from scripts.peer_build_flags import cmake_args


def test_an_amx_cpu_gets_its_avx512_extensions_and_no_amx() -> None:
    args = cmake_args({"avx", "avx2", "fma", "f16c", "avx512f", "avx512_bf16", "amx_tile",
                       "amx_int8", "amx_bf16"})  # fmt: skip
    assert "-DGGML_NATIVE=OFF" in args
    assert {"-DGGML_AVX512=ON", "-DGGML_AVX512_BF16=ON", "-DGGML_AVX2=ON"} <= set(args)
    assert {"-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"} <= set(args)
    assert not any(a.startswith("-DGGML_AMX") and a.endswith("=ON") for a in args)


def test_an_avx2_only_cpu_gets_no_avx512() -> None:
    args = cmake_args({"avx", "avx2", "fma", "f16c", "bmi2"})
    assert "-DGGML_AVX2=ON" in args
    assert "-DGGML_AVX512=OFF" in args
    assert "-DGGML_AVX512_VNNI=OFF" in args
