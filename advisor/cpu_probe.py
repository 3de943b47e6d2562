"""This machine measured as the advisor's device: the bandwidth a read of the weights gets and
the dense matrix rates of fp32, bf16 and int8, on the threads torch uses.

    python -m advisor.cpu_probe --out docs/results/advisor-cpu/device.json
    python -m advisor --device docs/results/advisor-cpu/device.json --model qwen2.5-coder-1.5b ...

The GPU presets come from datasheets; what a CPU gives depends on the slice of a machine a VM
gets (cores, memory channels shared with neighbours), so it is measured. Bandwidth: one pass
over a weight-sized fp32 tensor (a sum: read-only, as a decode step streams its weights).
Rates: the product of a (tokens x K) activation by a (K x N) weight in each dtype, as a
prefill's linear layers do; bf16 through torch's matmul (oneDNN, AMX tiles where the CPU has
them), int8 through torch._int_mm (int8 in, int32 out, the arithmetic of W8A8). Each figure is
the best of `--repeats` after a warm-up: a floor is what the machine can do. Every repeat's
time is kept in the JSON. These are torch's kernels, not necessarily vLLM's: the advisor's
floors from them are floors of what this machine can do, to compare with measured serving.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from generation.cpuinfo import read_cpuinfo

GB = 1e9
TFLOPS = 1e12


def cpu_name() -> str:
    """The CPU's model name and the threads this process may use."""
    name = read_cpuinfo().model or platform.processor() or "CPU"
    return f"{name}, {len(os.sched_getaffinity(0))} threads"


def matrix_units() -> list[str]:
    """The CPU flags that decide the matrix rates: AVX-512 bf16/VNNI and AMX."""
    flags = read_cpuinfo().flags
    wanted = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8", "amx_tile")
    return [flag for flag in wanted if flag in flags]


def best_seconds(run: Callable[[], object], repeats: int) -> tuple[float, list[float]]:
    """(the fastest of `repeats` timed calls after one warm-up, every time)."""
    run()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return min(times), times


def probe(
    bandwidth_bytes: int = 2 * 1024**3,
    tokens: int = 512,
    k: int = 1536,
    n: int = 8960,
    repeats: int = 5,
) -> dict[str, Any]:
    """Measure; see the module's docstring. The default product is the 1.5B reader's MLP
    up-projection at 512 prompt tokens."""
    import torch

    torch.manual_seed(0)
    read_s, read_times = best_seconds(
        torch.ones(bandwidth_bytes // 4, dtype=torch.float32).sum, repeats
    )
    flops = 2 * tokens * k * n
    rates: dict[str, float | None] = {}
    times: dict[str, list[float]] = {"read": read_times}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        a, b = torch.randn(tokens, k).to(dtype), torch.randn(k, n).to(dtype)
        seconds, times[name] = best_seconds(partial(torch.matmul, a, b), repeats)
        rates[name] = flops / seconds / TFLOPS
    try:
        a8 = torch.randint(-127, 128, (tokens, k), dtype=torch.int8)
        b8 = torch.randint(-127, 128, (k, n), dtype=torch.int8)
        seconds, times["int8"] = best_seconds(partial(torch._int_mm, a8, b8), repeats)
        rates["int8"] = flops / seconds / TFLOPS
    except (RuntimeError, AttributeError) as error:  # no int8 product on this build
        rates["int8"], times["int8"] = None, []
        print(f"int8: not measured ({error})")
    return {
        "name": cpu_name(),
        "matrix_units": matrix_units(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "memory_bandwidth_gb_per_s": bandwidth_bytes / read_s / GB,
        "fp32_tflops": rates["fp32"],
        "bf16_tflops": rates["bf16"],
        "int8_tops": rates["int8"],
        "memory_gb": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GB,
        "product": {"tokens": tokens, "k": k, "n": n},
        "bandwidth_bytes": bandwidth_bytes,
        "repeats_s": times,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m advisor.cpu_probe", description=__doc__)
    parser.add_argument("--out", type=Path, required=True, help="where to write the JSON")
    parser.add_argument("--bandwidth-gib", type=float, default=2.0, help="tensor read, GiB")
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--k", type=int, default=1536)
    parser.add_argument("--n", type=int, default=8960)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    result = probe(int(args.bandwidth_gib * 1024**3), args.tokens, args.k, args.n, args.repeats)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    shown = {key: value for key, value in result.items() if key != "repeats_s"}
    print(json.dumps(shown, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
