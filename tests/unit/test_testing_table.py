"""docs/testing.md's CI table against the logs it comes from: each row's test counts, pytest
time and whole `.ci/run` time are those of a stored log of its commit
(docs/results/testing/ci-<commit>*.log), and every stored log has its row. The counts are
copied from the logs by hand; this keeps the copy true."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "docs" / "testing.md"
LOGS = ROOT / "docs" / "results" / "testing"

# pytest's last line: "==== 1 failed, 2395 passed, 2 skipped in 525.48s (0:08:45) ====".
SUMMARY = re.compile(r"^=+ (?P<counts>[^=]*?) in (?P<seconds>[\d.]+)s")
REAL = re.compile(r"^real\t(?P<minutes>\d+)m(?P<seconds>[\d.]+)s$", re.MULTILINE)
ROW = re.compile(r"^\| (?P<what>.*?) \| (?P<commit>[0-9a-f]{7}) \| (?P<rest>.*)\|$")


def minutes_seconds(seconds: int) -> str:
    return f"{seconds // 60} min {seconds % 60} s"


def run_of_log(path: Path) -> tuple[str, set[str], set[str]]:
    """(the counts as the table writes them, pytest's time and `.ci/run`'s wall time as the
    table may write them: in minutes and seconds, rounded or cut to the second)."""
    text = path.read_text(errors="replace")
    summaries = [m for line in text.splitlines() if (m := SUMMARY.match(line))]
    real = REAL.findall(text)
    assert summaries and real, f"{path.name}: no pytest summary or `real` line"
    counts = re.sub(r"\d{4,}", lambda m: f"{int(m.group()):,}", summaries[-1]["counts"])
    minutes, seconds = real[-1]

    def written(value: float) -> set[str]:
        return {minutes_seconds(int(value)), minutes_seconds(round(value))}

    return (
        counts,
        written(float(summaries[-1]["seconds"])),
        written(int(minutes) * 60 + float(seconds)),
    )


def table_rows() -> list[tuple[str, list[str]]]:
    """(commit, cells after it) of every row that names a commit and a run."""
    rows = []
    for line in TABLE.read_text().splitlines():
        found = ROW.match(line)
        if found is None:
            continue
        cells = [cell.strip() for cell in found["rest"].split("|")]
        if cells[1]:  # a pytest time: the run happened
            rows.append((found["commit"], cells))
    return rows


def logs_of(commit: str) -> list[Path]:
    return sorted(LOGS.glob(f"ci-{commit}*.log"))


@pytest.mark.parametrize(("commit", "cells"), table_rows(), ids=lambda v: str(v)[:12])
def test_each_row_is_a_stored_log_of_its_commit(commit, cells):
    whole, pytest_time, tests = cells[0], cells[1], cells[2].replace("*", "")
    runs = [run_of_log(path) for path in logs_of(commit)]
    assert runs, f"no docs/results/testing/ci-{commit}*.log"
    assert any(
        tests.startswith(counts)
        and any(pytest_time.startswith(time) for time in pytest_times)
        and any(whole.startswith(time) for time in walls)
        for counts, pytest_times, walls in runs
    ), f"{commit}: row says {whole!r}, {pytest_time!r}, {tests!r}; logs say {runs}"


def test_every_stored_ci_log_has_its_row():
    commits = {commit for commit, _ in table_rows()}
    unlisted = [path.name for path in LOGS.glob("ci-*.log") if path.name[3:10] not in commits]
    assert not unlisted, f"logs without a row in docs/testing.md: {unlisted}"
