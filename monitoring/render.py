"""Draw the dashboard's panels from Prometheus, with the panels' own queries: a PNG for the
docs where no Grafana is at hand (Debian packages none).

    python -m monitoring.render --prometheus http://127.0.0.1:9090 --minutes 10 \
        --out docs/monitoring.png
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from monitoring.dashboard import build_dashboard, panels, substitute

COLUMNS = 3


@dataclass(frozen=True)
class Series:
    label: str
    times: list[float]
    values: list[float]


def legend(template: str, labels: dict[str, str]) -> str:
    """Grafana's `{{label}}` legend format filled from a series' labels."""
    text = template
    for key, value in labels.items():
        text = text.replace("{{" + key + "}}", value)
    return text


def series_of(body: dict[str, Any], legend_format: str) -> list[Series]:
    """A /api/v1/query_range answer as series, NaN and infinite points dropped."""
    if body.get("status") != "success":
        raise ValueError(f"Prometheus answered {body}")
    found = []
    for result in body["data"]["result"]:
        points = [(float(t), float(v)) for t, v in result["values"] if math.isfinite(float(v))]
        if points:
            times, values = zip(*points, strict=True)
            found.append(Series(legend(legend_format, result["metric"]), list(times), list(values)))
    return found


def grid(count: int, columns: int = COLUMNS) -> tuple[int, int]:
    """Rows and columns of a grid holding `count` panels."""
    return max(1, math.ceil(count / columns)), min(columns, max(1, count))


def fetch(prometheus: str, expr: str, start: float, end: float, step_s: float) -> dict:
    response = httpx.get(
        f"{prometheus}/api/v1/query_range",
        params={"query": expr, "start": start, "end": end, "step": step_s},
        timeout=30,
    )
    return dict(response.json())


def render(prometheus: str, minutes: float, out: Path, rate_interval: str = "1m") -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    model = build_dashboard()
    shown = panels(model)
    end = time.time()
    start = end - minutes * 60
    step_s = max(1.0, minutes * 60 / 200)
    rows, columns = grid(len(shown))
    figure, axes = plt.subplots(rows, columns, figsize=(5.2 * columns, 2.8 * rows), squeeze=False)
    for index, panel in enumerate(shown):
        axis = axes[index // columns][index % columns]
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
        axis.set_title(f"{panel['title']} ({unit})" if unit else panel["title"], fontsize=9)
        drawn = 0
        for target in panel["targets"]:
            body = fetch(prometheus, substitute(target["expr"], rate_interval), start, end, step_s)
            for series in series_of(body, target.get("legendFormat", "")):
                axis.plot([t - end for t in series.times], series.values, label=series.label)
                drawn += 1
        if drawn:
            axis.legend(fontsize=6, loc="upper left")
        else:
            axis.text(0.5, 0.5, "no data", ha="center", va="center", transform=axis.transAxes)
        axis.tick_params(labelsize=7)
        axis.set_xlabel("seconds before now", fontsize=7)
    for index in range(len(shown), rows * columns):
        axes[index // columns][index % columns].axis("off")
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=80)
    plt.close(figure)
    return len(shown)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prometheus", default="http://127.0.0.1:9090")
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--rate-interval", default="1m")
    parser.add_argument("--out", type=Path, default=Path("docs/monitoring.png"))
    args = parser.parse_args(argv)
    count = render(args.prometheus, args.minutes, args.out, args.rate_interval)
    print(f"wrote {args.out}: {count} panels")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
