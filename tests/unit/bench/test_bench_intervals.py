"""bench.intervals: n and 95% intervals recomputed from stored raw results, on small
synthetic runs whose answers are known."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench import intervals
from bench.bootstrap import Interval
from bench.intervals import (
    NO_DIFFERENCE,
    Section,
    context_sweep_section,
    difference_verdict,
    faster_policy,
    fmt_difference,
    fmt_ratio,
    fmt_value,
    independent_ratio,
    latency_section,
    llmlingua_speed_section,
    one_sample,
    paired_difference,
    paired_ratio,
    pairs_of,
    quality_section,
    ratio_verdict,
    reader_comparison,
    record_tpot,
)

# --- the interval helpers ---------------------------------------------------------------------


def test_paired_ratio_is_the_median_per_pair_ratio():
    pairs = [(50.0, 100.0), (100.0, 200.0), (150.0, 300.0), (60.0, 120.0)]

    interval = paired_ratio(pairs)

    assert interval is not None
    assert interval.estimate == pytest.approx(0.5)
    assert interval.low == pytest.approx(0.5) and interval.high == pytest.approx(0.5)
    assert interval.n == 4
    assert ratio_verdict(interval) == "lower"


def test_paired_ratio_leaves_out_missing_and_non_positive_sides():
    pairs = [(2.0, 1.0), (None, 1.0), (2.0, None), (0.0, 1.0), (4.0, 2.0)]

    interval = paired_ratio(pairs)

    assert interval is not None and interval.n == 2
    assert interval.estimate == pytest.approx(2.0)
    assert ratio_verdict(interval) == "higher"


def test_fewer_than_two_values_give_no_interval():
    assert paired_ratio([(1.0, 2.0)]) is None
    assert independent_ratio([1.0], [1.0, 2.0]) is None
    assert one_sample([3.0]) is None
    assert paired_difference([(1.0, 0.0)]) is None
    assert fmt_ratio(None, 1) == "n = 1: no interval"
    assert fmt_value(None, 0, 1) == "n = 1: no interval"
    assert ratio_verdict(None) == "no interval"


def test_independent_ratio_is_the_ratio_of_the_medians():
    a, b = [10.0, 12.0, 14.0], [5.0, 6.0, 100.0]

    interval = independent_ratio(a, b)

    assert interval is not None
    assert interval.estimate == pytest.approx(12.0 / 6.0)
    assert interval.low <= interval.estimate <= interval.high


def test_one_sample_median_and_mean():
    values = [1.0, 2.0, 3.0, 4.0, 100.0]

    middle = one_sample(values)
    average = one_sample([0.0, 1.0, 1.0, 0.0], intervals.bootstrap.mean)

    assert middle is not None and middle.estimate == 3.0 and middle.n == 5
    assert average is not None and average.estimate == 0.5
    assert 0.0 <= average.low <= average.high <= 1.0


def test_one_sample_skips_none_and_nan():
    interval = one_sample([1.0, None, math.nan, 3.0])

    assert interval is not None and interval.n == 2 and interval.estimate == 2.0


def test_paired_difference_of_identical_scores_holds_zero():
    same = paired_difference([(1.0, 1.0), (0.0, 0.0), (1.0, 1.0)])
    worse = paired_difference([(0.0, 1.0)] * 10 + [(1.0, 1.0)] * 10)

    assert same is not None and same.estimate == 0.0
    assert difference_verdict(same) == NO_DIFFERENCE
    assert worse is not None and worse.estimate == pytest.approx(-0.5)
    assert difference_verdict(worse) == "lower"


def test_formats():
    assert fmt_value(Interval(8146.2, 7561.0, 8862.4, 6)) == "8,146 [7,561, 8,862]"
    assert fmt_ratio(Interval(0.81, 0.69, 0.83, 6)) == "0.81x [0.69, 0.83]"
    assert fmt_ratio(Interval(1.05, 0.85, 1.39, 4)) == f"1.05x [0.85, 1.39]: {NO_DIFFERENCE}"
    assert (
        fmt_difference(Interval(-0.001, -0.068, 0.069, 20))
        == f"−0.001 [−0.068, +0.069]: {NO_DIFFERENCE}"
    )
    assert fmt_difference(Interval(-0.1, -0.2, -0.025, 40)) == "−0.100 [−0.200, −0.025]"


# --- latency runs -----------------------------------------------------------------------------


def request(question: str, ttft: float, e2e: float, tokens: int = 11, ok: bool = True) -> dict:
    return {"question": question, "ttft_ms": ttft, "e2e_ms": e2e, "output_tokens": tokens, "ok": ok}


def test_record_tpot_is_bench_stats_definition():
    assert record_tpot(request("q", 100.0, 1100.0, 11)) == pytest.approx(100.0)
    assert record_tpot(request("q", 100.0, 1100.0, 1)) is None
    assert record_tpot(request("q", 100.0, 1100.0, ok=False)) is None


def test_pairs_follow_the_key_and_repeat_order():
    a = [request("x", 1, 2), request("y", 3, 4), request("x", 5, 6)]
    b = [request("x", 10, 20), request("x", 50, 60), request("z", 0, 0)]

    pairs = pairs_of(a, b, "question", lambda r: r["ttft_ms"])

    assert pairs == [(1, 10), (5, 50)]


def test_latency_section_rows_and_paired_ratios():
    base = [request(f"q{i}", 1000.0 + i, 2000.0 + i) for i in range(6)]
    faster = [request(f"q{i}", (1000.0 + i) / 2, 2000.0 + i) for i in range(6)]
    faster.append(request("only here", 1.0, 2.0))
    faster.append(request("q0", 1.0, 2.0, ok=False))  # the second q0: nothing to pair with
    runs = {"base": base, "faster": faster}

    section = latency_section(
        Section("benchmarks.md", "t", "s"),
        runs,
        {"base": "base", "faster": "faster"},
        [("faster", "base", "faster / base")],
        "question",
        "question",
    )

    rows = {r["run"]: r for r in section.data["rows"]}
    assert rows["base"]["n"] == 6 and rows["faster"]["n"] == 7 and rows["faster"]["sent"] == 8
    [comparison] = section.data["comparisons"]
    assert comparison["n"] == 6
    assert comparison["TTFT"]["estimate"] == pytest.approx(0.5)
    assert comparison["TTFT_verdict"] == "lower"
    assert comparison["E2E"]["estimate"] == pytest.approx(1.0)
    assert comparison["E2E_verdict"] == NO_DIFFERENCE
    text = section.markdown()
    assert "| faster / base | 6 | 0.50x [0.50, 0.50] |" in text


# --- the context sweep ------------------------------------------------------------------------


def sweep_record(length: int, policy: str, ttft: float, phase: str = "measure") -> dict:
    request = {"length": length, "policy": policy, "phase": phase, "question": "?"}
    return {"request": request, "ok": True, "ttft_ms": ttft}


def test_faster_policy_takes_the_lower_median():
    assert faster_policy({"never": [6.0, 8.0], "always": [6.0, 6.5]})[0] == "always"
    assert faster_policy({"never": [5.0], "always": []})[0] == "never"


def test_context_sweep_ratios_of_medians_and_n_of_one():
    records = [
        sweep_record(512, "never", 100.0),
        sweep_record(512, "never", 110.0),
        sweep_record(512, "always", 200.0),
        sweep_record(512, "always", 220.0),
        sweep_record(512, "auto", 100.0),
        sweep_record(512, "auto", 110.0),
        sweep_record(512, "always", 1.0, phase="calibrate"),  # not measured: left out
        sweep_record(1024, "never", 300.0),
        sweep_record(1024, "always", 200.0),
        sweep_record(1024, "auto", 210.0),
    ]

    section = context_sweep_section(Section("benchmarks.md", "t", "s"), records)

    short, long = section.data["lengths"]
    assert short["n"] == {"never": 2, "always": 2, "auto": 2}
    assert short["always_over_never"]["estimate"] == pytest.approx(2.0)
    assert short["faster_fixed"] == "never"
    assert short["auto_over_faster"]["estimate"] == pytest.approx(1.0)
    assert long["faster_fixed"] == "always"
    assert long["always_over_never"] is None and long["auto_over_faster"] is None
    assert "n = 1: no interval" in section.markdown()


# --- the LLMLingua speed test -----------------------------------------------------------------


def speed_row(variant: str, tokens: int, times: list[float]) -> dict:
    return {"variant": variant, "context_tokens": tokens, "times_ms": times}


def test_llmlingua_speed_per_row_and_pooled_per_knob():
    rows = [
        speed_row("condition-compare", 500, [1000.0, 1000.0]),
        speed_row("condition-compare", 1000, [2000.0, 2000.0]),
        speed_row("one-pass", 500, [500.0, 500.0]),
        speed_row("one-pass", 1000, [1000.0, 1000.0]),
    ]

    section = llmlingua_speed_section(rows)

    speedups = {(r["variant"], r["context_tokens"]): r["speedup"] for r in section.data["rows"]}
    assert speedups[("one-pass", 500)]["estimate"] == pytest.approx(2.0)
    assert speedups[("condition-compare", 1000)]["estimate"] == pytest.approx(1.0)
    knobs = {k["knob"]: k for k in section.data["knobs"]}
    one_pass = knobs["one pass instead of two"]
    assert one_pass["lengths"] == [500, 1000] and one_pass["n"] == 4
    assert one_pass["speedup"]["estimate"] == pytest.approx(2.0)
    # A knob whose variants were not measured has nothing to pool.
    assert knobs["two torch threads"]["speedup"] is None


# --- the quality sweeps -----------------------------------------------------------------------


def answer(point: str, question: str, f1: float, kept: bool, ttft: float, error=None) -> dict:
    return {
        "point": point,
        "question_id": question,
        "f1": f1,
        "answer_survived": kept,
        "recall": 1.0,
        "ttft_ms": ttft,
        "error": error,
    }


def quality_doc() -> dict:
    points = [
        {"name": "none k=3", "method": "none", "rate": None, "top_k": 3},
        {"name": "sentences@0.5 k=3", "method": "sentences", "rate": 0.5, "top_k": 3},
    ]
    results = []
    for i in range(10):
        results.append(answer("none k=3", f"q{i}", 0.2, True, 1000.0))
        results.append(answer("sentences@0.5 k=3", f"q{i}", 0.2, i % 2 == 0, 500.0))
    results.append(answer("none k=3", "q10", 0.0, False, 0.0, error="HTTP 500"))
    return {"config": {"points": points}, "results": results}


def test_quality_section_rows_and_comparisons_against_none():
    section = quality_section(Section("quality.md", "t", "s"), quality_doc())

    rows = {r["point"]: r for r in section.data["rows"]}
    assert rows["none k=3"]["n"] == 10  # the failed question is not counted
    assert rows["sentences@0.5 k=3"]["answer kept"]["estimate"] == pytest.approx(0.5)
    [comparison] = section.data["comparisons"]
    assert comparison["label"] == "sentences 0.5, k=3 − none, k=3"
    assert comparison["n"] == 10
    assert comparison["F1"]["estimate"] == 0.0 and comparison["F1_verdict"] == NO_DIFFERENCE
    assert comparison["answer kept"]["estimate"] == pytest.approx(-0.5)
    assert comparison["answer kept_verdict"] == "lower"
    assert comparison["answer kept_changes"] == {"up": 0, "down": 5, "same": 5}
    assert comparison["recall@k_changes"]["same"] == 10
    assert "(identical on every question)" in section.markdown()
    assert comparison["TTFT"]["estimate"] == pytest.approx(0.5)


def test_reader_comparison_pairs_the_shared_questions():
    strong = {
        "results": [answer("none k=3", f"q{i}", 0.5, True, 1.0) for i in range(4)]
        + [answer("sentences@0.5 k=3", "q0", 0.0, True, 1.0)]
    }
    weak = {"results": [answer("none k=3", f"q{i}", 0.1, True, 1.0) for i in range(2, 8)]}

    section = reader_comparison(Section("quality.md", "t", "s"), strong, weak, "none k=3")

    assert section.data["none k=3"]["n"] == 2
    assert section.data["none k=3"]["difference"]["estimate"] == pytest.approx(0.4)


def write_prefix_runs(results: Path, ttft: dict[str, list[float]]) -> None:
    for name, values in ttft.items():
        folder = results / "prefix" / name
        folder.mkdir(parents=True)
        rows = [answer("none k=3", f"q{i}", 0.5, True, v) for i, v in enumerate(values)]
        rows.append(answer("none k=3", "failed", 0.0, False, 1.0, error="timeout"))
        (folder / intervals.PREFIX_FILE).write_text(json.dumps({"results": rows}))


def test_prefix_cache_pairs_questions_and_averages_the_two_runs_a_side(tmp_path: Path):
    # Drift: the later runs are slower; on is half of off within each repetition.
    write_prefix_runs(
        tmp_path,
        {"off-1": [1000.0] * 4, "on-1": [600.0] * 4, "on-2": [700.0] * 4, "off-2": [1400.0] * 4},
    )

    section = intervals.prefix_cache(tmp_path)

    assert section.data["n"] == 4  # the failed question is left out
    ratios = section.data["ratios"]
    assert ratios["on-1 / off-1"]["estimate"] == pytest.approx(0.6)
    assert ratios["on-2 / off-2"]["estimate"] == pytest.approx(0.5)
    assert ratios["on / off (mean of two runs a side)"]["estimate"] == pytest.approx(1300 / 2400)
    assert section.data["runs"]["off-2"]["estimate"] == pytest.approx(1400.0)
    assert "| on / off (mean of two runs a side) | 4 | 0.54x [0.54, 0.54] |" in section.markdown()


# --- the command ------------------------------------------------------------------------------


def test_main_renders_what_is_present_and_writes_both_files(tmp_path: Path, capsys):
    results = tmp_path / "results"
    (results / "llmlingua-speed").mkdir(parents=True)
    rows = [
        speed_row("condition-compare", 500, [1000.0, 1100.0]),
        speed_row("one-pass", 500, [500.0, 520.0]),
    ]
    (results / "llmlingua-speed" / "llmlingua-speed.json").write_text(json.dumps(rows))
    out = tmp_path / "out"

    assert intervals.main(["--results", str(results), "--out", str(out)]) == 0

    printed = capsys.readouterr().out
    assert "Making LLMLingua as cheap as it can be" in printed
    assert "Ablations" not in printed  # no quick-plan results under this folder
    assert "## Not stored" in printed
    assert (out / "intervals.md").read_text() == printed
    document = json.loads((out / "intervals.json").read_text())
    [section] = document["sections"]
    assert section["title"] == "Making LLMLingua as cheap as it can be"
    assert document["seed"] == 0


def test_changes_count_the_questions_that_moved():
    counts = intervals.changes([(1.0, 0.0), (1.0, 0.0), (0.0, 0.0), (None, 1.0), (0.0, 1.0)])

    assert counts == {"up": 2, "down": 1, "same": 1}
    assert intervals.fmt_changes("x", counts) == "x (2 up, 1 down)"
    same = intervals.changes([(1.0, 1.0), (0.0, 0.0)])
    assert intervals.fmt_changes("x", same) == "x (identical on every question)"
