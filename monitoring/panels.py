"""The dashboard's panels as data: id, title, unit, and PromQL per line.

Every expression is written against Ray's metrics export (application metrics carry a `ray_`
prefix) and every selector filters like Ray's own dashboards: on `$SessionName`, so one
Prometheus can hold several sessions, and on `$Cluster` (the `ray_io_cluster` label KubeRay's
PodMonitor adds; absent on a local scrape, so its "All" is `.*`). Selectors of the metrics that
carry Serve's `application` label filter on `$Application` too; the others (vLLM's engine
metrics) must not, or the filter would empty them. `$__rate_interval` is Grafana's;
`monitoring.dashboard.panel_queries` substitutes every variable for a direct Prometheus query.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SESSION = 'SessionName=~"$SessionName"'
CLUSTER = 'ray_io_cluster=~"$Cluster"'
APPLICATION = 'application=~"$Application"'
RATE = "$__rate_interval"

# Metric families (names without _bucket/_sum/_count) whose series carry `application`:
# deployments/metrics.py records through ray.serve.metrics inside the ingress replica, and
# deployments/collection_metrics.py inside the collection writer and retriever replicas,
# which adds `application`, `deployment` and `replica`; Serve's proxy, routers, replicas and
# controller tag theirs with it. vLLM's engine metrics (ray_vllm_*) go through
# ray.util.metrics and carry none. tests/integration/test_monitoring.py checks this set
# against a real scrape.
APPLICATION_LABELLED = frozenset(
    {
        "ray_rag_stage_latency_ms",
        "ray_rag_tpot_ms",
        "ray_rag_compression_ratio",
        "ray_rag_prompt_tokens_total",
        "ray_rag_cached_prompt_tokens_total",
        "ray_rag_affinity_routed_calls_total",
        "ray_rag_requests_completed_total",
        "ray_rag_context_tokens_total",
        "ray_rag_request_errors_total",
        "ray_rag_requests_degraded_total",
        "ray_rag_ingestion_jobs_total",
        "ray_rag_ingestion_job_seconds",
        "ray_rag_ingestion_queue_seconds",
        "ray_rag_ingestion_documents_total",
        "ray_rag_collection_version_loads_total",
        "ray_rag_collection_version_load_ms",
        "ray_serve_num_http_requests_total",
        "ray_serve_deployment_replica_healthy",
        "ray_serve_deployment_queued_queries",
        "ray_serve_replica_processing_queries",
        "ray_serve_deployment_processing_latency_ms",
    }
)
_HISTOGRAM_SERIES = re.compile(r"_(bucket|sum|count)$")


def family(metric: str) -> str:
    """A metric's family name: a histogram's `_bucket`, `_sum` or `_count` taken off."""
    return metric if metric in APPLICATION_LABELLED else _HISTOGRAM_SERIES.sub("", metric)


def carries_application(metric: str) -> bool:
    return family(metric) in APPLICATION_LABELLED


def selector(metric: str, *matchers: str) -> str:
    """`metric{...}` with the dashboard's filters (session, cluster, application where the
    metric carries it) before `matchers`."""
    filters = [SESSION, CLUSTER, *([APPLICATION] if carries_application(metric) else [])]
    return f"{metric}{{{','.join([*filters, *matchers])}}}"


@dataclass(frozen=True)
class Line:
    expr: str
    legend: str


@dataclass(frozen=True)
class PanelSpec:
    # Grafana's panel id: unique in the dashboard and kept when panels move (links such as
    # `viewPanel=<id>` point at it), so it is written here, never derived from the order.
    panel_id: int
    title: str
    description: str
    unit: str
    lines: tuple[Line, ...]


@dataclass(frozen=True)
class RowSpec:
    row_id: int
    title: str
    panels: tuple[PanelSpec, ...]


def _quantiles(metric: str, by: str, scale: str = "") -> tuple[Line, ...]:
    """p50/p95/p99 of a Ray histogram, per `by` label."""
    return tuple(
        Line(
            f"histogram_quantile({q}, sum by (le, {by}) "
            f"(rate({selector(f'{metric}_bucket')}[{RATE}]))){scale}",
            f"p{int(q * 100)} {{{{{by}}}}}",
        )
        for q in (0.5, 0.95, 0.99)
    )


def _stage_quantiles(stages: str) -> tuple[Line, ...]:
    stage = f'stage=~"{stages}"'
    return tuple(
        Line(
            f"histogram_quantile({q}, sum by (le, stage) (rate("
            f"{selector('ray_rag_stage_latency_ms_bucket', stage)}[{RATE}])))",
            f"p{int(q * 100)} {{{{stage}}}}",
        )
        for q in (0.5, 0.95, 0.99)
    )


def _rate(metric: str, *matchers: str) -> str:
    return f"rate({selector(metric, *matchers)}[{RATE}])"


INGRESS = RowSpec(
    100,
    "Ingress: requests and errors",
    (
        PanelSpec(
            101,
            "Requests by status",
            "HTTP requests per second through Serve's proxy, by status code.",
            "reqps",
            (
                Line(
                    f"sum by (status_code) ({_rate('ray_serve_num_http_requests_total')})",
                    "{{status_code}}",
                ),
            ),
        ),
        PanelSpec(
            102,
            "Errors by status and code",
            "Error responses per second by HTTP status and OpenAI error code "
            "(rag_request_errors: every error the API sends).",
            "reqps",
            (
                Line(
                    f"sum by (status, code) ({_rate('ray_rag_request_errors_total')})",
                    "{{status}} {{code}}",
                ),
            ),
        ),
        PanelSpec(
            103,
            "Answers completed and degraded",
            "Requests answered in full, and those answered with the uncompressed context "
            "against their plan (the compressor timed out, was at capacity or down).",
            "reqps",
            (
                Line(f"sum({_rate('ray_rag_requests_completed_total')})", "completed"),
                Line(
                    f"sum by (reason) ({_rate('ray_rag_requests_degraded_total')})",
                    "degraded {{reason}}",
                ),
            ),
        ),
        PanelSpec(
            104,
            "End-to-end latency",
            "Whole request as the ingress sees it (stage 'total').",
            "ms",
            _stage_quantiles("total"),
        ),
    ),
)

RETRIEVER = RowSpec(
    200,
    "Retriever and compressor",
    (
        PanelSpec(
            201,
            "Stage latency: retrieve and compress",
            "The stages' own work, p50/p95/p99.",
            "ms",
            _stage_quantiles("retrieve|compress"),
        ),
        PanelSpec(
            202,
            "Hop overheads: queue and network",
            "Waiting for a replica and transport between the stages.",
            "ms",
            _stage_quantiles("queue|network"),
        ),
        PanelSpec(
            203,
            "Compression ratio",
            "Context tokens after / before, by method (p50, and the mean).",
            "percentunit",
            (
                Line(
                    f"histogram_quantile(0.5, sum by (le, method) "
                    f"({_rate('ray_rag_compression_ratio_bucket')}))",
                    "p50 {{method}}",
                ),
                Line(
                    f"sum by (method) ({_rate('ray_rag_compression_ratio_sum')})"
                    f" / sum by (method) ({_rate('ray_rag_compression_ratio_count')})",
                    "mean {{method}}",
                ),
            ),
        ),
        PanelSpec(
            204,
            "Context tokens before and after compression",
            "Retrieved-context tokens per second entering and leaving the compressor.",
            "short",
            (
                Line(
                    f"sum by (phase) ({_rate('ray_rag_context_tokens_total')})",
                    "{{phase}}",
                ),
            ),
        ),
    ),
)

KEPT_ON_KEY = 'outcome="kept"'

GENERATOR = RowSpec(
    300,
    "Generator (vLLM)",
    (
        PanelSpec(
            301,
            "TTFT",
            "Time to first token: as the ingress sees it (stage 'ttft') and inside vLLM.",
            "ms",
            (
                *_stage_quantiles("ttft"),
                *(
                    Line(line.expr, f"vLLM {line.legend}")
                    for line in _quantiles(
                        "ray_vllm_time_to_first_token_seconds", "model_name", " * 1000"
                    )
                ),
            ),
        ),
        PanelSpec(
            302,
            "TPOT",
            "Mean time per output token after the first: per request (rag_tpot_ms) and "
            "inside vLLM.",
            "ms",
            (
                *_quantiles("ray_rag_tpot_ms", "Component"),
                Line(
                    f"histogram_quantile(0.5, sum by (le) ("
                    f"{_rate('ray_vllm_request_time_per_output_token_seconds_bucket')})) * 1000",
                    "vLLM p50",
                ),
            ),
        ),
        PanelSpec(
            303,
            "Prefix-cache hit rate",
            "Prompt tokens found in vLLM's prefix cache / prompt tokens looked up; and the "
            "cached share of the prompts the pipeline sent.",
            "percentunit",
            (
                Line(
                    f"sum({_rate('ray_vllm_prefix_cache_hits_total')}) / "
                    f"sum({_rate('ray_vllm_prefix_cache_queries_total')})",
                    "vLLM hits / queries",
                ),
                Line(
                    f"sum({_rate('ray_rag_cached_prompt_tokens_total')}) / "
                    f"sum({_rate('ray_rag_prompt_tokens_total')})",
                    "cached / prompt tokens",
                ),
            ),
        ),
        PanelSpec(
            306,
            "Prefix-cache reuse by prompt part",
            "Cached prompt tokens by the part of the prompt they came from (system prompt, "
            "earlier turns, retrieved passages, question), as a share of all prompt tokens "
            "the pipeline sent: passages rise above zero only when prompts share them in "
            "the same place (compression.reuse).",
            "percentunit",
            (
                Line(
                    f"sum by (segment) ({_rate('ray_rag_cached_prompt_tokens_total')}) / "
                    f"scalar(sum({_rate('ray_rag_prompt_tokens_total')}))",
                    "{{segment}}",
                ),
            ),
        ),
        PanelSpec(
            307,
            "Calls kept on their key's replica",
            "Affinity routers (generator.request_router.kind: passage_affinity, "
            "compression.request_router.kind: conversation_affinity), by stage: the share of "
            "keyed calls placed on the replica their key prefers. The rest were moved by load, "
            "each a likely miss: of the prefix cache at the generator, of the remembered "
            "conversation at the compressor. No series for a stage with one replica or "
            "another router.",
            "percentunit",
            (
                Line(
                    "sum by (stage) ("
                    f"{_rate('ray_rag_affinity_routed_calls_total', KEPT_ON_KEY)}) / "
                    f"sum by (stage) ({_rate('ray_rag_affinity_routed_calls_total')})",
                    "{{stage}}",
                ),
            ),
        ),
        PanelSpec(
            304,
            "Tokens per second",
            "Prompt and generated tokens per second across the generator replicas.",
            "short",
            (
                Line(f"sum({_rate('ray_vllm_prompt_tokens_total')})", "prompt"),
                Line(f"sum({_rate('ray_vllm_generation_tokens_total')})", "generated"),
            ),
        ),
        PanelSpec(
            305,
            "vLLM KV-cache usage",
            "Peak share of the paged KV cache in use over the interval, per engine. The "
            "engine sets this gauge only while it steps, so an idle engine has no fresh "
            "sample: the peak over the interval keeps the panel from going blank.",
            "percentunit",
            (
                Line(
                    f"max by (ReplicaId) (max_over_time("
                    f"{selector('ray_vllm_kv_cache_usage_perc')}[{RATE}]))",
                    "{{ReplicaId}}",
                ),
            ),
        ),
    ),
)

REFUSED_STATUS = 'status=~"429|503"'
REFUSED_STATUS_CODE = 'status_code=~"429|503"'

SERVE = RowSpec(
    400,
    "Serve: replicas, queues and rejections",
    (
        PanelSpec(
            401,
            "Replicas per deployment",
            "Healthy replicas of each deployment.",
            "short",
            (
                Line(
                    f"sum by (deployment) ({selector('ray_serve_deployment_replica_healthy')})",
                    "{{deployment}}",
                ),
            ),
        ),
        PanelSpec(
            402,
            "Queue depth",
            "Requests waiting for a replica (at the callers' handles) and being processed "
            "(at the replicas), per deployment.",
            "short",
            (
                Line(
                    f"sum by (deployment) ({selector('ray_serve_deployment_queued_queries')})",
                    "queued {{deployment}}",
                ),
                Line(
                    f"sum by (deployment) ({selector('ray_serve_replica_processing_queries')})",
                    "processing {{deployment}}",
                ),
            ),
        ),
        PanelSpec(
            403,
            "Rejections",
            "Requests refused at once: the ingress's admission (overloaded, not_ready, "
            "rate_limited) and full Serve queues (503/429 at the proxy).",
            "reqps",
            (
                Line(
                    f"sum by (code) ({_rate('ray_rag_request_errors_total', REFUSED_STATUS)})",
                    "ingress {{code}}",
                ),
                Line(
                    f"sum by (status_code) ("
                    f"{_rate('ray_serve_num_http_requests_total', REFUSED_STATUS_CODE)})",
                    "proxy {{status_code}}",
                ),
            ),
        ),
        PanelSpec(
            404,
            "Deployment processing latency",
            "Time each deployment's replicas spend on a request, p95.",
            "ms",
            (
                Line(
                    f"histogram_quantile(0.95, sum by (le, deployment) ("
                    f"{_rate('ray_serve_deployment_processing_latency_ms_bucket')}))",
                    "p95 {{deployment}}",
                ),
            ),
        ),
    ),
)

COLLECTIONS = RowSpec(
    500,
    "Collections: ingestion and version loads",
    (
        PanelSpec(
            501,
            "Ingestion jobs by status",
            "Ingestion jobs finished per second at the collection writer, by status and "
            "action (add, delete). Not per collection: names are unbounded.",
            "ops",
            (
                Line(
                    f"sum by (status, action) ({_rate('ray_rag_ingestion_jobs_total')})",
                    "{{status}} {{action}}",
                ),
            ),
        ),
        PanelSpec(
            502,
            "Ingestion job duration",
            "How long jobs ran (started to finished), p50/p95 by action, and how long they "
            "waited in the writer's queue before starting, p95.",
            "s",
            (
                *(
                    Line(
                        f"histogram_quantile({q}, sum by (le, action) ("
                        f"{_rate('ray_rag_ingestion_job_seconds_bucket')}))",
                        f"p{int(q * 100)} {{{{action}}}}",
                    )
                    for q in (0.5, 0.95)
                ),
                Line(
                    f"histogram_quantile(0.95, sum by (le) ("
                    f"{_rate('ray_rag_ingestion_queue_seconds_bucket')}))",
                    "p95 queued",
                ),
            ),
        ),
        PanelSpec(
            503,
            "Documents ingested by outcome",
            "Documents per second in finished jobs: added, replaced, deleted, unreadable "
            "(skipped, reported in the job's errors), not_found (a delete of no document).",
            "short",
            (
                Line(
                    f"sum by (outcome) ({_rate('ray_rag_ingestion_documents_total')})",
                    "{{outcome}}",
                ),
            ),
        ),
        PanelSpec(
            504,
            "Version load time",
            "Time a retriever replica took to open a collection's newly published version, "
            "p95: mostly in the background; a query waits for it only when it arrives "
            "before the background opening (every 0.5 s: VERSION_REFRESH_S).",
            "ms",
            (
                Line(
                    f"histogram_quantile(0.95, sum by (le) ("
                    f"{_rate('ray_rag_collection_version_load_ms_bucket')}))",
                    "p95 load",
                ),
            ),
        ),
    ),
)

ROWS = (INGRESS, RETRIEVER, GENERATOR, SERVE, COLLECTIONS)
