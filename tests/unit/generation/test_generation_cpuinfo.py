"""generation.cpuinfo: the one reader of /proc/cpuinfo, on files written here."""

from __future__ import annotations

import os
from pathlib import Path

from generation.cpuinfo import ALL_CORES, CpuInfo, omp_cores, read_cpuinfo


def test_the_first_processor_gives_model_and_flags_and_every_processor_counts(tmp_path: Path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Processor\nflags\t\t: fpu amx_int8\n\n"
        "processor\t: 1\nmodel name\t: another\nflags\t\t: fpu\n"
    )
    assert read_cpuinfo(cpuinfo) == CpuInfo(
        "Intel(R) Xeon(R) Processor", frozenset({"fpu", "amx_int8"}), 2
    )


def test_arm_features_are_its_flags_and_a_missing_file_reads_empty(tmp_path: Path):
    arm = tmp_path / "cpuinfo"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd\n")
    assert read_cpuinfo(arm) == CpuInfo(None, frozenset({"fp", "asimd"}), 1)
    assert read_cpuinfo(tmp_path / "absent") == CpuInfo(None, frozenset(), 0)


def test_omp_cores_keeps_a_core_list_and_spells_out_all():
    assert omp_cores("0-1") == "0-1"
    assert omp_cores("1", allowed={0, 1}) == "1"
    assert omp_cores(ALL_CORES, allowed={3, 0, 1}) == "0,1,3"
    # By default the cores this process may run on.
    assert omp_cores(ALL_CORES) == ",".join(map(str, sorted(os.sched_getaffinity(0))))
