"""bench.labs: how a lab's run is written."""

from __future__ import annotations

import json

from bench.labs import write_run


def test_a_second_run_of_the_same_settings_keeps_the_first_runs_records(tmp_path):
    for at in ("first", "second"):
        write_run(tmp_path, "run", {"command": "lab", "measured_at": at}, "report")

    assert json.loads((tmp_path / "run.json").read_text())["measured_at"] == "first"
    assert json.loads((tmp_path / "run-2.json").read_text())["measured_at"] == "second"
    assert "records in run-2.json" in (tmp_path / "README.md").read_text()
