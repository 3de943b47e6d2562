"""The application builder: the only place that wires deployments together.

`serve run serve_config.yaml` / `serve deploy` call `build_app(args)` with the config's
`args:`. It validates them, logs the resolved config once, computes every deployment's
options from it, and binds ingress -> retriever, compressor, generator.
"""

from __future__ import annotations

import json
from typing import Any

from ray import serve
from ray.serve.deployment import Application

from app.config import PROJECT_ROOT, GeneratorConfig, ReplicaConfig, parse_config
from app.log import get_logger
from app.settings import load_settings
from retrieval.models import resolve_model_reference

logger = get_logger(__name__)


def build_app(args: dict[str, Any] | None = None) -> Application:
    """Validate `args` into the config tree and return the bound RAG application."""
    config = parse_config(args)
    load_settings()  # refuse an unsafe production setup before anything starts
    logger.info("RAG application config: %s", json.dumps(config.model_dump(), default=str))

    from deployments.compressor import CompressorDeployment
    from deployments.ingress import RagIngress
    from deployments.retriever import RetrieverDeployment

    retriever = serve.deployment(
        RetrieverDeployment, name="Retriever", **deployment_options(config.retriever.deployment)
    ).bind(config.retriever)
    compressor = serve.deployment(
        CompressorDeployment,
        name="Compressor",
        **deployment_options(config.compression.deployment),
    ).bind(config.compression, config.generator, config.prompt)
    generator = _build_generator(config.generator)
    return serve.deployment(
        RagIngress, name="RagIngress", **deployment_options(config.ingress.deployment)
    ).bind(config, retriever, compressor, generator)


def deployment_options(replica: ReplicaConfig) -> dict[str, Any]:
    """Ray Serve options for one stage: replicas or autoscaling, resources, queue limits."""
    options: dict[str, Any] = {
        "max_ongoing_requests": replica.max_ongoing_requests,
        "max_queued_requests": replica.max_queued_requests,
        "ray_actor_options": {"num_cpus": replica.num_cpus, "num_gpus": replica.num_gpus},
    }
    if replica.autoscaling is not None:
        options["autoscaling_config"] = replica.autoscaling.model_dump()
    else:
        options["num_replicas"] = replica.num_replicas
    return options


def generator_llm_config(generator: GeneratorConfig) -> dict[str, Any]:
    """The `ray.serve.llm.LLMConfig` fields for the generator, as a plain dict.

    GPUs are not asked through ray_actor_options: vLLM's placement group holds one GPU per
    tensor-parallel worker (or the bundles given in config, e.g. [{CPU: 1}] on CPU).
    """
    deployment = deployment_options(generator.deployment)
    deployment["ray_actor_options"] = {"num_cpus": generator.deployment.num_cpus}
    llm_config: dict[str, Any] = {
        "model_loading_config": {
            "model_id": generator.model_id,
            "model_source": resolve_model_reference(generator.model_source, PROJECT_ROOT),
        },
        "engine_kwargs": {**generator.engine_kwargs, "max_model_len": generator.max_model_len},
        "deployment_config": deployment,
        "log_engine_metrics": True,
    }
    if generator.accelerator_type:
        llm_config["accelerator_type"] = generator.accelerator_type
    if generator.placement_bundles:
        llm_config["placement_group_config"] = {"bundles": generator.placement_bundles}
    if generator.env_vars:
        llm_config["runtime_env"] = {"env_vars": dict(generator.env_vars)}
    return llm_config


def _build_generator(generator: GeneratorConfig) -> Application:
    from ray.serve.llm import LLMConfig, build_llm_deployment

    from deployments.generator import GeneratorServer

    return build_llm_deployment(
        LLMConfig(**generator_llm_config(generator)),
        deployment_cls=GeneratorServer,
        override_serve_options={"name": "Generator"},
    )
