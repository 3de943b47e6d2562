"""The application builder: the composition root, and the only place that wires deployments.

`serve run serve_config.yaml` / `serve deploy` call `build_app(args)` with the config's
`args:`. It validates them, logs the resolved config once, computes every deployment's
options from it, and binds ingress -> retriever, compressor, generator (and the collection
writer, when collections are on). Nothing imports this
package but the serve config (and its tests).
"""

from __future__ import annotations

import json
from typing import Any

from ray import serve
from ray.serve.deployment import Application

from app.config import parse_config
from app.settings import load_settings
from generation.config import GeneratorConfig
from pipeline.config_base import PROJECT_ROOT, ServeOptions
from pipeline.log import get_logger
from prepare.config import CompressionConfig
from retrieval.models import resolve_model_reference

logger = get_logger(__name__)

PREFIX_CACHE_AFFINITY_ROUTER = "ray.serve.llm.request_router.PrefixCacheAffinityRouter"
PASSAGE_AFFINITY_ROUTER = "deployments.passage_router.PassageAffinityRouter"
CONVERSATION_AFFINITY_ROUTER = "deployments.conversation_router.ConversationAffinityRouter"


def build_app(args: dict[str, Any] | None = None) -> Application:
    """Validate `args` into the config tree and return the bound RAG application."""
    config = parse_config(args)
    load_settings()  # refuse an unsafe production setup before anything starts
    logger.info("RAG application config: %s", json.dumps(config.model_dump(), default=str))
    logger.info("ingress admits %d requests in flight per replica", config.in_flight_limit())

    from deployments.compressor import CompressorDeployment
    from deployments.ingress import RagIngress
    from deployments.retriever import RetrieverDeployment

    retry_after_s = config.ingress.retry_after_s
    retriever = serve.deployment(
        RetrieverDeployment,
        name="Retriever",
        **deployment_options(config.retriever.deployment, retry_after_s),
    ).bind(config.retriever, config.collections)
    compressor = serve.deployment(
        CompressorDeployment,
        name="Compressor",
        **compressor_options(config.compression, retry_after_s),
    ).bind(config)
    generator = build_generator(config.generator, retry_after_s)
    writer = None
    if config.collections.enabled:
        from deployments.collection_writer import CollectionWriterDeployment

        writer = serve.deployment(
            CollectionWriterDeployment,
            name="CollectionWriter",
            **deployment_options(config.collections.deployment, retry_after_s),
        ).bind(config)
    return serve.deployment(
        RagIngress,
        name="RagIngress",
        **deployment_options(config.ingress.deployment, retry_after_s),
    ).bind(config, retriever, compressor, generator, writer)


def deployment_options(options: ServeOptions, retry_after_s: float = 1.0) -> dict[str, Any]:
    """Ray Serve options for one stage: the config's, passed through (Serve validates them),
    and a full queue answering 503 with Retry-After unless they say otherwise."""
    backpressure = {"status_code": 503, "retry_after_s": retry_after_s}
    return {"backpressure_config": backpressure, **options}


def router_config(router_class: str, **kwargs: Any) -> dict[str, Any]:
    """A deployment's `request_router_config`: the router's import path and its kwargs."""
    return {"request_router_class": router_class, "request_router_kwargs": kwargs}


def compressor_options(
    compression: CompressionConfig, retry_after_s: float = 1.0
) -> dict[str, Any]:
    """The compressor's Serve options: its replicas', and the conversation router if set."""
    options = deployment_options(compression.deployment, retry_after_s)
    router = compression.request_router
    if router.kind == "conversation_affinity":
        options["request_router_config"] = router_config(
            CONVERSATION_AFFINITY_ROUTER, max_queue_gap=router.imbalanced_threshold
        )
    return options


def build_generator(generator: GeneratorConfig, retry_after_s: float = 1.0) -> Application:
    """vLLM inside Ray (Ray Serve LLM's LLMServer), or a plain deployment around an engine
    elsewhere (an OpenAI-compatible server) or the null engine."""
    if generator.engine != "vllm":
        from deployments.engine_generator import EngineGeneratorDeployment

        if unused := vllm_only_settings(generator):
            logger.warning(
                "generator.engine %s ignores generator.%s (vLLM-in-Ray settings)",
                generator.engine,
                ", generator.".join(unused),
            )

        return serve.deployment(
            EngineGeneratorDeployment,
            name="Generator",
            **deployment_options(generator.deployment, retry_after_s),
        ).bind(generator)

    from ray.serve.llm import LLMConfig, build_llm_deployment

    from deployments.generator import GeneratorServer

    return build_llm_deployment(
        LLMConfig(**generator_llm_config(generator, retry_after_s)),
        deployment_cls=GeneratorServer,
        bind_kwargs={
            "stream_batching_interval_ms": generator.stream_batching_interval_ms,
            "cpu_binding": generator.cpu_binding,
            "weights": generator.weights,
        },
        override_serve_options={"name": "Generator"},
    )


def generator_llm_config(generator: GeneratorConfig, retry_after_s: float = 1.0) -> dict[str, Any]:
    """The `ray.serve.llm.LLMConfig` fields for the generator, as a plain dict.

    GPUs are not asked through ray_actor_options: vLLM's placement group holds one GPU per
    tensor-parallel worker (or the bundles given in config, e.g. [{CPU: 1}] on CPU), and
    the actor itself reserves no CPU by default.
    """
    deployment = deployment_options(generator.deployment, retry_after_s)
    router = generator.request_router
    if router.kind == "prefix_cache_affinity":
        kwargs: dict[str, Any] = {}  # Ray Serve LLM's own match_rate_threshold (0.1)
        if router.imbalanced_threshold is not None:
            kwargs["imbalanced_threshold"] = router.imbalanced_threshold
        deployment["request_router_config"] = router_config(PREFIX_CACHE_AFFINITY_ROUTER, **kwargs)
    elif router.kind == "passage_affinity":
        deployment["request_router_config"] = router_config(
            PASSAGE_AFFINITY_ROUTER, max_queue_gap=router.imbalanced_threshold
        )
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


# The GeneratorConfig fields that only the vLLM engine inside Ray reads.
VLLM_ONLY_FIELDS = ("engine_kwargs", "placement_bundles", "env_vars", "accelerator_type",
                    "cpu_binding", "weights")  # fmt: skip


def vllm_only_settings(generator: GeneratorConfig) -> list[str]:
    """The vLLM-in-Ray settings `generator` sets beyond their defaults, which another engine
    ignores."""
    defaults = GeneratorConfig.model_fields
    return [name for name in VLLM_ONLY_FIELDS if getattr(generator, name) != defaults[name].default]
