"""Ingress deployment: the FastAPI app, wired to the other stages through their handles.

Readiness comes from Serve's own view of the application (how many replicas of each stage
are running), refreshed in the background, never from calls that queue behind requests.
The ingress also keeps a prompt preparer of its own, with no compressor, for the requests
the compressor stage cannot take (the uncompressed context cut to the token budget) and to
cut a conversation's history before a rewrite.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI
from ray import serve
from ray.serve.handle import DeploymentHandle

from app.admission import InFlightGate, KeyRateLimiter
from app.api import ApiState, create_api
from app.config import RagAppConfig
from app.proxy_guard import PROXY_CALLBACK, PROXY_CALLBACK_ENV
from app.readiness import ReadinessMonitor, ReplicaCounts
from app.settings import load_settings
from app.tuning import tuned
from deployments.collection_handles import HandleCollections
from deployments.handles import HandleStages
from deployments.metrics import PipelineMetrics
from pipeline.config_base import PROJECT_ROOT
from pipeline.log import get_logger
from pipeline.rag import RagPipeline
from prepare.preparation import PromptPreparer
from retrieval.models import model_name, resolve_model_reference

logger = get_logger(__name__)

# Deployment name -> the stage it serves.
STAGE_OF_DEPLOYMENT = {
    "Retriever": "retriever",
    "Compressor": "compressor",
    "Generator": "generator",
    "CollectionWriter": "writer",
    "RagIngress": "ingress",
}


@serve.ingress()
class RagIngress:
    def __init__(
        self,
        config: RagAppConfig,
        retriever: DeploymentHandle,
        compressor: DeploymentHandle,
        generator: DeploymentHandle,
        writer: DeploymentHandle | None = None,
    ) -> None:
        """`writer` is the collection writer (None: collections are off)."""
        settings = load_settings()
        self._built_with = config
        readiness = ReadinessMonitor(
            _running_replicas,
            required=("retriever", "generator"),
            # Without the writer, queries go on; only the collections routes answer 503.
            optional=("compressor", "writer") if writer is not None else ("compressor",),
        )

        def available(stage: str) -> bool:
            # Until the first report, let calls go: Serve's own queue decides.
            report = readiness.report
            return report.checked_at is None or report.stages.get(stage) == "ready"

        metrics = PipelineMetrics()
        stages = HandleStages(retriever, compressor, generator, available)
        limit = config.ingress.rate_limit
        self._state = ApiState(
            pipeline=_pipeline(config, stages, metrics),
            config=config,
            settings=settings,
            readiness=readiness,
            started_at=int(time.time()),
            gate=InFlightGate(config.in_flight_limit()),
            rate_limiter=KeyRateLimiter(limit.requests_per_s, limit.burst) if limit else None,
            serve_request_id=_serve_request_id,
            count_error=metrics.observe_error,
            collections=HandleCollections(writer, available) if writer is not None else None,
            embeddings=stages,
            embedding_model_id=model_name(config.retriever.embedding.model),
        )
        _warn_without_the_proxy_check(settings.auth_required)
        logger.info(
            "ingress ready (auth %s, %d requests in flight at most)",
            "on" if settings.auth_required else "off",
            self._state.gate.limit,
        )

    def reconfigure(self, user_config: dict) -> None:
        """Serve's user_config: ingress-only settings (app.tuning) applied in place, on top
        of the config this replica was built with; a bad key fails the update, naming it."""
        config = tuned(self._built_with, user_config)
        self._state.retune(config)
        logger.info(
            "ingress retuned by user_config %s (%d requests in flight at most)",
            user_config,
            self._state.gate.limit,
        )

    def __serve_build_asgi_app__(self) -> FastAPI:
        """Serve calls this after the constructor: the app is built around this replica's state."""
        return create_api(self._state)


async def _running_replicas() -> ReplicaCounts:
    """Running replicas per stage of this application, as Serve's controller reports them."""
    app_name = serve.get_replica_context().app_name
    status = await asyncio.to_thread(serve.status)
    application = status.applications.get(app_name)
    if application is None:
        return {}
    return replica_counts(application.deployments)


def replica_counts(deployments: Mapping[str, Any]) -> dict[str, int]:
    """Running replicas per stage from Serve's deployment statuses. The ingress counts at
    least the replica asking: the controller marks a replica RUNNING a moment after it
    starts answering, and a /readyz that says "ingress: 0" while it answers is wrong."""
    counts = {
        STAGE_OF_DEPLOYMENT[name]: int(deployment.replica_states.get("RUNNING", 0))
        for name, deployment in deployments.items()
        if name in STAGE_OF_DEPLOYMENT
    }
    if "ingress" in counts:
        counts["ingress"] = max(counts["ingress"], 1)
    return counts


def _serve_request_id() -> str | None:
    from ray.serve.context import _get_serve_request_context

    return _get_serve_request_context().request_id or None


def _pipeline(config: RagAppConfig, stages: HandleStages, metrics: PipelineMetrics) -> RagPipeline:
    """The request pipeline over the stages' handles, with its fallback preparer: the
    uncompressed context cut to the budget when the compressor cannot answer, and the
    history cut to its budget before retrieval."""
    fallback = PromptPreparer.load(
        resolve_model_reference(config.generator.tokenizer_source(), PROJECT_ROOT),
        config.prompt.system_prompts(),
        config.generator.max_model_len,
        config.preparation_options(),
    )
    return RagPipeline(
        stages,
        fallback=fallback,
        compressor_timeout_s=config.compression.timeout_s,
        metrics=metrics,
        conversation=config.conversation.to_settings(),
        attribution_timeout_s=config.citations.timeout_s,
    )


def _warn_without_the_proxy_check(auth_required: bool) -> None:
    if auth_required and os.environ.get(PROXY_CALLBACK_ENV) != PROXY_CALLBACK:
        logger.warning(
            "API keys are checked in the ingress only: Serve's proxy reads each request's "
            "body before the ingress sees it. Start the cluster with %s=%s",
            PROXY_CALLBACK_ENV,
            PROXY_CALLBACK,
        )
