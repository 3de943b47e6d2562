"""The dashboard against real data: the real service, scraped by a real Prometheus.

The module uses the session's shared service (tests/services.py, its Ray instance in a temp
dir of its own, so the discovery file is this service's), retuned for the module through
the ingress's user_config (a short compressor timeout, a per-key rate limit), and starts
Debian's Prometheus with monitoring/prometheus.yml pointed at it. It sends traffic of every
kind the panels show (answers, streams, compression methods, errors, a compressor timeout
answered degraded, requests past the key's rate limit), and in each round an ingestion job
into a collection of the module's own (a document added, one replaced, an unreadable file)
and a query that opens the collection's new version; it waits for the scrapes, and runs
every panel's PromQL through Prometheus's HTTP API: each must return data, with the
Application filter set to this application. Counts are checked as the increase over the
module's own traffic: other modules use the same service. MONITORING_SCREENSHOT=path
renders the panels from the same queries into a PNG (the docs' picture).
"""

from __future__ import annotations

import math
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import yaml
from services import API_KEY, METRICS_EXPORT_S, SECOND_KEY

from harness.service import ServiceError, free_port, running_server
from monitoring import dashboard, panels
from monitoring.prometheus import config_for, prometheus_argv

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
# The collection traffic's own key: API_KEY's bucket is emptied at the end of every round.
COLLECTIONS_KEY = SECOND_KEY
COLLECTION = "monitoring"
JOB_TIMEOUT_S = 180
# Slower than the rate limit's refill (2 requests/s): polling a job never runs out.
JOB_POLL_S = 0.6
SCRAPE_S = 2.0
RATE_WINDOW = "3m"
PROMETHEUS = shutil.which("prometheus")
SERVE_CONFIG = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
(APPLICATION,) = (app["name"] for app in SERVE_CONFIG["applications"])
# Sentence selection takes tens of ms here and LLMLingua seconds: an LLMLingua request times
# out at the compressor and is answered degraded, the other methods are not.
COMPRESSOR_TIMEOUT_S = 2.0
# Per API key: a round's six keyed requests stay inside the burst, and the pause between
# rounds (BURST / RATE s) refills it; the burst of cheap requests that ends each round goes
# past it.
RATE_LIMIT_BURST = 10
RATE_LIMIT_PER_S = 2.0
TUNING = {
    "compression": {"timeout_s": COMPRESSOR_TIMEOUT_S},
    "ingress": {"rate_limit": {"requests_per_s": RATE_LIMIT_PER_S, "burst": RATE_LIMIT_BURST}},
}
ROUNDS = 2
# The counters the tests below count, by the labels they count them by.
COUNTED = [
    "sum(ray_rag_requests_degraded_total)",
    "sum by (reason) (ray_rag_requests_degraded_total)",
    "sum(ray_rag_request_errors_total)",
    "sum by (status, code) (ray_rag_request_errors_total)",
    'sum(ray_serve_num_http_requests_total{status_code="429"})',
    "sum by (action, status) (ray_rag_ingestion_jobs_total)",
    "sum by (outcome) (ray_rag_ingestion_documents_total)",
    "sum(ray_rag_collection_version_loads_total)",
    "sum(ray_rag_collection_version_load_ms_count)",
    "sum(ray_rag_ingestion_queue_seconds_count)",
]


@dataclass(frozen=True)
class Monitored:
    service_url: str
    prometheus_url: str
    retriever_replicas: int
    # Each COUNTED query -> {labels: value} when the module's traffic began.
    before: dict[str, dict[tuple, float]] = field(default_factory=dict)

    def increase(self, expr: str) -> dict[tuple, float]:
        """What the module's own traffic added to each series of COUNTED `expr`."""
        now = _values(self.prometheus_url, expr)
        earlier = self.before[expr]
        grown = {labels: value - earlier.get(labels, 0.0) for labels, value in now.items()}
        return {labels: value for labels, value in grown.items() if value}

    def increase_of(self, expr: str) -> float:
        return sum(self.increase(expr).values())


@pytest.fixture(scope="module")
def monitored(shared_service, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Monitored]:
    if PROMETHEUS is None:
        pytest.fail("Debian's prometheus package is needed: make prometheus (as root)")
    workdir = tmp_path_factory.mktemp("monitoring")
    ray_tmp = shared_service.running.ray_tmpdir
    prometheus_config = workdir / "prometheus.yml"
    prometheus_config.write_text(yaml.safe_dump(config_for(ray_tmp / "ray", SCRAPE_S)))
    prometheus_port = free_port()
    prometheus_url = f"http://127.0.0.1:{prometheus_port}"
    replicas = shared_service.config["retriever"]["deployment"]["num_replicas"]
    try:
        with (
            shared_service.tuned(TUNING),
            running_server(
                prometheus_argv(PROMETHEUS, prometheus_config, workdir / "data", prometheus_port),
                f"{prometheus_url}/-/ready",
                workdir / "prometheus.log",
                env=dict(os.environ),
                name="prometheus",
                ready_timeout_s=60,
                poll_s=0.5,
            ),
        ):
            yield Monitored(
                shared_service.base_url, prometheus_url, replicas, _settled(prometheus_url)
            )
    except ServiceError as exc:
        pytest.fail(str(exc))


def _values(prometheus_url: str, expr: str) -> dict[tuple, float]:
    return {
        tuple(sorted(series["metric"].items())): float(series["value"][1])
        for series in _query(prometheus_url, expr)
    }


def _settled(prometheus_url: str, timeout_s: float = 60) -> dict[str, dict[tuple, float]]:
    """COUNTED as Prometheus holds them once what came before this module is exported and
    scraped: the same across one export interval and a scrape, after the first scrape of
    every target."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        targets = httpx.get(f"{prometheus_url}/api/v1/targets", timeout=30).json()
        active = targets["data"]["activeTargets"]
        if active and all(target["lastScrape"] > "2000" for target in active):
            break
        time.sleep(0.5)
    previous: dict[str, dict[tuple, float]] | None = None
    while time.monotonic() < deadline:
        current = {expr: _values(prometheus_url, expr) for expr in COUNTED}
        if current == previous:
            return current
        previous = current
        time.sleep(METRICS_EXPORT_S + SCRAPE_S)
    pytest.fail(f"the counters were still changing after {timeout_s} s: {previous}")


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
            emptied_at = time.monotonic()
            assert set(statuses) == {200, 429} and statuses[0] == 200, statuses
            _ingest(collections, round_)
            # This round scraped before the next begins, so rate() sees two increases;
            # and the bucket full again.
            _wait_for(monitored, "sum(ray_rag_request_errors_total)", 4 * (round_ + 1))
            time.sleep(
                max(0.0, emptied_at + RATE_LIMIT_BURST / RATE_LIMIT_PER_S - time.monotonic())
            )
    _wait_for(monitored, "sum(ray_rag_requests_degraded_total)", minimum=ROUNDS)
    _wait_for(monitored, "sum by (status, code) (ray_rag_request_errors_total)", 4 * ROUNDS)
    _wait_for(monitored, 'sum(ray_serve_num_http_requests_total{status_code="429"})', ROUNDS)
    _wait_for(monitored, "sum by (action, status) (ray_rag_ingestion_jobs_total)", ROUNDS)
    _wait_for(monitored, "sum(ray_rag_collection_version_loads_total)", minimum=ROUNDS)
    _wait_for(monitored, "sum(ray_rag_ingestion_queue_seconds_count)", minimum=ROUNDS)


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


def _wait_for(monitored: Monitored, expr: str, minimum: float, timeout_s: float = 90) -> None:
    """Until the module's traffic has added at least `minimum` to COUNTED `expr`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if monitored.increase_of(expr) >= minimum:
            return
        time.sleep(SCRAPE_S / 2)
    pytest.fail(f"Prometheus never saw {expr} grow by {minimum}: {monitored.increase(expr)}")


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


def _label(labels: tuple, name: str) -> str:
    return dict(labels)[name]


def test_error_panel_counts_errors_by_status_and_code(monitored, traffic):
    grown = monitored.increase("sum by (status, code) (ray_rag_request_errors_total)")
    seen = {(_label(k, "status"), _label(k, "code")): value for k, value in grown.items()}
    bad_input = sum(count for (status, _), count in seen.items() if status == "400")
    assert bad_input >= 2, seen
    assert seen.get(("401", "invalid_api_key"), 0) >= 2, seen
    assert seen.get(("404", "not_found_error"), 0) >= 2, seen
    assert seen.get(("429", "rate_limit_exceeded"), 0) >= 2, seen


def test_rejections_are_counted_at_the_ingress_and_the_proxy(monitored, traffic):
    at_ingress = monitored.increase("sum by (status, code) (ray_rag_request_errors_total)")
    at_proxy = monitored.increase_of('sum(ray_serve_num_http_requests_total{status_code="429"})')
    refused = sum(
        value for labels, value in at_ingress.items() if _label(labels, "status") == "429"
    )
    assert refused >= ROUNDS, at_ingress
    assert at_proxy >= ROUNDS, at_proxy


def test_degraded_answers_are_counted_by_reason(monitored, traffic):
    grown = monitored.increase("sum by (reason) (ray_rag_requests_degraded_total)")
    reasons = {_label(labels, "reason"): value for labels, value in grown.items()}
    assert reasons.get("compressor_timeout", 0) >= ROUNDS, reasons


def test_context_tokens_before_exceed_after(monitored, traffic):
    result = _query(monitored.prometheus_url, "sum by (phase) (ray_rag_context_tokens_total)")
    tokens = {series["metric"]["phase"]: float(series["value"][1]) for series in result}
    assert tokens["before"] > tokens["after"] > 0


def test_cached_prompt_tokens_are_counted_by_the_part_of_the_prompt(monitored, traffic):
    # Every answer opens with the same system prompt: from the second on, vLLM has it cached.
    query = "sum by (segment) (ray_rag_cached_prompt_tokens_total)"
    tokens = {
        s["metric"]["segment"]: float(s["value"][1])
        for s in _query(monitored.prometheus_url, query)
    }
    assert tokens.get("system", 0) > 0, tokens
    assert set(tokens) <= {"system", "history", "passages", "question"}, tokens


def test_ingestion_is_counted_by_status_and_outcome_and_version_loads_are_timed(monitored, traffic):
    jobs = monitored.increase("sum by (action, status) (ray_rag_ingestion_jobs_total)")
    by_status = {(_label(k, "action"), _label(k, "status")): value for k, value in jobs.items()}
    assert by_status == {("add", "succeeded"): ROUNDS}, by_status
    documents = monitored.increase("sum by (outcome) (ray_rag_ingestion_documents_total)")
    outcomes = {_label(labels, "outcome"): value for labels, value in documents.items()}
    assert outcomes == {"added": 3, "replaced": 1, "unreadable": ROUNDS}, outcomes
    assert monitored.increase_of("sum(ray_rag_ingestion_queue_seconds_count)") == ROUNDS
    # Each new version is opened once by every retriever replica that serves the
    # collection: the one the round's query reached at least; each opening is timed.
    loads = monitored.increase_of("sum(ray_rag_collection_version_loads_total)")
    timed = monitored.increase_of("sum(ray_rag_collection_version_load_ms_count)")
    assert ROUNDS <= loads <= ROUNDS * monitored.retriever_replicas, loads
    assert timed == loads


def test_panels_render_from_the_same_queries(monitored, traffic, tmp_path):
    from monitoring import render

    out = Path(os.environ.get("MONITORING_SCREENSHOT") or tmp_path / "panels.png")
    render.main(["--prometheus", monitored.prometheus_url, "--minutes", "5", "--out", str(out)])
    assert out.stat().st_size > 10_000
