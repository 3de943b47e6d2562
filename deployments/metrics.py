"""Per-request figures as Ray Serve metrics (Prometheus via Ray's metrics export)."""

from __future__ import annotations

from pipeline.rag import RagResult

_LATENCY_BOUNDARIES_MS = [5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000]
_TPOT_BOUNDARIES_MS = [5, 10, 20, 30, 50, 75, 100, 150, 250, 500, 1000]
_RATIO_BOUNDARIES = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]


def error_counter():  # -> ray.serve.metrics.Counter (imported in the worker, as below)
    """The API's error responses, by HTTP status and OpenAI error code: counted by the
    ingress for what it answers and by Serve's proxy for what it answers itself
    (deployments.proxy_callback); the proxy's series carry no replica tags."""
    from ray.serve import metrics

    return metrics.Counter(
        "rag_request_errors",
        description="Error responses sent, by HTTP status and OpenAI error code.",
        tag_keys=("status", "code"),
    )


def affinity_calls_counter():  # -> ray.serve.metrics.Counter
    """Keyed calls the affinity routers (deployments.affinity_router) placed, by stage and by
    outcome: "kept" on the replica their key prefers, or "moved" off it by load (the queue
    gap, or the preferred replica refusing the call). Recorded where the router runs, in the
    ingress replicas."""
    from ray.serve import metrics

    return metrics.Counter(
        "rag_affinity_routed_calls",
        description="Keyed calls placed by the affinity routers, by stage and by whether "
        "they went to their key's replica (kept) or load moved them (moved).",
        tag_keys=("stage", "outcome"),
    )


class PipelineMetrics:
    """The pipeline's MetricsSink; created inside the ingress replica (Ray metrics need a
    running worker)."""

    def __init__(self) -> None:
        from ray.serve import metrics

        self._stage_ms = metrics.Histogram(
            "rag_stage_latency_ms",
            description="Wall time of each pipeline stage seen by the ingress.",
            boundaries=_LATENCY_BOUNDARIES_MS,
            tag_keys=("stage",),
        )
        self._tpot_ms = metrics.Histogram(
            "rag_tpot_ms",
            description="Mean time per output token after the first.",
            boundaries=_TPOT_BOUNDARIES_MS,
        )
        self._compression_ratio = metrics.Histogram(
            "rag_compression_ratio",
            description="Context tokens after compression / before.",
            boundaries=_RATIO_BOUNDARIES,
            tag_keys=("method",),
        )
        self._prompt_tokens = metrics.Counter(
            "rag_prompt_tokens", description="Prompt tokens sent to the generator."
        )
        self._cached_tokens = metrics.Counter(
            "rag_cached_prompt_tokens",
            description="Prompt tokens served from vLLM's prefix cache, by the part of the "
            "prompt they came from (system, history, passages, question; unknown where the "
            "prompt's parts were not counted).",
            tag_keys=("segment",),
        )
        self._completed = metrics.Counter(
            "rag_requests_completed", description="Requests answered in full."
        )
        self._context_tokens = metrics.Counter(
            "rag_context_tokens",
            description="Retrieved-context tokens before and after compression.",
            tag_keys=("phase",),
        )
        self._errors = error_counter()
        self._degraded = metrics.Counter(
            "rag_requests_degraded",
            description="Requests answered with the uncompressed context against their plan.",
            tag_keys=("reason",),
        )

    def observe(self, result: RagResult) -> None:
        for stage, value in (
            ("retrieve", result.retrieve.own_ms),
            ("compress", result.prepare.own_ms),
            ("queue", result.queue_ms),
            ("network", result.network_ms),
            ("ttft", result.ttft_ms),
            ("total", result.total_ms),
        ):
            self._stage_ms.observe(value, tags={"stage": stage})
        if result.rewrite_ms:
            self._stage_ms.observe(result.rewrite_ms, tags={"stage": "rewrite"})
        if result.attribute is not None:
            self._stage_ms.observe(result.attribute_ms, tags={"stage": "attribute"})
        if result.tpot_ms is not None:
            self._tpot_ms.observe(result.tpot_ms)
        prepared = result.prepared
        if prepared.context_tokens_before:
            self._compression_ratio.observe(
                prepared.context_tokens_after / prepared.context_tokens_before,
                tags={"method": prepared.method},
            )
        for phase, tokens in (
            ("before", prepared.context_tokens_before),
            ("after", prepared.context_tokens_after),
        ):
            if tokens:
                self._context_tokens.inc(tokens, tags={"phase": phase})
        if prepared.degraded:
            self._degraded.inc(tags={"reason": prepared.degraded})
        # Ray counters reject increments of zero.
        usage = result.usage
        if usage.prompt_tokens:
            self._prompt_tokens.inc(usage.prompt_tokens)
        split: dict[str, int] = {"unknown": usage.cached_tokens}
        if (by_segment := result.cached_by_segment) is not None:
            split = {str(segment): tokens for segment, tokens in by_segment.items()}
        for segment, tokens in split.items():
            if tokens:
                self._cached_tokens.inc(tokens, tags={"segment": segment})
        self._completed.inc()

    def observe_error(self, status: int, code: str) -> None:
        self._errors.inc(tags={"status": str(status), "code": code})
