"""bench.plots: grouping, stage arithmetic and loading on hand-made results; each plot is
written as a PNG. Expected figures are worked out by hand in comments."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from bench import plots
from bench.plots import (
    ConcurrencyPoint,
    StageBreakdown,
    concurrency_series,
    has_concurrency_sweep,
    is_latency_result,
    load_results,
    plot_concurrency,
    plot_lines,
    plot_stage_breakdown,
    series_by_compression,
    series_by_label,
    stage_breakdown,
    stage_breakdowns,
    write_plots,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def timings(retrieve: float, compress: float, ttft: float, total: float) -> dict[str, float]:
    return {"retrieve": retrieve, "compress": compress, "ttft": ttft, "total": total}


def record(server: dict[str, float] | None, ok: bool = True) -> dict[str, Any]:
    return {"index": 0, "ok": ok, "ttft_ms": 1.0, "server_timings_ms": server}


def result(
    label: str,
    *,
    concurrency: int | None = 1,
    rate: float | None = None,
    compression: str | None = "sentences",
    requests_per_s: float = 1.0,
    ttft_p99_ms: float | None = 100.0,
    records: Sequence[dict[str, Any]] = (),
    started_at: str = "2026-01-01T00:00:00+00:00",
) -> dict[str, Any]:
    """The shape bench.latency writes, cut down to the keys bench.plots reads."""
    ttft = None if ttft_p99_ms is None else {"n": 1, "p50": ttft_p99_ms, "p99": ttft_p99_ms}
    return {
        "config": {
            "label": label,
            "concurrency": concurrency,
            "rate": rate,
            "compression": compression,
            "started_at": started_at,
        },
        "summary": {"requests_per_s": requests_per_s, "ttft_ms": ttft},
        "records": list(records),
    }


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC)
    assert len(data) > 1000


# --- series ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("label", "concurrency", "series"),
    [
        ("prefix-sentences-c4", 4, "prefix-sentences"),
        ("spec-c8", 8, "spec"),
        ("no-spec-c1", 1, "no-spec"),
        ("rag-c4-sentences", 4, "rag-sentences"),  # bench.latency's default label
        ("c16-qwen", 16, "qwen"),
        # Only the segment that is this load point's concurrency goes.
        ("abc-c4", 8, "abc-c4"),
        ("disc4", 4, "disc4"),
        ("rag-r0.5-default", None, "rag-r0.5-default"),
    ],
)
def test_series_by_label_drops_the_concurrency_segment(label, concurrency, series):
    assert series_by_label(result(label, concurrency=concurrency)) == series


def test_series_by_label_falls_back_to_the_compression_method():
    assert series_by_label(result("c4", concurrency=4, compression="llmlingua")) == "llmlingua"
    assert series_by_label(result("c4", concurrency=4, compression=None)) == "default"


def test_series_by_compression():
    assert series_by_compression(result("a", compression="none")) == "none"
    assert series_by_compression(result("a", compression=None)) == "default"


def test_concurrency_series_groups_sorts_and_skips_rate_points():
    results = [
        result("spec-c8", concurrency=8, requests_per_s=3.0, ttft_p99_ms=900.0),
        result("no-spec-c1", concurrency=1, requests_per_s=0.5, ttft_p99_ms=200.0),
        result("spec-c1", concurrency=1, requests_per_s=0.6, ttft_p99_ms=150.0),
        result("spec-r2", concurrency=None, rate=2.0),
        result("no-spec-c8", concurrency=8, requests_per_s=2.5, ttft_p99_ms=None),
    ]

    series = concurrency_series(results)

    # Series in order of first appearance, points by concurrency.
    assert list(series) == ["spec", "no-spec"]
    assert series["spec"] == [
        ConcurrencyPoint("spec-c1", 1, 0.6, 150.0),
        ConcurrencyPoint("spec-c8", 8, 3.0, 900.0),
    ]
    assert series["no-spec"] == [
        ConcurrencyPoint("no-spec-c1", 1, 0.5, 200.0),
        ConcurrencyPoint("no-spec-c8", 8, 2.5, None),  # no request succeeded: no TTFT
    ]
    assert has_concurrency_sweep(series)


def test_concurrency_series_takes_any_grouping():
    results = [
        result("naive-none-c1", compression="none"),
        result("prefix-none-c1", compression="none"),
        result("prefix-sentences-c4", concurrency=4, compression="sentences"),
    ]

    by_method = concurrency_series(results, series_by_compression)

    assert {name: [p.label for p in points] for name, points in by_method.items()} == {
        "none": ["naive-none-c1", "prefix-none-c1"],
        "sentences": ["prefix-sentences-c4"],
    }
    # Two load points at the same concurrency are not a sweep.
    assert not has_concurrency_sweep(by_method)
    assert has_concurrency_sweep(concurrency_series(results, lambda r: "all"))


# --- stages ---------------------------------------------------------------------------------


def test_stage_breakdown_takes_medians_then_differences():
    records = [
        record(timings(10.0, 2.0, 100.0, 400.0)),
        record(timings(30.0, 6.0, 300.0, 500.0)),
        record(timings(20.0, 4.0, 200.0, 900.0)),
        record(timings(1e6, 1e6, 1e6, 1e6), ok=False),  # failed: left out
        record(None),  # no server timings: left out
        record({"retrieve": 5.0, "compress": 1.0, "ttft": 50.0}),  # no total: left out
    ]

    breakdown = stage_breakdown(result("p-c1", records=records))

    # Medians: retrieve 20, compress 4, ttft 200, total 500.
    # queue+prefill = 200 - 20 - 4 = 176; decode = 500 - 200 = 300.
    assert breakdown == StageBreakdown("p-c1", 3, 20.0, 4.0, 176.0, 300.0)
    assert breakdown.parts_ms == (20.0, 4.0, 176.0, 300.0)
    assert breakdown.total_ms == 500.0


def test_stage_breakdown_median_of_an_even_count_is_the_mean_of_the_middle_two():
    records = [record(timings(10.0, 0.0, 100.0, 200.0)), record(timings(20.0, 0.0, 140.0, 300.0))]

    breakdown = stage_breakdown(result("p-c1", records=records))

    # retrieve 15, ttft 120, total 250: queue+prefill 120 - 15 - 0 = 105, decode 130.
    assert breakdown is not None
    assert breakdown.parts_ms == (15.0, 0.0, 105.0, 130.0)


def test_stage_breakdown_clamps_negative_parts_at_zero():
    # Rounded server timings can put ttft under retrieve + compress, or total under ttft.
    breakdown = stage_breakdown(result("p-c1", records=[record(timings(60.0, 50.0, 100.0, 90.0))]))

    assert breakdown is not None
    assert (breakdown.queue_prefill_ms, breakdown.decode_ms) == (0.0, 0.0)


def test_stage_breakdown_is_none_without_usable_records():
    assert stage_breakdown(result("p-c1")) is None
    assert stage_breakdown(result("p-c1", records=[record(None), record(None, ok=False)])) is None


def test_stage_breakdowns_keep_order_and_skip_points_without_timings():
    results = [
        result("b", records=[record(timings(1.0, 1.0, 5.0, 9.0))]),
        result("a"),
        result("c", records=[record(timings(2.0, 2.0, 6.0, 8.0))]),
    ]

    assert [b.label for b in stage_breakdowns(results)] == ["b", "c"]


# --- loading --------------------------------------------------------------------------------


def test_is_latency_result_detects_by_keys():
    assert is_latency_result(result("a"))
    assert not is_latency_result({"ttft_ms": 1.0, "tpot_ms": 2.0})  # <label>.advisor.json
    # A bench.quality result: its summary is a list of points, and no records.
    assert not is_latency_result({"config": {"label": "q"}, "summary": [], "results": []})
    assert not is_latency_result({"config": {}, "summary": {"requests_per_s": 1}, "records": []})
    assert not is_latency_result([result("a")])


def test_load_results_skips_other_json_and_orders_by_start(tmp_path, caplog):
    later = result("a-c1", started_at="2026-01-01T00:00:09+00:00")
    earlier = result("b-c1", started_at="2026-01-01T00:00:01+00:00")
    (tmp_path / "a-c1.json").write_text(json.dumps(later))
    (tmp_path / "b-c1.json").write_text(json.dumps(earlier))
    (tmp_path / "a-c1.advisor.json").write_text(json.dumps({"ttft_ms": 1.0}))
    (tmp_path / "broken.json").write_text("{")
    (tmp_path / "a-c1.md").write_text("# a-c1")

    with caplog.at_level("WARNING", logger="bench.plots"):
        loaded = load_results(tmp_path)

    assert [r["config"]["label"] for r in loaded] == ["b-c1", "a-c1"]
    assert "broken.json" in caplog.text


# --- plots ----------------------------------------------------------------------------------


def test_plot_concurrency_writes_a_png(tmp_path):
    results = [
        result("spec-c1", concurrency=1, requests_per_s=0.6, ttft_p99_ms=150.0),
        result("spec-c8", concurrency=8, requests_per_s=3.0, ttft_p99_ms=900.0),
        result("no-spec-c1", concurrency=1, requests_per_s=0.5, ttft_p99_ms=None),
    ]

    plot_concurrency(results, tmp_path / "c.png")

    assert_png(tmp_path / "c.png")


def test_plot_concurrency_refuses_rate_only_results(tmp_path):
    with pytest.raises(ValueError, match="concurrency"):
        plot_concurrency([result("r", concurrency=None, rate=1.0)], tmp_path / "c.png")


def test_plot_stage_breakdown_writes_a_png(tmp_path):
    results = [
        result("naive-none-c1", records=[record(timings(90.0, 20.0, 8000.0, 11700.0))]),
        result("prefix-llmlingua-c1", records=[record(timings(85.0, 10500.0, 15400.0, 18400.0))]),
    ]

    plot_stage_breakdown(results, tmp_path / "s.png")

    assert_png(tmp_path / "s.png")
    with pytest.raises(ValueError, match="server timings"):
        plot_stage_breakdown([result("a")], tmp_path / "none.png")


@pytest.mark.parametrize("log_x", [False, True])
def test_plot_lines_writes_a_png(tmp_path, log_x):
    series = {
        "spec": [(4096.0, 900.0), (512.0, 120.0), (1024.0, 210.0)],
        "no-spec": [(512.0, 100.0), (4096.0, 800.0)],
        "empty": [],
    }

    plot_lines(series, "context tokens", "TTFT p50 (ms)", "TTFT vs context", tmp_path / "l.png")
    plot_lines(series, "x", "y", "t", tmp_path / "l.png", log_x=log_x)

    assert_png(tmp_path / "l.png")
    with pytest.raises(ValueError, match="no points"):
        plot_lines({"empty": []}, "x", "y", "t", tmp_path / "none.png")


# --- write_plots and the CLI ----------------------------------------------------------------


def write_results(directory: Path, results: Sequence[dict[str, Any]]) -> None:
    for r in results:
        (directory / f"{r['config']['label']}.json").write_text(json.dumps(r))


def test_write_plots_draws_concurrency_only_for_a_sweep(tmp_path):
    server = [record(timings(10.0, 5.0, 100.0, 300.0))]
    write_results(
        tmp_path, [result("a-c1", records=server), result("b-c1", records=server, concurrency=1)]
    )

    assert write_plots(tmp_path) == [tmp_path / "stages.png"]
    assert not (tmp_path / "concurrency.png").exists()

    write_results(tmp_path, [result("a-c4", concurrency=4, records=server)])

    assert write_plots(tmp_path) == [tmp_path / "concurrency.png", tmp_path / "stages.png"]
    assert_png(tmp_path / "concurrency.png")
    assert_png(tmp_path / "stages.png")


def test_write_plots_skips_without_matplotlib(tmp_path, monkeypatch, caplog):
    find_spec = plots.importlib.util.find_spec
    monkeypatch.setattr(
        plots.importlib.util,
        "find_spec",
        lambda name, *args: None if name == "matplotlib" else find_spec(name, *args),
    )

    with caplog.at_level("WARNING", logger="bench.plots"):
        assert write_plots(tmp_path) == []

    assert "matplotlib is not importable" in caplog.text


def test_main_prints_the_paths_written(tmp_path, capsys):
    server = [record(timings(10.0, 5.0, 100.0, 300.0))]
    write_results(tmp_path, [result("a-c1", records=server)])

    assert plots.main([str(tmp_path)]) == 0

    assert capsys.readouterr().out.splitlines() == [f"wrote {tmp_path / 'stages.png'}"]


def test_main_fails_without_latency_results(tmp_path, capsys):
    (tmp_path / "x.advisor.json").write_text(json.dumps({"ttft_ms": 1.0}))

    assert plots.main([str(tmp_path)]) == 1

    assert "no latency results" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        plots.main([str(tmp_path / "missing")])
    assert exit_info.value.code == 2
