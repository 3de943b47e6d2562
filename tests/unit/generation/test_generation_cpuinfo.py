"""generation.cpuinfo: the one reader of /proc/cpuinfo, on files written here."""

from __future__ import annotations

from pathlib import Path

from generation.cpuinfo import CpuInfo, read_cpuinfo


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
