"""This machine's CPU as /proc/cpuinfo describes it (Linux): the one reader of that file.

The generator resolves `dtype: fastest` from its flags (generation.dtype), the labs name the
CPU beside every figure (bench.labs.machine) and the advisor's probe records it with the
rates it measured (advisor.cpu_probe).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")


@dataclass(frozen=True)
class CpuInfo:
    model: str | None  # "model name" of the first processor; None where there is none
    flags: frozenset[str]  # the first processor's ("flags" on x86, "Features" on Arm)
    logical_cores: int  # "processor" entries: every core this machine has, not this process's


def read_cpuinfo(path: Path = CPUINFO) -> CpuInfo:
    """The first processor's model and flags and the count of processors; an empty CpuInfo
    where the file cannot be read (not Linux)."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        lines = []
    fields = [(key.strip(), value.strip()) for key, _, value in (x.partition(":") for x in lines)]
    model = next((value for key, value in fields if key == "model name"), None)
    flags = next((value.split() for key, value in fields if key in ("flags", "Features")), [])
    cores = sum(key == "processor" for key, _ in fields)
    return CpuInfo(model, frozenset(flags), cores)


# generator.cpu_binding's word for every core this process may run on.
ALL_CORES = "all"


def omp_cores(binding: str, allowed: set[int] | None = None) -> str:
    """VLLM_CPU_OMP_THREADS_BIND's value for one replica's `binding`: a core list as given
    ("0-1", "1"), or ALL_CORES as the cores in `allowed` (default: this process's
    affinity), comma-separated."""
    if binding != ALL_CORES:
        return binding
    cores = os.sched_getaffinity(0) if allowed is None else allowed
    return ",".join(str(core) for core in sorted(cores))
