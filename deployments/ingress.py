"""Ingress stage: the FastAPI app, wired to the other stages through their handles."""

from __future__ import annotations

import time

from fastapi import FastAPI
from ray import serve
from ray.serve.handle import DeploymentHandle

from app.api import ApiState, create_api
from app.config import RagAppConfig
from app.log import get_logger
from app.metrics import PipelineMetrics
from app.pipeline import RagPipeline
from app.readiness import Readiness
from app.settings import load_settings
from app.stages import HandleStages

logger = get_logger(__name__)


@serve.ingress()
class RagIngress:
    def __init__(
        self,
        config: RagAppConfig,
        retriever: DeploymentHandle,
        compressor: DeploymentHandle,
        generator: DeploymentHandle,
    ) -> None:
        settings = load_settings()
        stages = HandleStages(retriever, compressor, generator)

        async def retriever_ready() -> object:
            return await retriever.ready.remote()

        async def compressor_ready() -> object:
            return await compressor.ready.remote()

        async def generator_ready() -> object:
            return await generator.check_health.remote()

        readiness = Readiness(
            {
                "retriever": retriever_ready,
                "compressor": compressor_ready,
                "generator": generator_ready,
            },
            timeout_s=config.ingress.readiness_timeout_s,
        )
        self._state = ApiState(
            pipeline=RagPipeline(stages, PipelineMetrics()),
            config=config,
            settings=settings,
            readiness=readiness,
            started_at=int(time.time()),
        )
        logger.info("ingress ready (auth %s)", "on" if settings.auth_required else "off")

    def __serve_build_asgi_app__(self) -> FastAPI:
        """Serve calls this after the constructor: the app is built around this replica's state."""
        return create_api(self._state)
