"""Print the CMake arguments that build llama.cpp (llama-cpp-python, make peer) for this CPU
without its AMX kernels.

llama.cpp's default build (GGML_NATIVE) compiles for every extension the CPU has; on a CPU
with AMX its AMX matmul dies of a general protection fault on the first prompt (seen here on
an Intel Xeon with AMX: `ldtilecfg` in ggml_backend_amx_mul_mat; upstream llama.cpp issue
20824, fix proposed in pull request 26954, open). So the build names the extensions itself:
each x86 one this CPU's flags list, AMX never.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

from generation.cpuinfo import read_cpuinfo

# GGML's CMake option for each /proc/cpuinfo flag it compiles for.
GGML_OPTIONS = {
    "avx": "GGML_AVX",
    "avx2": "GGML_AVX2",
    "avx_vnni": "GGML_AVX_VNNI",
    "bmi2": "GGML_BMI2",
    "fma": "GGML_FMA",
    "f16c": "GGML_F16C",
    "avx512f": "GGML_AVX512",
    "avx512vbmi": "GGML_AVX512_VBMI",
    "avx512_vnni": "GGML_AVX512_VNNI",
    "avx512_bf16": "GGML_AVX512_BF16",
}
NEVER = ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")


def cmake_args(flags: Iterable[str]) -> list[str]:
    """GGML_NATIVE off, every option of GGML_OPTIONS on where `flags` has it, AMX off."""
    present = set(flags)
    args = ["-DGGML_NATIVE=OFF"]
    args += [f"-D{option}={'ON' if flag in present else 'OFF'}"
             for flag, option in GGML_OPTIONS.items()]  # fmt: skip
    return args + [f"-D{option}=OFF" for option in NEVER]


def main() -> int:
    print(" ".join(cmake_args(read_cpuinfo().flags)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
