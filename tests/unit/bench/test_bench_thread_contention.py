"""bench.thread_contention: the ratios against the pooled alone runs and the report (the
processes themselves run only in the lab)."""

from __future__ import annotations

from bench.thread_contention import markdown, summarise


def samples():
    return {
        2: {
            "alone": [100.0, 102.0, 98.0, 101.0, 99.0, 100.0],
            "nice": [150.0, 148.0, 152.0, 149.0, 151.0],
            "idle": [99.0, 101.0, 100.0, 102.0, 98.0],
        }
    }


def test_each_condition_is_compared_with_the_probe_alone():
    rows = {row["condition"]: row for row in summarise(samples())}

    assert rows["alone"]["n"] == 6 and "ratio" not in rows["alone"]
    assert rows["nice"]["median_ms"] == 150.0
    nice = rows["nice"]["ratio"]
    assert nice["estimate"] == 1.5 and 1.4 < nice["low"] <= 1.5 <= nice["high"] < 1.6
    idle = rows["idle"]["ratio"]
    assert idle["low"] <= 1.0 <= idle["high"]


def test_the_report_reads_an_interval_holding_one_as_no_difference():
    text = markdown(summarise(samples()), 20.0, "python -m bench.thread_contention")

    assert "| 2 | writer at nice 10 | 5 | 150.0 | 1.50x [" in text
    idle_row = next(line for line in text.splitlines() if "SCHED_IDLE" in line)
    assert idle_row.endswith(": no detectable difference |")
    assert "Command: `python -m bench.thread_contention`" in text
