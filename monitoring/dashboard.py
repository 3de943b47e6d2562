"""The RAG service's Grafana dashboard, built with grafana-foundation-sdk from monitoring.panels.

`python -m monitoring.dashboard` writes monitoring/grafana/rag_serve_grafana_dashboard.json
(`--check` fails when the committed file is stale). It follows Ray's dashboard files
(ray/dashboard/modules/metrics/dashboards/*_grafana_dashboard_base.json): a hidden
`datasource` variable of type prometheus that every panel and query uses, `SessionName` and
`Cluster` (`ray_io_cluster`, "All" = `.*` as the label is absent outside KubeRay) filters on
every query, an `Application` variable from Serve's replica metric that filters every query of
a metric carrying the label, unique panel ids and explicit grid positions, and the
`rayVersion:` tag, so the file can sit beside the dashboards Ray writes into
`session_latest/metrics/grafana/dashboards/` and be provisioned or imported with them.

`panel_queries` gives every panel's PromQL with the Grafana variables substituted, for a
direct Prometheus query (the integration test and monitoring.render).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.builders import prometheus, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as gm

from monitoring.panels import CLUSTER, ROWS, SESSION, PanelSpec

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "monitoring" / "grafana" / "rag_serve_grafana_dashboard.json"
UID = "ragServeDashboard"
DATASOURCE = gm.DataSourceRef(type_val="prometheus", uid="${datasource}")
GRID_COLUMNS = 24  # Grafana's grid
PANEL_WIDTH = 12  # two panels side by side
PANEL_HEIGHT = 8
ROW_HEIGHT = 1
# Each variable's "All": SessionName and Application must be set (Ray's SessionName uses `.+`,
# and `.+` is Ray Serve's `.*` with `application!~""`); ray_io_cluster exists only where
# KubeRay's PodMonitor adds it, so Cluster's "All" must match its absence, as in Ray's files.
ALL_VALUES = {"SessionName": ".+", "Cluster": ".*", "Application": ".+"}


@dataclass(frozen=True)
class PanelQuery:
    title: str
    ref_id: str
    expr: str


def build_dashboard() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model (a plain dict)."""
    builder = (
        gd.Dashboard("RAG Serve")
        .uid(UID)
        .description(
            "Per-stage figures of the RAG service (retrieve, compress, generate) from Ray's "
            "metrics export: requests, errors, latency, TTFT/TPOT, compression, prefix cache, "
            "queues, replicas."
        )
        .tags(["rag", "serve", f"rayVersion:{ray.__version__}"])
        .time("now-30m", "now")
        .refresh("10s")
        .tooltip(gm.DashboardCursorSync.CROSSHAIR)
        .with_variable(
            gd.DatasourceVariable("datasource")
            .label("Data source")
            .type("prometheus")
            .hide(gm.VariableHide.HIDE_VARIABLE)
        )
        .with_variable(_cluster_variable())
        .with_variable(
            _label_variable(
                "SessionName", "SessionName", f"ray_serve_deployment_replica_healthy{{{CLUSTER}}}"
            )
        )
        .with_variable(
            _label_variable(
                "Application",
                "application",
                f"ray_serve_deployment_replica_healthy{{{SESSION},{CLUSTER}}}",
            )
        )
    )
    y = 0
    for row in ROWS:
        builder = builder.with_row(
            gd.Row(row.title).id(row.row_id).grid_pos(gm.GridPos(ROW_HEIGHT, GRID_COLUMNS, 0, y))
        )
        y += ROW_HEIGHT
        for index, spec in enumerate(row.panels):
            x = index % (GRID_COLUMNS // PANEL_WIDTH) * PANEL_WIDTH
            top = y + index // (GRID_COLUMNS // PANEL_WIDTH) * PANEL_HEIGHT
            builder = builder.with_panel(
                _panel(spec).grid_pos(gm.GridPos(PANEL_HEIGHT, PANEL_WIDTH, x, top))
            )
        y += math.ceil(len(row.panels) / (GRID_COLUMNS // PANEL_WIDTH)) * PANEL_HEIGHT
    model = json.loads(json.dumps(builder.build(), cls=JSONEncoder, sort_keys=True))
    model["rayMeta"] = ["supportsGlobalFilterOverride"]
    return model


def _label_variable(name: str, label: str, selector: str) -> gd.QueryVariable:
    query = f"label_values({selector}, {label})"
    return (
        gd.QueryVariable(name)
        .label(name)
        .datasource(DATASOURCE)
        .query({"query": query, "refId": f"{name}-variable"})
        .refresh(gm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .multi(True)
        .include_all(True)
        .all_value(ALL_VALUES[name])
    )


def _cluster_variable() -> gd.QueryVariable:
    """Ray's `Cluster` variable (dashboards/*_grafana_dashboard_base.json), as Ray writes it."""
    query = "label_values(ray_node_network_receive_speed, ray_io_cluster)"
    return (
        gd.QueryVariable("Cluster")
        .label("Cluster")
        .description(
            "Filter queries to specific Ray clusters for KubeRay. When ingesting metrics "
            "across multiple Ray clusters, the ray_io_cluster label should be set per "
            "cluster. For KubeRay users, this is done automatically with Prometheus "
            "PodMonitor."
        )
        .datasource(DATASOURCE)
        .query({"query": query, "refId": "StandardVariableQuery"})
        .refresh(gm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(gm.VariableSort.ALPHABETICAL_DESC)
        .multi(False)
        .include_all(True)
        .all_value(ALL_VALUES["Cluster"])
    )


def _panel(spec: PanelSpec) -> timeseries.Panel:
    panel = (
        timeseries.Panel()
        .title(spec.title)
        .description(spec.description)
        .id(spec.panel_id)
        .datasource(DATASOURCE)
        .unit(spec.unit)
    )
    for index, line in enumerate(spec.lines):
        panel = panel.with_target(
            prometheus.Dataquery()
            .expr(line.expr)
            .legend_format(line.legend)
            .ref_id(chr(ord("A") + index))
            .datasource(DATASOURCE)
        )
    return panel


def panels(model: dict[str, Any]) -> list[dict[str, Any]]:
    """The model's panels, rows left out."""
    return [panel for panel in model["panels"] if panel.get("type") != "row"]


def panel_queries(
    model: dict[str, Any], rate_interval: str = "1m", values: Mapping[str, str] | None = None
) -> list[PanelQuery]:
    """Every target of every panel, ready for Prometheus's /api/v1/query: each variable at
    its `values` entry, else "All"; `$__rate_interval` and `$__interval` as `rate_interval`."""
    queries = []
    for panel in panels(model):
        for target in panel["targets"]:
            expr = substitute(target["expr"], rate_interval, values)
            queries.append(PanelQuery(panel["title"], target["refId"], expr))
    return queries


def substitute(expr: str, rate_interval: str, values: Mapping[str, str] | None = None) -> str:
    """`expr` with the time variables as `rate_interval` and each dashboard variable as its
    `values` entry (a regex), else its "All" value."""
    expr = expr.replace("$__rate_interval", rate_interval).replace("$__interval", rate_interval)
    chosen = {**ALL_VALUES, **(values or {})}
    expr = re.sub(
        r"\$\{?(" + "|".join(ALL_VALUES) + r")\}?",
        lambda match: chosen[match.group(1)],
        expr,
    )
    if "$" in expr:
        raise ValueError(f"unsubstituted variable in {expr!r}")
    return expr


# Every selector in the panels has a label matcher, so a metric name is what stands before `{`:
# a name that lost its `ray_` prefix is read too, and the known-metric test refuses it.
METRIC_NAME = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{")


def metric_names(expr: str) -> set[str]:
    """The metric names an expression's selectors read."""
    return set(METRIC_NAME.findall(expr))


def render_json(model: dict[str, Any]) -> str:
    return json.dumps(model, indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if the file is stale")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    text = render_json(build_dashboard())
    if args.check:
        if not args.output.exists() or args.output.read_text() != text:
            print(f"{args.output} is stale: run python -m monitoring.dashboard", file=sys.stderr)
            return 1
        return 0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    print(f"wrote {args.output}: {len(panels(build_dashboard()))} panels")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
