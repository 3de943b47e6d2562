"""app.builder and the two shipped Serve configs: every stage's options, the vLLM config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from app.builder import build_app, deployment_options, generator_llm_config
from app.config import (
    PROJECT_ROOT,
    ConfigError,
    GeneratorConfig,
    RagAppConfig,
    ReplicaConfig,
    parse_config,
)
from app.settings import UnsafeSettingsError

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


def test_fixed_replicas_give_num_replicas_and_resources():
    options = deployment_options(
        ReplicaConfig(num_replicas=2, num_cpus=0.5, max_ongoing_requests=4, max_queued_requests=8)
    )

    assert options == {
        "num_replicas": 2,
        "max_ongoing_requests": 4,
        "max_queued_requests": 8,
        "ray_actor_options": {"num_cpus": 0.5, "num_gpus": 0},
    }


def test_autoscaling_replaces_num_replicas():
    options = deployment_options(
        ReplicaConfig(num_replicas=5, autoscaling={"min_replicas": 0, "max_replicas": 3})
    )

    assert "num_replicas" not in options
    assert options["autoscaling_config"] == {
        "min_replicas": 0,
        "max_replicas": 3,
        "target_ongoing_requests": 2.0,
    }


def test_generator_config_asks_no_gpus_through_actor_options():
    generator = GeneratorConfig(
        model_source="org/some-model",
        engine_kwargs={"dtype": "half"},
        deployment={"num_gpus": 1, "num_cpus": 2},
    )

    llm = generator_llm_config(generator)

    assert llm["deployment_config"]["ray_actor_options"] == {"num_cpus": 2}
    assert llm["model_loading_config"] == {
        "model_id": "smollm2-135m-instruct",
        "model_source": "org/some-model",
    }
    assert llm["engine_kwargs"] == {"dtype": "half", "max_model_len": 2048}
    assert {"accelerator_type", "placement_group_config", "runtime_env"}.isdisjoint(llm)


@pytest.mark.parametrize("file", [CPU_FILE, GPU_FILE])
def test_shipped_config_parses_and_points_at_the_builder(file):
    app = application(file)

    assert app["import_path"] == "app.builder:build_app"
    assert isinstance(parse_config(app["args"]), RagAppConfig)


@pytest.mark.parametrize("file", [CPU_FILE, GPU_FILE])
def test_each_stage_gets_the_options_its_yaml_asks_for(file):
    args = args_of(file)
    config = parse_config(args)

    for stage, replica_of in STAGES.items():
        asked = args[stage]["deployment"]
        options = deployment_options(replica_of(config))
        assert options["max_queued_requests"] == asked["max_queued_requests"], stage
        assert options["max_ongoing_requests"] == asked["max_ongoing_requests"], stage
        assert options["ray_actor_options"] == {
            "num_cpus": asked["num_cpus"],
            "num_gpus": asked.get("num_gpus", 0),
        }, stage
        if "autoscaling" in asked:
            assert "num_replicas" not in options
            for key, value in asked["autoscaling"].items():
                assert options["autoscaling_config"][key] == value, (stage, key)
        else:
            assert options["num_replicas"] == asked["num_replicas"], stage
            assert "autoscaling_config" not in options


def test_cpu_config_runs_one_fixed_replica_per_stage_without_gpus():
    config = parse_config(args_of(CPU_FILE))

    for stage, replica_of in STAGES.items():
        options = deployment_options(replica_of(config))
        assert options["num_replicas"] == 1, stage
        assert options["ray_actor_options"]["num_gpus"] == 0, stage
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
    assert deployment["max_queued_requests"] == 64
    # The local model folder is resolved against the project root, not the working directory.
    source = Path(llm["model_loading_config"]["model_source"])
    if (PROJECT_ROOT / ".models" / "smollm2-135m-instruct").is_dir():
        assert source == PROJECT_ROOT / ".models" / "smollm2-135m-instruct"


def test_gpu_config_autoscales_every_stage_and_gives_embedders_gpu_shares():
    config = parse_config(args_of(GPU_FILE))

    for stage, replica_of in STAGES.items():
        options = deployment_options(replica_of(config))
        bounds = options["autoscaling_config"]
        assert 1 <= bounds["min_replicas"] <= bounds["max_replicas"], stage
    assert config.retriever.deployment.num_gpus > 0
    assert config.compression.deployment.num_gpus > 0
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


def test_build_app_names_the_bad_key_before_building_anything():
    with pytest.raises(ConfigError, match=r"generator\.foo"):
        build_app({"generator": {"foo": 1}})


def test_build_app_refuses_production_without_api_keys(monkeypatch):
    monkeypatch.setenv("RAG_ENV", "production")
    monkeypatch.delenv("RAG_API_KEYS", raising=False)

    with pytest.raises(UnsafeSettingsError):
        build_app(args_of(CPU_FILE))
