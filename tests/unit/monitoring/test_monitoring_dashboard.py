"""The Grafana dashboard: generated from code, Ray's conventions, known metrics only, every
query filtered like Ray's dashboards, panels with unique ids on a grid without overlaps."""

from __future__ import annotations

import re

import pytest

from monitoring import dashboard, panels, render
from monitoring.panels import ROWS, Line, PanelSpec

KNOWN = {
    line.strip()
    for line in (dashboard.ROOT / "monitoring" / "known_metrics.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")
}


@pytest.fixture(scope="module")
def model() -> dict:
    return dashboard.build_dashboard()


def test_the_committed_json_is_what_the_code_builds(model):
    assert dashboard.OUTPUT.read_text() == dashboard.render_json(model)
    assert dashboard.main(["--check"]) == 0


def test_a_stale_file_is_caught(tmp_path):
    stale = tmp_path / "d.json"
    stale.write_text("{}\n")
    assert dashboard.main(["--check", "--output", str(stale)]) == 1


def test_rays_conventions(model):
    variables = {v["name"]: v for v in model["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert {"SessionName", "Application", "Cluster"} <= set(variables)
    assert any(tag.startswith("rayVersion:") for tag in model["tags"])
    assert model["uid"] == dashboard.UID
    for panel in dashboard.panels(model):
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert 'SessionName=~"$SessionName"' in target["expr"], target["expr"]


def test_the_cluster_variable_is_rays(model):
    """As in Ray's *_grafana_dashboard_base.json: `Cluster` over `ray_io_cluster`, whose "All"
    matches series without the label (it exists only where KubeRay's PodMonitor adds it)."""
    cluster = next(v for v in model["templating"]["list"] if v["name"] == "Cluster")
    assert cluster["query"]["query"] == (
        "label_values(ray_node_network_receive_speed, ray_io_cluster)"
    )
    assert cluster["includeAll"] is True
    assert cluster["allValue"] == ".*"
    for name in ("SessionName", "Application"):
        variable = next(v for v in model["templating"]["list"] if v["name"] == name)
        assert 'ray_io_cluster=~"$Cluster"' in variable["query"]["query"], name


def _selectors(expr: str) -> list[tuple[str, list[str]]]:
    """Each `metric{matchers}` of an expression: the name and its matchers."""
    return [
        (name, matchers.split(","))
        for name, matchers in re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}", expr)
    ]


def _targets(model: dict) -> list[tuple[str, str]]:
    return [
        (panel["title"], target["expr"])
        for panel in dashboard.panels(model)
        for target in panel["targets"]
    ]


def test_no_line_is_padded_with_a_constant(model):
    """`or vector(0)` makes a line return data whatever the scrape holds: the data test
    against Prometheus could never fail for it."""
    assert "vector(" not in dashboard.render_json(model)
    for title, expr in _targets(model):
        assert not re.search(r"\bor\s+vector\s*\(", expr), f"{title}: {expr}"


def test_every_selector_filters_on_session_and_cluster(model):
    for title, expr in _targets(model):
        selectors = _selectors(expr)
        assert selectors, f"{title}: {expr}"
        for name, matchers in selectors:
            assert panels.SESSION in matchers, f"{title}: {name} {matchers}"
            assert panels.CLUSTER in matchers, f"{title}: {name} {matchers}"


def test_application_filter_exactly_on_the_metrics_that_carry_the_label(model):
    """A metric without `application` (vLLM's engine metrics) would be emptied by the
    filter; one with it must follow the variable."""
    filtered, unfiltered = set(), set()
    for title, expr in _targets(model):
        for name, matchers in _selectors(expr):
            if panels.carries_application(name):
                assert panels.APPLICATION in matchers, f"{title}: {name} {matchers}"
                filtered.add(name)
            else:
                assert not any(m.startswith("application") for m in matchers), f"{title}: {name}"
                unfiltered.add(name)
    # The ingress's own metrics (ray.serve.metrics in a replica) and Serve's carry it.
    assert {n for n in filtered | unfiltered if n.startswith(("ray_rag_", "ray_serve_"))} <= (
        filtered
    )
    assert {n for n in filtered | unfiltered if n.startswith("ray_vllm_")} <= unfiltered
    assert "ray_serve_num_http_requests_total" in filtered


def test_histogram_series_share_their_familys_label():
    assert panels.family("ray_rag_stage_latency_ms_bucket") == "ray_rag_stage_latency_ms"
    assert panels.family("ray_rag_tpot_ms_count") == "ray_rag_tpot_ms"
    assert panels.family("ray_rag_requests_completed_total") == "ray_rag_requests_completed_total"
    assert panels.carries_application("ray_serve_deployment_processing_latency_ms_sum")
    assert not panels.carries_application("ray_vllm_time_to_first_token_seconds_bucket")


def test_every_row_and_panel_has_a_unique_id(model):
    ids = [panel.get("id") for panel in model["panels"]]
    assert all(isinstance(panel_id, int) and panel_id > 0 for panel_id in ids), ids
    assert len(ids) == len(set(ids)), ids


def test_ids_are_the_specs_own(model):
    """Stable: an id is written in monitoring.panels, not derived from the panel's place."""
    expected = [
        (item.row_id if isinstance(item, panels.RowSpec) else item.panel_id, item.title)
        for row in ROWS
        for item in (row, *row.panels)
    ]
    assert [(panel["id"], panel["title"]) for panel in model["panels"]] == expected


def _cells(grid_pos: dict) -> set[tuple[int, int]]:
    return {
        (x, y)
        for x in range(grid_pos["x"], grid_pos["x"] + grid_pos["w"])
        for y in range(grid_pos["y"], grid_pos["y"] + grid_pos["h"])
    }


def test_panels_sit_on_the_grid_without_overlapping(model):
    taken: dict[tuple[int, int], str] = {}
    for panel in model["panels"]:
        grid_pos = panel["gridPos"]
        assert grid_pos["w"] > 0 and grid_pos["h"] > 0, panel["title"]
        assert grid_pos["x"] >= 0 and grid_pos["x"] + grid_pos["w"] <= 24, panel["title"]
        for cell in _cells(grid_pos):
            assert cell not in taken, f"{panel['title']} overlaps {taken[cell]}"
            taken[cell] = panel["title"]


def test_each_panel_sits_below_its_row_and_above_the_next(model):
    row_y = None
    for panel in model["panels"]:
        if panel["type"] == "row":
            assert panel["gridPos"]["w"] == 24 and panel["gridPos"]["x"] == 0
            assert row_y is None or panel["gridPos"]["y"] > row_y
            row_y = panel["gridPos"]["y"]
            bottom = row_y + panel["gridPos"]["h"]
        else:
            assert row_y is not None and panel["gridPos"]["y"] >= bottom, panel["title"]
    rows = [p["gridPos"]["y"] for p in model["panels"] if p["type"] == "row"]
    for panel in dashboard.panels(model):
        top, end = panel["gridPos"]["y"], panel["gridPos"]["y"] + panel["gridPos"]["h"]
        assert not any(top <= y < end for y in rows), panel["title"]


def test_overlap_is_caught():
    assert _cells({"x": 0, "y": 1, "w": 12, "h": 8}) & _cells({"x": 6, "y": 8, "w": 12, "h": 8})
    assert not _cells({"x": 0, "y": 1, "w": 12, "h": 8}) & _cells(
        {"x": 12, "y": 1, "w": 12, "h": 8}
    )


REQUIRED = [
    "Requests by status",
    "Errors by status and code",
    "Stage latency: retrieve and compress",
    "TTFT",
    "TPOT",
    "Compression ratio",
    "Context tokens before and after compression",
    "Prefix-cache hit rate",
    "Queue depth",
    "Rejections",
    "Replicas per deployment",
    "vLLM KV-cache usage",
    "Ingestion jobs by status",
    "Ingestion job duration",
    "Documents ingested by outcome",
    "Version load time",
]


def test_every_panel_the_issue_asks_for_is_there(model):
    titles = {panel["title"] for panel in dashboard.panels(model)}
    assert set(REQUIRED) <= titles


def test_latency_panels_give_p50_p95_p99(model):
    stage = next(p for p in dashboard.panels(model) if p["title"].startswith("Stage latency"))
    assert [t["expr"].split(",")[0] for t in stage["targets"]] == [
        "histogram_quantile(0.5",
        "histogram_quantile(0.95",
        "histogram_quantile(0.99",
    ]


def test_every_query_reads_only_known_metrics(model):
    for query in dashboard.panel_queries(model):
        unknown = dashboard.metric_names(query.expr) - KNOWN
        assert not unknown, f"{query.title}: {unknown}"


def test_an_unknown_metric_is_caught():
    spec = PanelSpec(1, "x", "x", "short", (Line('sum(ray_rag_no_such_metric_total{a="b"})', "x"),))
    assert dashboard.metric_names(spec.lines[0].expr) - KNOWN == {"ray_rag_no_such_metric_total"}


def test_a_metric_without_rays_prefix_is_caught():
    expr = 'histogram_quantile(0.5, sum by (le) (rate(rag_stage_latency_ms_bucket{a="b"}[1m])))'
    assert dashboard.metric_names(expr) - KNOWN == {"rag_stage_latency_ms_bucket"}


def test_every_selector_of_every_panel_has_a_label_matcher(model):
    """What metric_names relies on: a bare name would escape the known-metric test."""
    for query in dashboard.panel_queries(model):
        bare = re.findall(r"\(([a-zA-Z_:][a-zA-Z0-9_:]*)\[", query.expr)
        assert not bare, f"{query.title}: {bare}"


def test_panel_queries_substitute_every_variable(model):
    queries = dashboard.panel_queries(model, rate_interval="2m")
    assert len(queries) == sum(len(spec.lines) for row in ROWS for spec in row.panels)
    for query in queries:
        assert "$" not in query.expr
        assert "[2m]" in query.expr or "rate(" not in query.expr


def test_an_unknown_variable_is_refused():
    with pytest.raises(ValueError, match="unsubstituted"):
        dashboard.substitute('up{job="$job"}', "1m")


def test_variables_are_substituted_with_their_all_value_or_the_one_given():
    expr = panels.selector("ray_rag_tpot_ms_bucket")
    assert dashboard.substitute(expr, "1m") == (
        'ray_rag_tpot_ms_bucket{SessionName=~".+",ray_io_cluster=~".*",application=~".+"}'
    )
    assert 'application=~"rag"' in dashboard.substitute(expr, "1m", {"Application": "rag"})


CANNED = {
    "status": "success",
    "data": {
        "resultType": "matrix",
        "result": [
            {"metric": {"stage": "ttft"}, "values": [[1.0, "10"], [2.0, "NaN"], [3.0, "12"]]},
            {"metric": {"stage": "total"}, "values": [[1.0, "NaN"]]},
        ],
    },
}


def test_render_turns_a_range_answer_into_series_without_nan():
    (series,) = render.series_of(CANNED, "p50 {{stage}}")
    assert series.label == "p50 ttft"
    assert series.times == [1.0, 3.0]
    assert series.values == [10.0, 12.0]


def test_render_refuses_an_error_answer():
    with pytest.raises(ValueError, match="Prometheus answered"):
        render.series_of({"status": "error", "error": "bad"}, "")


@pytest.mark.parametrize(("count", "shape"), [(1, (1, 1)), (3, (1, 3)), (17, (6, 3))])
def test_render_grid(count, shape):
    assert render.grid(count) == shape
