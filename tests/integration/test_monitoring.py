"""The dashboard against real data: the real service, scraped by a real Prometheus.

The module starts the application (`serve run`, its Ray instance in a temp dir of its own so
the discovery file is this session's) and Debian's Prometheus with monitoring/prometheus.yml
pointed at it, sends traffic of every kind the panels show (answers, streams, compression
methods, errors, a compressor timeout answered degraded, requests past the key's rate limit),
and in each round an ingestion job into a collection of the test's own (a document added, one
replaced, an unreadable file) and a query that opens the collection's new version; it waits
for the scrapes, and runs every panel's PromQL through Prometheus's HTTP API: each must
return data, with the Application filter set to this application. MONITORING_SCREENSHOT=path
renders the panels from the same queries into a PNG (the docs' picture).
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from bench.service import ServiceError, free_port, running_server, running_service
from monitoring import dashboard, panels
from monitoring.prometheus import config_for, prometheus_argv

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
API_KEY = "monitoring-test-key-0123456789"
# The collection traffic's own key: API_KEY's bucket is emptied at the end of every round.
COLLECTIONS_KEY = "monitoring-collections-key-0123456789"
COLLECTION = "monitoring"
JOB_TIMEOUT_S = 180
# Slower than the rate limit's refill (0.5 requests/s): polling a job never runs out.
JOB_POLL_S = 2.0
SCRAPE_S = 2.0
# Ray's workers report to their node's metrics agent every 10 s by default.
EXPORT_WAIT_S = 25.0
RATE_WINDOW = "3m"
PROMETHEUS = shutil.which("prometheus")
SERVE_CONFIG = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
(APPLICATION,) = (app["name"] for app in SERVE_CONFIG["applications"])
# Sentence selection takes tens of ms here and LLMLingua seconds: an LLMLingua request times
# out at the compressor and is answered degraded, the other methods are not.
COMPRESSOR_TIMEOUT_S = 2.0
# Per API key: a round's six keyed requests stay inside the burst, and the pause between
# rounds refills it; the burst of cheap requests that ends each round goes past it.
RATE_LIMIT_BURST = 10
RATE_LIMIT = {"requests_per_s": 0.5, "burst": RATE_LIMIT_BURST}
ROUNDS = 2


@dataclass(frozen=True)
class Monitored:
    service_url: str
    prometheus_url: str


@pytest.fixture(scope="module")
def monitored(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Monitored]:
    if PROMETHEUS is None:
        pytest.fail("Debian's prometheus package is needed: make prometheus (as root)")
    workdir = tmp_path_factory.mktemp("monitoring")
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    port = free_port()
    config["http_options"]["port"] = port
    (app,) = config["applications"]
    app["args"]["compression"]["timeout_s"] = COMPRESSOR_TIMEOUT_S
    app["args"]["ingress"]["rate_limit"] = RATE_LIMIT
    app["args"]["collections"]["root"] = str(workdir / "collections")  # not the checkout's
    config_path = workdir / "serve_config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    # Short: Ray's socket paths live under it and must stay under 108 bytes.
    ray_tmp = Path(tempfile.mkdtemp(prefix="rm", dir="/tmp"))
    prometheus_config = workdir / "prometheus.yml"
    prometheus_config.write_text(yaml.safe_dump(config_for(ray_tmp / "ray", SCRAPE_S)))
    prometheus_port = free_port()
    prometheus_url = f"http://127.0.0.1:{prometheus_port}"
    env = {"RAG_API_KEYS": f"{API_KEY},{COLLECTIONS_KEY}", "RAY_TMPDIR": str(ray_tmp)}
    try:
        with (
            running_service(config_path, port, workdir / "serve.log", env) as url,
            running_server(
                prometheus_argv(PROMETHEUS, prometheus_config, workdir / "data", prometheus_port),
                f"{prometheus_url}/-/ready",
                workdir / "prometheus.log",
                env=dict(os.environ),
                name="prometheus",
                ready_timeout_s=60,
                poll_s=1,
            ),
        ):
            yield Monitored(url, prometheus_url)
    except ServiceError as exc:
        pytest.fail(str(exc))
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def traffic(monitored: Monitored) -> None:
    """Two rounds of requests with scrapes between them, so every rate() sees an increase."""
    headers = {"Authorization": f"Bearer {API_KEY}"}
    collections_headers = {"Authorization": f"Bearer {COLLECTIONS_KEY}"}
    with (
        httpx.Client(base_url=monitored.service_url, headers=headers, timeout=300) as client,
        httpx.Client(
            base_url=monitored.service_url, headers=collections_headers, timeout=300
        ) as collections,
    ):
        for round_ in range(ROUNDS):
            with client.stream(
                "POST",
                "/v1/chat/completions",
                json={
                    "model": "smollm2-135m-instruct",
                    "messages": [{"role": "user", "content": "What does the retriever do?"}],
                    "max_tokens": 12,
                    "stream": True,
                },
            ) as stream:
                assert stream.status_code == 200
                stream.read()
            for method in ("none", "sentences"):
                answer = _ask(client, round_, {"method": method})
                assert answer["degraded"] is None, answer
            # LLMLingua outlasts the compressor timeout: the uncompressed context, flagged.
            # Last of the round's answers, so its scorer, still running, delays no other.
            answer = _ask(client, round_, {"method": "llmlingua", "policy": "always"})
            assert answer["degraded"] == "compressor_timeout", answer
            # Errors of three kinds: bad input, no key, unknown route.
            assert client.post("/v1/rag/query", json={"nope": 1}).status_code == 400
            no_key = httpx.post(f"{monitored.service_url}/v1/rag/query", json={"question": "Q?"})
            assert no_key.status_code == 401
            assert client.get("/v1/nowhere").status_code == 404
            # Past the key's rate limit: cheap requests until the bucket is empty, then 429s.
            statuses = [client.get("/v1/models").status_code for _ in range(RATE_LIMIT_BURST + 5)]
            assert set(statuses) == {200, 429} and statuses[0] == 200, statuses
            # The collection's job and query run in the wait for the export.
            exported_at = time.monotonic() + EXPORT_WAIT_S
            _ingest(collections, round_)
            time.sleep(max(0.0, exported_at - time.monotonic()))
    _wait_for(monitored.prometheus_url, "ray_rag_requests_degraded_total", minimum=ROUNDS)
    _wait_for(
        monitored.prometheus_url, 'ray_rag_request_errors_total{status="429"}', minimum=ROUNDS
    )
    _wait_for(monitored.prometheus_url, "ray_rag_request_errors_total", minimum=4 * ROUNDS)
    _wait_for(monitored.prometheus_url, "ray_rag_ingestion_jobs_total", minimum=ROUNDS)
    _wait_for(monitored.prometheus_url, "ray_rag_collection_version_loads_total", minimum=ROUNDS)


def _ingest(client: httpx.Client, round_: int) -> None:
    """One job into COLLECTION (created in the first round): `notes` added, then replaced;
    a document of the round's own; a file that cannot be read. Then a query to the
    collection, which opens the version the job published."""
    if round_ == 0:
        created = client.post("/v1/collections", json={"name": COLLECTION})
        assert created.status_code == 201, created.text
    files = [
        ("notes.md", f"# Notes\n\nThe night ferry leaves at {7 + round_} o'clock.\n"),
        (f"round-{round_}.md", f"# Round {round_}\n\nRound {round_} of the monitoring test.\n"),
    ]
    response = client.post(
        f"/v1/collections/{COLLECTION}/documents",
        files=[("files", (name, text.encode(), "text/markdown")) for name, text in files]
        + [("files", ("broken.pdf", b"%PDF-1.4 not really", "application/pdf"))],
    )
    assert response.status_code == 202, response.text
    job = response.json()
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while job["status"] not in ("succeeded", "failed"):
        assert time.monotonic() < deadline, f"job still {job['status']}: {job}"
        time.sleep(JOB_POLL_S)
        polled = client.get(f"/v1/jobs/{job['id']}")
        assert polled.status_code == 200, polled.text
        job = polled.json()
    assert job["status"] == "succeeded", job
    expected = {"added": 2, "replaced": 0} if round_ == 0 else {"added": 1, "replaced": 1}
    assert {**expected, "unreadable": 1}.items() <= job["counts"].items(), job
    answer = client.post(
        "/v1/rag/query",
        json={
            "question": "When does the night ferry leave?",
            "collection": COLLECTION,
            "max_tokens": 4,
            "compression": {"method": "none"},
        },
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["sources"][0]["id"].startswith("notes#"), answer.json()


def _ask(client: httpx.Client, round_: int, compression: dict) -> dict:
    response = client.post(
        "/v1/rag/query",
        json={
            "question": f"How does prefix caching lower TTFT? ({round_})",
            "max_tokens": 12,
            "compression": compression,
        },
    )
    assert response.status_code == 200, response.text
    return dict(response.json())


def _query(prometheus_url: str, expr: str) -> list[dict]:
    response = httpx.get(f"{prometheus_url}/api/v1/query", params={"query": expr}, timeout=30)
    body = response.json()
    assert body.get("status") == "success", f"{expr}: {body}"
    return list(body["data"]["result"])


def _wait_for(prometheus_url: str, metric: str, minimum: float, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = _query(prometheus_url, f"sum({metric})")
        if result and float(result[0]["value"][1]) >= minimum:
            return
        time.sleep(SCRAPE_S)
    pytest.fail(f"Prometheus never saw sum({metric}) >= {minimum}")


def test_prometheus_scrapes_every_metrics_agent_of_the_session(monitored, traffic):
    targets = httpx.get(f"{monitored.prometheus_url}/api/v1/targets", timeout=30).json()
    active = targets["data"]["activeTargets"]
    assert active, "no scrape target discovered"
    assert {target["health"] for target in active} == {"up"}, active


# Application set to this one: a filter on a label its metric lacks would empty the line.
PANEL_QUERIES = dashboard.panel_queries(
    dashboard.build_dashboard(), rate_interval=RATE_WINDOW, values={"Application": APPLICATION}
)


@pytest.mark.parametrize(
    "panel", PANEL_QUERIES, ids=[f"{q.title}:{q.ref_id}" for q in PANEL_QUERIES]
)
def test_every_panel_query_returns_data(monitored, traffic, panel):
    result = _query(monitored.prometheus_url, panel.expr)
    values = [float(series["value"][1]) for series in result]
    finite = [value for value in values if math.isfinite(value)]
    assert result, f"{panel.title} [{panel.ref_id}] returned no series: {panel.expr}"
    assert finite, f"{panel.title} [{panel.ref_id}] returned only NaN: {panel.expr} -> {values}"


PANEL_METRICS = sorted(
    {name for query in PANEL_QUERIES for name in dashboard.metric_names(query.expr)}
)


def test_every_metric_a_panel_reads_has_series(monitored, traffic):
    """Each metric a panel reads has series in this scrape's window (over the window, since
    vLLM's gauges get samples only while the engine steps)."""
    missing = [
        name
        for name in PANEL_METRICS
        if not _query(monitored.prometheus_url, f"count(last_over_time({name}[{RATE_WINDOW}]))")
    ]
    assert not missing, f"no series in Prometheus for {missing}"


def _label_names(prometheus_url: str, metric: str) -> set[str]:
    response = httpx.get(f"{prometheus_url}/api/v1/labels", params={"match[]": metric}, timeout=30)
    body = response.json()
    assert body.get("status") == "success", f"{metric}: {body}"
    return set(body["data"])


def test_the_application_filter_is_on_the_metrics_that_carry_the_label(monitored, traffic):
    """monitoring.panels.APPLICATION_LABELLED against the scrape: each metric it lists has
    `application` (the Application filter keeps its series), the others have none (the filter
    would empty them, so the panels leave it off); SessionName is on every one."""
    labels = {name: _label_names(monitored.prometheus_url, name) for name in PANEL_METRICS}
    wrong = {
        name: sorted(names)
        for name, names in labels.items()
        if ("application" in names) != panels.carries_application(name)
        or "SessionName" not in names
    }
    assert not wrong, f"labels differ from monitoring.panels.APPLICATION_LABELLED: {wrong}"


def test_error_panel_counts_errors_by_status_and_code(monitored, traffic):
    result = _query(
        monitored.prometheus_url, "sum by (status, code) (ray_rag_request_errors_total)"
    )
    seen = {(s["metric"]["status"], s["metric"]["code"]): float(s["value"][1]) for s in result}
    bad_input = sum(count for (status, _), count in seen.items() if status == "400")
    assert bad_input >= 2, seen
    assert seen.get(("401", "invalid_api_key"), 0) >= 2, seen
    assert seen.get(("404", "not_found_error"), 0) >= 2, seen
    assert seen.get(("429", "rate_limit_exceeded"), 0) >= 2, seen


def test_rejections_are_counted_at_the_ingress_and_the_proxy(monitored, traffic):
    for expr in (
        'sum(ray_rag_request_errors_total{status="429"})',
        'sum(ray_serve_num_http_requests_total{status_code="429"})',
    ):
        result = _query(monitored.prometheus_url, expr)
        assert result and float(result[0]["value"][1]) >= ROUNDS, f"{expr}: {result}"


def test_degraded_answers_are_counted_by_reason(monitored, traffic):
    result = _query(monitored.prometheus_url, "sum by (reason) (ray_rag_requests_degraded_total)")
    reasons = {series["metric"]["reason"]: float(series["value"][1]) for series in result}
    assert reasons.get("compressor_timeout", 0) >= ROUNDS, reasons


def test_context_tokens_before_exceed_after(monitored, traffic):
    result = _query(monitored.prometheus_url, "sum by (phase) (ray_rag_context_tokens_total)")
    tokens = {series["metric"]["phase"]: float(series["value"][1]) for series in result}
    assert tokens["before"] > tokens["after"] > 0


def test_ingestion_is_counted_by_status_and_outcome_and_version_loads_are_timed(monitored, traffic):
    jobs = _query(
        monitored.prometheus_url, "sum by (action, status) (ray_rag_ingestion_jobs_total)"
    )
    by_status = {(s["metric"]["action"], s["metric"]["status"]): float(s["value"][1]) for s in jobs}
    assert by_status == {("add", "succeeded"): ROUNDS}, by_status
    result = _query(
        monitored.prometheus_url, "sum by (outcome) (ray_rag_ingestion_documents_total)"
    )
    outcomes = {series["metric"]["outcome"]: float(series["value"][1]) for series in result}
    assert outcomes == {"added": 3, "replaced": 1, "unreadable": ROUNDS}, outcomes
    for expr in (
        "sum(ray_rag_collection_version_loads_total)",
        "sum(ray_rag_collection_version_load_ms_count)",
        "sum(ray_rag_ingestion_queue_seconds_count)",
    ):
        result = _query(monitored.prometheus_url, expr)
        assert result and float(result[0]["value"][1]) == ROUNDS, f"{expr}: {result}"


def test_panels_render_from_the_same_queries(monitored, traffic, tmp_path):
    from monitoring import render

    out = Path(os.environ.get("MONITORING_SCREENSHOT") or tmp_path / "panels.png")
    render.main(["--prometheus", monitored.prometheus_url, "--minutes", "5", "--out", str(out)])
    assert out.stat().st_size > 10_000
