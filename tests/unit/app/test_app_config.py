"""app.config: the typed config tree, its validation messages, and path resolution."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.config import PROJECT_ROOT, ConfigError, RagAppConfig, parse_config, resolve_path
from retrieval.prompt import DEFAULT_SYSTEM_PROMPT


def test_no_args_give_the_documented_defaults():
    config = parse_config(None)

    assert config == parse_config({}) == RagAppConfig()
    assert (config.retriever.default_top_k, config.retriever.max_top_k) == (5, 20)
    assert config.retriever.index_path == "indexes/default"
    assert config.compression.default_method == "sentences"
    assert config.compression.rate == 0.5
    assert config.generator.max_model_len == 2048
    assert (config.generator.default_max_tokens, config.generator.max_tokens_limit) == (128, 512)
    assert config.prompt.system_prompt == DEFAULT_SYSTEM_PROMPT
    assert config.ingress.max_question_chars == 2000
    # Each stage has its own replica defaults.
    assert config.retriever.deployment.num_cpus == 0.2
    assert config.compression.deployment.max_ongoing_requests == 8
    assert config.generator.deployment.num_cpus == 0


def test_values_are_parsed_into_the_tree():
    config = parse_config(
        {
            "retriever": {"nprobe": 8, "deployment": {"autoscaling": {"max_replicas": 3}}},
            "generator": {"engine_kwargs": {"enable_prefix_caching": True}},
        }
    )

    assert config.retriever.nprobe == 8
    assert config.retriever.deployment.autoscaling.max_replicas == 3
    assert config.generator.engine_kwargs == {"enable_prefix_caching": True}


@pytest.mark.parametrize(
    ("args", "key"),
    [
        ({"retriever": {"foo": 1}}, "retriever.foo"),
        ({"retreiver": {}}, "retreiver"),
        ({"compression": {"llmlingua": {"modle": "x"}}}, "compression.llmlingua.modle"),
        (
            {"generator": {"deployment": {"autoscaling": {"min_replica": 1}}}},
            "generator.deployment.autoscaling.min_replica",
        ),
    ],
)
def test_unknown_key_is_a_config_error_naming_the_dotted_key(args, key):
    with pytest.raises(ConfigError) as excinfo:
        parse_config(args)

    assert f"unknown key '{key}'" in str(excinfo.value)


def test_every_bad_key_is_named_at_once():
    with pytest.raises(ConfigError) as excinfo:
        parse_config({"retriever": {"foo": 1}, "ingress": {"max_question_chars": 0}})

    message = str(excinfo.value)
    assert "retriever.foo" in message
    assert "'ingress.max_question_chars'" in message


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ({"retriever": {"default_top_k": 21}}, "default_top_k must not exceed max_top_k"),
        (
            {"ingress": {"deployment": {"autoscaling": {"min_replicas": 3, "max_replicas": 2}}}},
            "min_replicas must not exceed max_replicas",
        ),
        (
            {"compression": {"default_method": "llmlingua", "llmlingua": {"enabled": False}}},
            "needs llmlingua.enabled",
        ),
        (
            {
                "compression": {
                    "default_method": "sentences+llmlingua",
                    "llmlingua": {"enabled": False},
                }
            },
            "needs llmlingua.enabled",
        ),
        (
            {"generator": {"engine_kwargs": {"max_model_len": 4096}}},
            "not engine_kwargs.max_model_len",
        ),
        ({"generator": {"max_tokens_limit": 2048}}, "smaller than max_model_len"),
        ({"generator": {"default_max_tokens": 600}}, "must not exceed max_tokens_limit"),
        ({"generator": {"max_model_len": 128}}, "'generator.max_model_len'"),
        ({"compression": {"rate": 0}}, "'compression.rate'"),
        ({"compression": {"rate": 1.5}}, "'compression.rate'"),
        ({"compression": {"default_method": "zip"}}, "'compression.default_method'"),
        ({"retriever": {"deployment": {"max_queued_requests": -2}}}, "max_queued_requests"),
        ({"retriever": {"deployment": {"num_replicas": 0}}}, "num_replicas"),
    ],
)
def test_invalid_values_are_rejected(args, fragment):
    with pytest.raises(ConfigError, match="invalid RAG application config") as excinfo:
        parse_config(args)

    assert fragment in str(excinfo.value)


def test_llmlingua_may_be_disabled_when_no_method_needs_it():
    config = parse_config({"compression": {"llmlingua": {"enabled": False}}})

    assert config.compression.llmlingua.enabled is False


def test_config_is_frozen():
    config = RagAppConfig()

    with pytest.raises(ValueError):
        config.retriever.max_top_k = 50  # type: ignore[misc]


def test_every_field_is_described():
    from pydantic import BaseModel

    def walk(model: type[BaseModel]):
        for name, field in model.model_fields.items():
            annotation = field.annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                yield from walk(annotation)
            else:
                yield model.__name__, name, field.description

    undocumented = [(m, n) for m, n, d in walk(RagAppConfig) if not d]
    assert undocumented == []


def test_resolve_path_puts_relative_paths_under_the_project_root():
    assert Path(__file__).resolve().parents[3] == PROJECT_ROOT
    assert (PROJECT_ROOT / "pyproject.toml").is_file()
    assert resolve_path("indexes/default") == PROJECT_ROOT / "indexes" / "default"
    assert resolve_path("/mnt/indexes/default") == Path("/mnt/indexes/default")
    assert resolve_path("~/idx") == Path.home() / "idx"


def test_setting_one_deployment_field_keeps_the_stage_defaults():
    config = parse_config(
        {
            "generator": {"deployment": {"max_ongoing_requests": 8}},
            "compression": {"deployment": {"num_replicas": 2}},
        }
    )

    assert config.generator.deployment.num_cpus == 0
    assert config.generator.deployment.max_ongoing_requests == 8
    assert config.compression.deployment.num_cpus == 0.5
    assert config.compression.deployment.max_ongoing_requests == 8
    assert config.compression.deployment.num_replicas == 2
