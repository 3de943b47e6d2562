"""deployments.builder and the two shipped Serve configs: every stage's options, the vLLM
config, the paced generator, and the ingress's in-flight limit derived from the config."""

from __future__ import annotations

import importlib
import math
from typing import Any

import pytest
import yaml
from ray import serve

from app.config import ConfigError, RagAppConfig, parse_config
from app.settings import UnsafeSettingsError
from deployments.builder import (
    CONVERSATION_AFFINITY_ROUTER,
    PASSAGE_AFFINITY_ROUTER,
    PREFIX_CACHE_AFFINITY_ROUTER,
    build_app,
    build_generator,
    compressor_options,
    deployment_options,
    generator_llm_config,
    vllm_only_settings,
)
from generation.config import GeneratorConfig
from pipeline.config_base import PROJECT_ROOT, most_replicas, replica_bounds
from prepare.config import CompressionConfig
from retrieval.config import RETRIEVER_SERVE_OPTIONS, RetrieverConfig

STAGES = {
    "retriever": lambda c: c.retriever.deployment,
    "compression": lambda c: c.compression.deployment,
    "ingress": lambda c: c.ingress.deployment,
}
CPU_FILE = "serve_config.yaml"
GPU_FILE = "serve_config.gpu.yaml"


def application(file: str) -> dict[str, Any]:
    document = yaml.safe_load((PROJECT_ROOT / file).read_text())
    [app] = document["applications"]
    return app


def args_of(file: str) -> dict[str, Any]:
    return application(file)["args"]


@pytest.fixture
def development(monkeypatch):
    """build_app checks the settings: a development environment, whatever the shell has."""
    monkeypatch.setenv("RAG_ENV", "development")
    monkeypatch.delenv("RAG_API_KEYS", raising=False)


# --- deployment_options ---------------------------------------------------------------------


def test_a_stages_options_go_to_serve_as_given_over_its_defaults():
    retriever = RetrieverConfig(
        deployment={"num_replicas": 2, "ray_actor_options": {"resources": {"node_a": 0.01}}}
    )

    options = deployment_options(retriever.deployment, retry_after_s=7.0)

    assert options == {
        **RETRIEVER_SERVE_OPTIONS,
        "num_replicas": 2,
        # merged key by key: the default CPUs kept beside the given resources
        "ray_actor_options": {"num_cpus": 0.2, "resources": {"node_a": 0.01}},
        "backpressure_config": {"status_code": 503, "retry_after_s": 7.0},
    }


def test_autoscaling_replaces_num_replicas():
    autoscaling = {"min_replicas": 0, "max_replicas": 3, "upscale_delay_s": 5}
    retriever = RetrieverConfig(deployment={"autoscaling_config": autoscaling})

    assert "num_replicas" not in retriever.deployment
    assert retriever.deployment["autoscaling_config"] == autoscaling
    assert replica_bounds(retriever.deployment) == (0, 3)


class Stage:
    """A deployment's class, for Serve to check options against."""


def test_serve_refuses_an_option_it_does_not_know():
    retriever = RetrieverConfig(deployment={"num_replica": 2})  # passed through as given

    with pytest.raises(TypeError, match="num_replica"):
        serve.deployment(Stage, **deployment_options(retriever.deployment))


# --- the vLLM generator ---------------------------------------------------------------------


def test_generator_config_asks_no_gpus_through_actor_options():
    generator = GeneratorConfig(  # a GPU replica: the CPU defaults dropped
        model_id="some-model",
        model_source="org/some-model",
        engine_kwargs={"dtype": "half", "enforce_eager": None},
        placement_bundles=None,
        env_vars={"VLLM_CPU_KVCACHE_SPACE": None},
        deployment={"ray_actor_options": {"num_cpus": 2, "resources": {"gpu_node": 0.01}}},
    )

    llm = generator_llm_config(generator, retry_after_s=3.0)

    assert llm["deployment_config"]["ray_actor_options"] == {
        "num_cpus": 2,
        "resources": {"gpu_node": 0.01},
    }
    assert llm["deployment_config"]["backpressure_config"]["retry_after_s"] == 3.0
    assert llm["model_loading_config"] == {
        "model_id": "some-model",
        "model_source": "org/some-model",
    }
    assert llm["engine_kwargs"] == {
        "dtype": "half",
        "enable_prefix_caching": True,
        "enable_prompt_tokens_details": True,
        "max_num_seqs": 16,
        "max_model_len": 2048,
    }
    assert llm["log_engine_metrics"] is True
    assert {"accelerator_type", "placement_group_config", "runtime_env"}.isdisjoint(llm)


def test_the_default_router_leaves_servess_own_routing():
    llm = generator_llm_config(GeneratorConfig())

    assert "request_router_config" not in llm["deployment_config"]


@pytest.mark.parametrize(
    ("router", "kwargs"),
    [
        ({"kind": "prefix_cache_affinity"}, {"imbalanced_threshold": 2.0}),
        ({"kind": "prefix_cache_affinity", "imbalanced_threshold": None}, {}),
        ({"kind": "prefix_cache_affinity", "imbalanced_threshold": 4}, {"imbalanced_threshold": 4}),
    ],
)
def test_prefix_cache_affinity_routes_with_ray_serve_llms_router(router, kwargs):
    llm = generator_llm_config(GeneratorConfig(request_router=router))

    assert llm["deployment_config"]["request_router_config"] == {
        "request_router_class": PREFIX_CACHE_AFFINITY_ROUTER,
        "request_router_kwargs": kwargs,
    }


@pytest.mark.parametrize(("gap", "max_queue_gap"), [(None, None), (3, 3)])
def test_passage_affinity_routes_with_the_projects_router(gap, max_queue_gap):
    router = {"kind": "passage_affinity", "imbalanced_threshold": gap}
    llm = generator_llm_config(GeneratorConfig(request_router=router))

    assert llm["deployment_config"]["request_router_config"] == {
        "request_router_class": PASSAGE_AFFINITY_ROUTER,
        "request_router_kwargs": {"max_queue_gap": max_queue_gap},
    }


@pytest.mark.parametrize("name", ["imbalanced_threshold", "max_queue_gap"])  # and its old name
@pytest.mark.parametrize(("gap", "max_queue_gap"), [(None, None), (3, 3)])
def test_conversation_affinity_routes_compressor_calls_with_the_projects_router(
    gap, max_queue_gap, name
):
    compression = CompressionConfig(request_router={"kind": "conversation_affinity", name: gap})

    assert compressor_options(compression)["request_router_config"] == {
        "request_router_class": CONVERSATION_AFFINITY_ROUTER,
        "request_router_kwargs": {"max_queue_gap": max_queue_gap},
    }
    # Serve's default router when asked: the options are the replica config's alone.
    p2c = CompressionConfig(request_router={"kind": "power_of_two"})
    assert compressor_options(p2c) == deployment_options(p2c.deployment)


@pytest.mark.parametrize(
    "path", [PREFIX_CACHE_AFFINITY_ROUTER, PASSAGE_AFFINITY_ROUTER, CONVERSATION_AFFINITY_ROUTER]
)
def test_the_router_class_path_names_an_importable_class(path):
    module, _, name = path.rpartition(".")

    assert isinstance(getattr(importlib.import_module(module), name), type)


@pytest.fixture(scope="module")
def llm_config_class():
    from ray.serve.llm import LLMConfig  # ~10-25 s: import once for the module

    return LLMConfig


@pytest.mark.parametrize("file", [CPU_FILE, GPU_FILE])
def test_ray_serve_llm_accepts_the_generator_config(llm_config_class, file):
    config = parse_config(args_of(file))

    llm_config = llm_config_class(**generator_llm_config(config.generator))

    assert llm_config.model_id == config.generator.model_id
    assert llm_config.engine_kwargs["max_model_len"] == config.generator.max_model_len
    assert llm_config.accelerator_type == config.generator.accelerator_type


def test_ray_serve_llm_accepts_the_prefix_cache_affinity_router(llm_config_class):
    generator = GeneratorConfig(
        request_router={"kind": "prefix_cache_affinity", "imbalanced_threshold": 8}
    )

    llm_config = llm_config_class(**generator_llm_config(generator))

    deployment = llm_config.deployment_config
    router = deployment["request_router_config"]
    assert router["request_router_class"] == PREFIX_CACHE_AFFINITY_ROUTER
    assert router["request_router_kwargs"]["imbalanced_threshold"] == 8


def test_serve_loads_the_passage_affinity_router_with_its_kwargs():
    from ray.serve.config import RequestRouterConfig

    generator = GeneratorConfig(request_router={"kind": "passage_affinity"})
    router = generator_llm_config(generator)["deployment_config"]["request_router_config"]

    # Serve imports and serializes the class here, as it does when it deploys the config.
    config = RequestRouterConfig(**router)

    assert config.get_request_router_class().__name__ == "PassageAffinityRouter"
    assert config.request_router_kwargs == {"max_queue_gap": 2.0}


def test_serve_loads_the_conversation_affinity_router_with_its_kwargs():
    from ray.serve.config import RequestRouterConfig

    compression = CompressionConfig(request_router={"kind": "conversation_affinity"})
    router = compressor_options(compression)["request_router_config"]

    config = RequestRouterConfig(**router)

    assert config.get_request_router_class().__name__ == "ConversationAffinityRouter"
    assert config.request_router_kwargs == {"max_queue_gap": 2.0}


# --- the engines outside Ray Serve LLM and the whole application ------------------------------


def test_the_paced_engine_is_a_plain_deployment_named_generator():
    generator = GeneratorConfig(
        engine="paced",
        stream_batching_interval_ms=5,
        deployment={"num_replicas": 2, "max_ongoing_requests": 9, "max_replicas_per_node": 1},
    )

    app = build_generator(generator, retry_after_s=2.5)

    deployment = app._bound_deployment
    from deployments.engine_generator import EngineGeneratorDeployment

    assert deployment.name == "Generator"
    assert deployment.func_or_class is EngineGeneratorDeployment
    assert deployment.init_args == (generator,)
    assert deployment.num_replicas == 2
    assert deployment.max_ongoing_requests == 9
    config = deployment._deployment_config
    assert config.backpressure_config.retry_after_s == 2.5
    assert config.backpressure_config.status_code == 503
    assert deployment._replica_config.max_replicas_per_node == 1


def test_an_external_openai_server_is_a_plain_deployment_named_generator():
    generator = GeneratorConfig(
        engine="openai",
        openai={"base_url": "http://127.0.0.1:9/v1", "model": "served-name"},
        deployment={"num_replicas": 2, "ray_actor_options": {"num_cpus": 0.1}},
    )

    deployment = build_generator(generator)._bound_deployment

    from deployments.engine_generator import EngineGeneratorDeployment

    assert deployment.func_or_class is EngineGeneratorDeployment
    assert deployment.init_args == (generator,)
    assert deployment.num_replicas == 2
    assert deployment.ray_actor_options["num_cpus"] == 0.1


def test_vllm_only_settings_are_named_for_another_engine():
    generator = GeneratorConfig(
        engine="openai",
        openai={"base_url": "http://127.0.0.1:9/v1"},
        engine_kwargs={"dtype": "float32"},
        env_vars={"VLLM_CPU_KVCACHE_SPACE": "2"},
    )

    # Named where they differ from the defaults (the CPU default's engine settings).
    assert vllm_only_settings(generator) == ["engine_kwargs", "env_vars"]
    assert vllm_only_settings(GeneratorConfig(engine="paced")) == []


def test_build_app_binds_the_ingress_to_the_three_stages_and_the_writer(development):
    app = build_app(
        {
            "generator": {"engine": "paced"},
            "ingress": {"retry_after_s": 4.0, "deployment": {"max_ongoing_requests": 50}},
            "compression": {"deployment": {"num_replicas": 3}},
        }
    )

    ingress = app._bound_deployment
    config, *stages = ingress.init_args
    assert ingress.name == "RagIngress"
    assert isinstance(config, RagAppConfig)
    assert ingress.max_ongoing_requests == 50
    assert [stage._bound_deployment.name for stage in stages] == [
        "Retriever",
        "Compressor",
        "Generator",
        "CollectionWriter",
    ]
    retriever, compressor, writer = (stages[i]._bound_deployment for i in (0, 1, 3))
    assert retriever.init_args == (config.retriever, config.collections)
    assert compressor.num_replicas == 3
    assert compressor.init_args == (config,)
    assert writer.num_replicas == 1
    assert writer.init_args == (config,)
    for deployment in [ingress, *(stage._bound_deployment for stage in stages)]:
        assert deployment._deployment_config.backpressure_config.retry_after_s == 4.0


def test_build_app_without_collections_binds_no_writer(development):
    app = build_app({"generator": {"engine": "paced"}, "collections": {"enabled": False}})

    _, *stages = app._bound_deployment.init_args
    assert stages[-1] is None
    assert [stage._bound_deployment.name for stage in stages[:3]] == [
        "Retriever",
        "Compressor",
        "Generator",
    ]


def test_the_writer_cannot_be_given_more_than_one_replica():
    with pytest.raises(ConfigError, match="exactly one replica"):
        parse_config({"collections": {"deployment": {"num_replicas": 2}}})


def test_build_app_names_the_bad_key_before_building_anything():
    with pytest.raises(ConfigError, match=r"generator\.foo"):
        build_app({"generator": {"foo": 1}})


def test_build_app_refuses_production_without_api_keys(monkeypatch):
    monkeypatch.setenv("RAG_ENV", "production")
    monkeypatch.delenv("RAG_API_KEYS", raising=False)

    with pytest.raises(UnsafeSettingsError):
        build_app(args_of(CPU_FILE))


# --- the shipped configs --------------------------------------------------------------------


@pytest.mark.parametrize("file", sorted(p.name for p in PROJECT_ROOT.glob("serve_config*.yaml")))
def test_every_shipped_profile_builds_with_serve_checking_each_stages_options(
    file, development, llm_config_class
):
    app = build_app(args_of(file))

    config, *stages = app._bound_deployment.init_args
    assert app._bound_deployment.name == "RagIngress"
    retriever = stages[0]._bound_deployment
    assert retriever.max_ongoing_requests == config.retriever.deployment["max_ongoing_requests"]


@pytest.mark.parametrize("file", [CPU_FILE, GPU_FILE])
def test_shipped_config_parses_and_points_at_the_builder(file):
    app = application(file)

    assert app["import_path"] == "deployments.builder:build_app"
    module, _, name = app["import_path"].partition(":")
    assert getattr(importlib.import_module(module), name) is build_app
    assert isinstance(parse_config(app["args"]), RagAppConfig)


@pytest.mark.parametrize("file", [CPU_FILE, GPU_FILE])
def test_each_stage_gets_the_options_its_yaml_asks_for(file):
    args = args_of(file)
    config = parse_config(args)

    for stage, replica_of in STAGES.items():
        asked = args.get(stage, {}).get("deployment", {})
        options = deployment_options(replica_of(config))
        for key, value in asked.items():
            if key == "ray_actor_options":
                assert value.items() <= options[key].items(), stage
            else:
                assert options[key] == value, (stage, key)
        if "autoscaling_config" in asked:
            assert "num_replicas" not in options, stage


def test_cpu_config_runs_one_fixed_replica_per_stage_without_gpus():
    config = parse_config(args_of(CPU_FILE))

    for stage, replica_of in STAGES.items():
        options = deployment_options(replica_of(config))
        assert options["num_replicas"] == 1, stage
        assert "num_gpus" not in options["ray_actor_options"], stage
        assert options["max_queued_requests"] > 0, stage
    assert application(CPU_FILE)["runtime_env"]["env_vars"]["HF_HUB_OFFLINE"] == "1"


def test_cpu_generator_is_one_cpu_bundle_with_prefix_caching():
    config = parse_config(args_of(CPU_FILE))

    llm = generator_llm_config(config.generator)

    assert llm["placement_group_config"] == {"bundles": [{"CPU": 1}]}
    assert "accelerator_type" not in llm
    assert llm["engine_kwargs"]["enable_prefix_caching"] is True
    assert llm["engine_kwargs"]["enable_prompt_tokens_details"] is True
    assert llm["engine_kwargs"]["max_model_len"] == config.generator.max_model_len == 2048
    assert "VLLM_CPU_KVCACHE_SPACE" in llm["runtime_env"]["env_vars"]
    deployment = llm["deployment_config"]
    assert deployment["ray_actor_options"] == {"num_cpus": 0}
    assert deployment["num_replicas"] == 1
    assert deployment["max_queued_requests"] == config.generator.deployment["max_queued_requests"]
    # The local model folder is resolved against the project root, not the working directory.
    # (A folder not prepared yet stays as written, for vLLM to report.)
    shipped = args_of(CPU_FILE)["generator"]["model_source"]
    prepared = (PROJECT_ROOT / shipped).is_dir()
    expected = str((PROJECT_ROOT / shipped).resolve()) if prepared else shipped
    assert llm["model_loading_config"]["model_source"] == expected


def test_gpu_config_autoscales_every_stage_and_gives_embedders_gpu_shares():
    config = parse_config(args_of(GPU_FILE))

    for stage, replica_of in STAGES.items():
        options = deployment_options(replica_of(config))
        bounds = options["autoscaling_config"]
        assert 1 <= bounds["min_replicas"] <= bounds["max_replicas"], stage
    assert config.retriever.deployment["ray_actor_options"]["num_gpus"] > 0
    assert config.compression.deployment["ray_actor_options"]["num_gpus"] > 0
    assert config.retriever.use_gpu_index is True
    assert application(GPU_FILE)["runtime_env"]["env_vars"]["RAG_ENV"] == "production"


def test_gpu_generator_is_quantized_on_an_accelerator_type_with_autoscaling():
    config = parse_config(args_of(GPU_FILE))

    llm = generator_llm_config(config.generator)

    assert llm["accelerator_type"] == "L4"
    assert llm["engine_kwargs"]["quantization"].startswith("awq")
    assert llm["engine_kwargs"]["enable_prefix_caching"] is True
    assert llm["engine_kwargs"]["max_model_len"] == 8192
    assert "placement_group_config" not in llm
    deployment = llm["deployment_config"]
    assert "num_replicas" not in deployment
    assert deployment["autoscaling_config"]["min_replicas"] >= 1
    assert deployment["autoscaling_config"]["max_replicas"] > 1
    assert "num_gpus" not in deployment["ray_actor_options"]


@pytest.mark.parametrize("file", [CPU_FILE, GPU_FILE])
def test_the_generator_gets_the_queue_and_health_check_options_of_its_config(file):
    config = parse_config(args_of(file))

    deployment = generator_llm_config(config.generator)["deployment_config"]

    for key in ("max_ongoing_requests", "max_queued_requests", "health_check_timeout_s"):
        assert deployment[key] == config.generator.deployment[key], key


@pytest.mark.parametrize("file", [CPU_FILE, GPU_FILE])
def test_shipped_configs_admit_what_the_generators_hold_below_the_ingress_capacity(file):
    config = parse_config(args_of(file))
    generator, ingress = config.generator.deployment, config.ingress.deployment
    holds = most_replicas(generator) * (
        generator["max_ongoing_requests"] + generator["max_queued_requests"]
    )

    limit = config.in_flight_limit()

    # Not clipped by the ingress's own capacity: refusals stay cheap and in the API's shape.
    assert limit == math.ceil(holds / most_replicas(ingress))
    assert limit < ingress["max_ongoing_requests"]


# --- the ingress's in-flight limit ------------------------------------------------------------


def app_config(
    generator: dict[str, Any] | None = None,
    ingress_deployment: dict[str, Any] | None = None,
    max_in_flight: int | None = None,
) -> RagAppConfig:
    return parse_config(
        {
            "generator": {"deployment": generator or {}},
            "ingress": {
                "max_in_flight_requests": max_in_flight,
                "deployment": ingress_deployment or {},
            },
        }
    )


def test_an_explicit_in_flight_limit_wins():
    config = app_config(
        generator={"max_ongoing_requests": 100, "max_queued_requests": 100},
        max_in_flight=7,
    )

    assert config.in_flight_limit() == 7


@pytest.mark.parametrize(
    ("generator", "ingress", "expected"),
    [
        # running + queued of every generator replica, over the ingress replicas
        ({"max_ongoing_requests": 4, "max_queued_requests": 6}, {}, 10),
        ({"num_replicas": 3, "max_ongoing_requests": 4, "max_queued_requests": 6}, {}, 30),
        (
            {"num_replicas": 3, "max_ongoing_requests": 4, "max_queued_requests": 6},
            {"num_replicas": 2},
            15,
        ),
        # rounded up: 3 x 10 over 4 ingress replicas is 7.5
        (
            {"num_replicas": 3, "max_ongoing_requests": 4, "max_queued_requests": 6},
            {"num_replicas": 4},
            8,
        ),
        # autoscaling counts its most replicas, on both sides
        (
            {
                "num_replicas": 1,
                "autoscaling_config": {"min_replicas": 1, "max_replicas": 5},
                "max_ongoing_requests": 4,
                "max_queued_requests": 6,
            },
            {"autoscaling_config": {"min_replicas": 1, "max_replicas": 2}},
            25,
        ),
        # an unlimited queue (-1) counts no queued requests
        ({"max_ongoing_requests": 4, "max_queued_requests": -1}, {}, 4),
        # at least one
        ({"max_ongoing_requests": 1, "max_queued_requests": 0}, {"num_replicas": 8}, 1),
        # capped below the ingress's own capacity
        (
            {"num_replicas": 4, "max_ongoing_requests": 32, "max_queued_requests": 64},
            {"max_ongoing_requests": 100},
            99,
        ),
    ],
)
def test_the_in_flight_limit_is_derived_from_what_the_generators_hold(generator, ingress, expected):
    assert app_config(generator, ingress).in_flight_limit() == expected


@pytest.mark.parametrize("limit", [64, 65, 1000])
def test_an_in_flight_limit_at_or_above_the_ingress_capacity_is_refused(limit):
    with pytest.raises(ConfigError, match="max_in_flight_requests"):
        app_config(ingress_deployment={"max_ongoing_requests": 64}, max_in_flight=limit)


def test_an_in_flight_limit_just_below_the_ingress_capacity_is_accepted():
    config = app_config(ingress_deployment={"max_ongoing_requests": 64}, max_in_flight=63)

    assert config.in_flight_limit() == 63


def test_every_accepted_config_derives_a_usable_in_flight_limit():
    try:
        config = app_config(ingress_deployment={"max_ongoing_requests": 1})
    except ConfigError:
        return  # refusing such a config up front is a fix as good as any
    assert config.in_flight_limit() >= 1
