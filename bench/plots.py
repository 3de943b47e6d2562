"""PNG plots of the latency lab's results (bench.latency's `<label>.json` per load point).

    python -m bench.plots DIR

Loads every load-point result in DIR (a JSON object with `config`, `summary` and `records`;
other JSON there, such as `<label>.advisor.json` or a bench.quality result, is skipped) and
writes DIR/concurrency.png (throughput and p99 TTFT against concurrency, one line per series;
only when some series was run at two or more concurrencies) and DIR/stages.png (the server's
median stage timings, one stacked bar per load point), printing the paths written.

The figures are worked out by plain functions (`concurrency_series`, `stage_breakdown`) so
that they can be tested without matplotlib; matplotlib is imported only by the `plot_*`
functions, since the service itself does not need it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import math
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.stats import percentile

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.ticker import Formatter

logger = logging.getLogger(__name__)

# One load point's result as bench.latency writes it: {"config", "summary", "records"}.
LatencyResult = Mapping[str, Any]
# Names the series (one line in the concurrency plot) a load point belongs to.
SeriesOf = Callable[[LatencyResult], str]

CONCURRENCY_PNG = "concurrency.png"
STAGES_PNG = "stages.png"
# Bottom to top in the stacked bars: the order a request goes through the server.
STAGE_PARTS = ("retrieve", "compress", "queue+prefill", "decode")
_SERVER_STAGES = ("retrieve", "compress", "ttft", "total")
_DPI = 120


# --- loading --------------------------------------------------------------------------------


def is_latency_result(data: object) -> bool:
    """True when `data` has the shape of bench.latency's `<label>.json`: a config with a
    label, a summary object with requests/s, and a list of records."""
    if not isinstance(data, Mapping):
        return False
    config, summary, records = data.get("config"), data.get("summary"), data.get("records")
    return (
        isinstance(config, Mapping)
        and isinstance(config.get("label"), str)
        and isinstance(summary, Mapping)
        and "requests_per_s" in summary
        and isinstance(records, list)
    )


def load_results(directory: Path) -> list[dict[str, Any]]:
    """Every latency result among DIR/*.json, in the order they were run (config
    `started_at`, then file name); unreadable or other JSON files are skipped."""
    loaded: list[tuple[str, str, dict[str, Any]]] = []
    for path in sorted(directory.glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            logger.warning("skipping %s: %s", path, error)
            continue
        if not is_latency_result(data):
            logger.debug("skipping %s: not a latency result", path)
            continue
        loaded.append((str(data["config"].get("started_at") or ""), path.name, data))
    return [data for _, _, data in sorted(loaded, key=lambda item: item[:2])]


# --- series and concurrency -----------------------------------------------------------------


def series_by_label(result: LatencyResult) -> str:
    """The label without its concurrency segment: `prefix-sentences-c4` -> `prefix-sentences`,
    `spec-c8` -> `spec`, `rag-c4-sentences` -> `rag-sentences`. The default series, since a
    label names the service variant as well as the request settings (prefix caching or
    speculative decoding are not in the load point's config). A label that is only the
    concurrency falls back to the compression method."""
    config = result["config"]
    label = str(config["label"])
    concurrency = config.get("concurrency")
    if _is_number(concurrency):
        label = re.sub(rf"(^|-)c{int(concurrency)}(?=-|$)", "", label).strip("-")
    return label or series_by_compression(result)


def series_by_compression(result: LatencyResult) -> str:
    """The compression method of the load point (`default` when the request left it unset)."""
    return str(result["config"].get("compression") or "default")


@dataclass(frozen=True)
class ConcurrencyPoint:
    """One closed-loop load point: throughput and p99 TTFT (None when no request succeeded)."""

    label: str
    concurrency: int
    requests_per_s: float
    ttft_p99_ms: float | None


def concurrency_series(
    results: Iterable[LatencyResult], series_of: SeriesOf = series_by_label
) -> dict[str, list[ConcurrencyPoint]]:
    """Closed-loop load points grouped by `series_of`, each series sorted by concurrency;
    series in order of first appearance. Poisson-rate load points (no concurrency) are left
    out, since they have no place on a concurrency axis."""
    series: dict[str, list[ConcurrencyPoint]] = {}
    for result in results:
        config, summary = result["config"], result["summary"]
        concurrency = config.get("concurrency")
        if not _is_number(concurrency):
            continue
        ttft = summary.get("ttft_ms")
        point = ConcurrencyPoint(
            label=str(config["label"]),
            concurrency=int(concurrency),
            requests_per_s=float(summary["requests_per_s"]),
            ttft_p99_ms=float(ttft["p99"]) if isinstance(ttft, Mapping) else None,
        )
        series.setdefault(series_of(result), []).append(point)
    for points in series.values():
        points.sort(key=lambda p: (p.concurrency, p.label))
    return series


def has_concurrency_sweep(series: Mapping[str, Sequence[ConcurrencyPoint]]) -> bool:
    """True when at least one series has two or more distinct concurrency levels."""
    return any(len({p.concurrency for p in points}) >= 2 for points in series.values())


# --- server stages --------------------------------------------------------------------------


@dataclass(frozen=True)
class StageBreakdown:
    """Median server stage times of one load point, in ms, over `requests` successful
    requests that reported all four server timings. The parts stack up to the median server
    total, and retrieve + compress + queue+prefill is the median server TTFT (the server
    measures TTFT and total from the request's arrival), unless a clamp at 0 applied."""

    label: str
    requests: int
    retrieve_ms: float
    compress_ms: float
    queue_prefill_ms: float
    decode_ms: float

    @property
    def parts_ms(self) -> tuple[float, float, float, float]:
        """The parts in STAGE_PARTS order."""
        return (self.retrieve_ms, self.compress_ms, self.queue_prefill_ms, self.decode_ms)

    @property
    def total_ms(self) -> float:
        return sum(self.parts_ms)


def stage_breakdown(result: LatencyResult) -> StageBreakdown | None:
    """Medians of the records' `server_timings_ms` (retrieve, compress, ttft, total), then
    queue+prefill = ttft - retrieve - compress and decode = total - ttft, each clamped at 0.
    The differences are taken of the medians, not per request, so that the bar's boundaries
    are the medians the summary tables show. None when no successful record has all four."""
    timings = [
        record["server_timings_ms"]
        for record in result["records"]
        if record.get("ok") and _has_server_stages(record.get("server_timings_ms"))
    ]
    if not timings:
        return None
    median = {stage: percentile([t[stage] for t in timings], 50) for stage in _SERVER_STAGES}
    return StageBreakdown(
        label=str(result["config"]["label"]),
        requests=len(timings),
        retrieve_ms=median["retrieve"],
        compress_ms=median["compress"],
        queue_prefill_ms=max(0.0, median["ttft"] - median["retrieve"] - median["compress"]),
        decode_ms=max(0.0, median["total"] - median["ttft"]),
    )


def stage_breakdowns(results: Iterable[LatencyResult]) -> list[StageBreakdown]:
    """`stage_breakdown` of each result that has server timings, in the given order."""
    return [b for r in results if (b := stage_breakdown(r)) is not None]


# --- plots ----------------------------------------------------------------------------------


def plot_concurrency(
    results: Iterable[LatencyResult], path: Path, *, series_of: SeriesOf = series_by_label
) -> None:
    """Write a two-panel PNG to `path`: requests/s and p99 TTFT (ms) against concurrency,
    one line per `series_of` series. ValueError when no result was run at a concurrency."""
    series = concurrency_series(results, series_of)
    if not series:
        raise ValueError("no closed-loop (concurrency) load point to plot")
    figure = _figure(11.0, 4.5)
    throughput_axes, ttft_axes = figure.subplots(1, 2)
    for name, points in series.items():
        x = [p.concurrency for p in points]
        throughput_axes.plot(x, [p.requests_per_s for p in points], marker="o", label=name)
        ttft = [math.nan if p.ttft_p99_ms is None else p.ttft_p99_ms for p in points]
        ttft_axes.plot(x, ttft, marker="o", label=name)
    levels = sorted({p.concurrency for points in series.values() for p in points})
    for axes, ylabel, title in (
        (throughput_axes, "requests/s", "Throughput"),
        (ttft_axes, "p99 TTFT (ms)", "p99 time to first token"),
    ):
        _concurrency_axis(axes, levels)
        axes.set_ylabel(ylabel)
        axes.set_title(title)
        axes.set_ylim(bottom=0)
        axes.grid(alpha=0.3)
    ttft_axes.yaxis.set_major_formatter(_thousands())
    throughput_axes.legend(fontsize=8)
    _save(figure, path)


def plot_stage_breakdown(results: Iterable[LatencyResult], path: Path) -> None:
    """Write a PNG to `path`: one stacked bar per load point (labelled by its label) of the
    median server retrieve, compress, queue+prefill and decode times in ms
    (`stage_breakdown`). ValueError when no result has server timings."""
    breakdowns = stage_breakdowns(results)
    if not breakdowns:
        raise ValueError("no load point with server timings to plot")
    figure = _figure(max(6.0, 1.3 * len(breakdowns) + 2.5), 5.0)
    axes = figure.subplots()
    x = list(range(len(breakdowns)))
    bottoms = [0.0] * len(breakdowns)
    for index, part in enumerate(STAGE_PARTS):
        heights = [b.parts_ms[index] for b in breakdowns]
        axes.bar(x, heights, bottom=bottoms, width=0.6, label=part)
        bottoms = [bottom + height for bottom, height in zip(bottoms, heights, strict=True)]
    for position, breakdown in zip(x, breakdowns, strict=True):
        axes.annotate(
            f"{breakdown.total_ms:,.0f} ms (n={breakdown.requests})",
            (position, breakdown.total_ms),
            textcoords="offset points",
            xytext=(0, 3),
            ha="center",
            fontsize=8,
        )
    axes.set_xticks(x, [b.label for b in breakdowns], rotation=20, ha="right")
    axes.set_ylabel("median server time (ms)")
    axes.set_title("Where the server's time goes, per load point")
    axes.yaxis.set_major_formatter(_thousands())
    axes.margins(y=0.1)
    axes.grid(axis="y", alpha=0.3)
    axes.legend(fontsize=8)
    _save(figure, path)


def plot_lines(
    series: Mapping[str, Sequence[tuple[float, float]]],
    xlabel: str,
    ylabel: str,
    title: str,
    path: Path,
    *,
    log_x: bool = False,
) -> None:
    """Write a PNG to `path`: one line with markers per series of (x, y) points, drawn in
    x order; `log_x` for a logarithmic x axis. ValueError when every series is empty."""
    drawn = {name: sorted(points) for name, points in series.items() if points}
    if not drawn:
        raise ValueError("no points to plot")
    figure = _figure(7.0, 4.5)
    axes = figure.subplots()
    for name, points in drawn.items():
        axes.plot([x for x, _ in points], [y for _, y in points], marker="o", label=name)
    if log_x:
        _log_x_axis(axes, sorted({x for points in drawn.values() for x, _ in points}))
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    _save(figure, path)


def write_plots(out_dir: Path, *, series_of: SeriesOf = series_by_label) -> list[Path]:
    """Write out_dir/concurrency.png (when some series has 2+ concurrency levels) and
    out_dir/stages.png (when some load point has server timings) from the latency results
    in `out_dir`; the paths written. Nothing is written, with a warning, without
    matplotlib, so that a suite run does not fail on a missing optional plot."""
    if importlib.util.find_spec("matplotlib") is None:
        logger.warning("matplotlib is not importable; skipping the plots in %s", out_dir)
        return []
    results = load_results(out_dir)
    written: list[Path] = []
    if has_concurrency_sweep(concurrency_series(results, series_of)):
        written.append(out_dir / CONCURRENCY_PNG)
        plot_concurrency(results, written[-1], series_of=series_of)
    if stage_breakdowns(results):
        written.append(out_dir / STAGES_PNG)
        plot_stage_breakdown(results, written[-1])
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI on `argv` (sys.argv when None): 0 when DIR holds latency results, else 1."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.plots", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("directory", type=Path, metavar="DIR", help="a latency lab out folder")
    args = parser.parse_args(argv)
    if not args.directory.is_dir():
        parser.error(f"{args.directory} is not a directory")
    if not load_results(args.directory):
        print(f"error: no latency results (<label>.json) in {args.directory}", file=sys.stderr)
        return 1
    written = write_plots(args.directory)
    print("\n".join(f"wrote {path}" for path in written) or "nothing to plot")
    return 0


# --- matplotlib helpers ---------------------------------------------------------------------


def _figure(width_in: float, height_in: float) -> Figure:
    # A Figure on an Agg canvas, not pyplot: no global backend or figure registry to touch.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width_in, height_in))
    FigureCanvasAgg(figure)
    return figure


def _save(figure: Figure, path: Path) -> None:
    figure.tight_layout()
    figure.savefig(path, dpi=_DPI, format="png")


def _concurrency_axis(axes: Axes, levels: Sequence[int]) -> None:
    from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

    # Concurrency sweeps double (1, 2, 4, ... 64): a log2 axis spaces them evenly.
    if levels and levels[-1] / levels[0] > 4:
        axes.set_xscale("log", base=2)
        axes.xaxis.set_minor_locator(NullLocator())
    axes.xaxis.set_major_locator(FixedLocator(list(levels)))
    axes.xaxis.set_major_formatter(ScalarFormatter())
    axes.set_xlabel("concurrency (requests in flight)")


def _log_x_axis(axes: Axes, xs: Sequence[float]) -> None:
    from matplotlib.ticker import FixedLocator, NullFormatter, StrMethodFormatter

    axes.set_xscale("log")
    # Label the measured x values in plain numbers (512, 4,096), not as powers of ten,
    # unless there are too many of them to fit.
    if len(xs) <= 12:
        axes.xaxis.set_major_locator(FixedLocator(list(xs)))
    axes.xaxis.set_major_formatter(StrMethodFormatter("{x:,g}"))
    axes.xaxis.set_minor_formatter(NullFormatter())


def _thousands() -> Formatter:
    from matplotlib.ticker import StrMethodFormatter

    return StrMethodFormatter("{x:,.0f}")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _has_server_stages(timings: object) -> bool:
    return isinstance(timings, Mapping) and all(
        _is_number(timings.get(stage)) for stage in _SERVER_STAGES
    )


if __name__ == "__main__":
    sys.exit(main())
