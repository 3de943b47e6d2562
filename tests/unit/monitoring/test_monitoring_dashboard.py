"""The Grafana dashboard: generated from code, Ray's conventions, known metrics only."""

from __future__ import annotations

import re

import pytest

from monitoring import dashboard, render
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
    assert {"SessionName", "Application"} <= set(variables)
    assert any(tag.startswith("rayVersion:") for tag in model["tags"])
    assert model["uid"] == dashboard.UID
    for panel in dashboard.panels(model):
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert 'SessionName=~"$SessionName"' in target["expr"], target["expr"]


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
        if query.optional_reason:  # a metric vLLM defines that this export does not carry
            continue
        unknown = dashboard.metric_names(query.expr) - KNOWN
        assert not unknown, f"{query.title}: {unknown}"


def test_an_unknown_metric_is_caught():
    spec = PanelSpec("x", "x", "short", (Line('sum(ray_rag_no_such_metric_total{a="b"})', "x"),))
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


def test_only_the_kv_cache_panel_is_optional(model):
    optional = {q.title for q in dashboard.panel_queries(model) if q.optional_reason}
    assert optional == {"vLLM KV-cache usage"}


def test_an_unknown_variable_is_refused():
    with pytest.raises(ValueError, match="unsubstituted"):
        dashboard.substitute('up{job="$job"}', "1m")


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
