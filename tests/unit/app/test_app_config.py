"""app.config: the typed config tree, its validation messages, and path resolution."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from app.config import ConfigError, RagAppConfig, parse_config
from generation.config import GeneratorConfig, OpenAIEngineConfig
from pipeline.config_base import PROJECT_ROOT, resolve_path
from prepare.prompt import DEFAULT_SYSTEM_PROMPT


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
    assert config.retriever.deployment["ray_actor_options"] == {"num_cpus": 0.2}
    assert config.compression.deployment["max_ongoing_requests"] == 8
    assert config.generator.deployment["ray_actor_options"] == {"num_cpus": 0}


def test_values_are_parsed_into_the_tree():
    config = parse_config(
        {
            "retriever": {"nprobe": 8, "deployment": {"autoscaling_config": {"max_replicas": 3}}},
            "generator": {"engine_kwargs": {"max_num_seqs": 4, "enforce_eager": None}},
        }
    )

    assert config.retriever.nprobe == 8
    assert config.retriever.deployment["autoscaling_config"] == {"max_replicas": 3}
    # engine_kwargs are laid over the CPU default's; a key given null drops a default.
    assert config.generator.engine_kwargs == {
        "dtype": "fastest",
        "enable_prefix_caching": True,
        "enable_prompt_tokens_details": True,
        "max_num_seqs": 4,
    }


@pytest.mark.parametrize(
    ("args", "key"),
    [
        ({"retriever": {"foo": 1}}, "retriever.foo"),
        ({"retreiver": {}}, "retreiver"),
        ({"compression": {"llmlingua": {"modle": "x"}}}, "compression.llmlingua.modle"),
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

    assert config.generator.deployment["ray_actor_options"] == {"num_cpus": 0}
    assert config.generator.deployment["max_ongoing_requests"] == 8
    assert config.compression.deployment["ray_actor_options"] == {"num_cpus": 0.5}
    assert config.compression.deployment["max_ongoing_requests"] == 8
    assert config.compression.deployment["num_replicas"] == 2


# --- generator.engine: openai ---------------------------------------------------------------

OPENAI = {"base_url": "https://llm.internal:8000/v1"}


def test_an_external_server_is_parsed_with_its_defaults():
    config = parse_config({"generator": {"engine": "openai", "openai": OPENAI}})

    assert config.generator.openai == OpenAIEngineConfig(
        base_url="https://llm.internal:8000/v1",
        allow_plaintext=False,
        model=None,
        tokenizer=None,
        connect_timeout_s=5.0,
        read_timeout_s=60.0,
        max_connections=64,
    )


def test_engine_openai_without_a_server_is_refused_naming_its_base_url():
    with pytest.raises(ConfigError) as excinfo:
        parse_config({"generator": {"engine": "openai"}})

    assert "generator.engine 'openai' needs generator.openai.base_url" in str(excinfo.value)


def test_a_server_without_a_base_url_is_refused():
    with pytest.raises(ConfigError) as excinfo:
        parse_config({"generator": {"engine": "openai", "openai": {"model": "m"}}})

    assert "'generator.openai.base_url': Field required" in str(excinfo.value)


@pytest.mark.parametrize(
    "base_url", ["llm.internal:8000/v1", "ftp://llm.internal/v1", "", " http://llm/v1"]
)
def test_a_base_url_must_be_http_or_https(base_url):
    with pytest.raises(ConfigError) as excinfo:
        parse_config({"generator": {"engine": "openai", "openai": {"base_url": base_url}}})

    assert "'generator.openai.base_url'" in str(excinfo.value)


@pytest.mark.parametrize(
    "base_url",
    [
        "https://llm.internal:8000/v1",
        "https://api.example/v1/",
        "http://127.0.0.1:8001/v1",
        "http://127.3.2.1/v1",
        "http://localhost:8001/v1",
        "http://[::1]:8001/v1",
    ],
)
def test_https_anywhere_and_http_on_loopback_are_accepted(base_url):
    config = parse_config({"generator": {"engine": "openai", "openai": {"base_url": base_url}}})

    assert config.generator.openai is not None
    assert config.generator.openai.base_url == base_url


@pytest.mark.parametrize(
    "base_url",
    [
        "http://llm.internal:8000/v1",
        "http://10.0.0.7/v1",
        "http://[2001:db8::1]/v1",
        "http://0.0.0.0/v1",
    ],
)
def test_clear_text_off_the_machine_is_refused_unless_allowed(base_url):
    openai = {"base_url": base_url}
    with pytest.raises(ConfigError) as excinfo:
        parse_config({"generator": {"engine": "openai", "openai": openai}})

    assert "is http:// to a host other than loopback" in str(excinfo.value)
    assert "generator.openai.allow_plaintext" in str(excinfo.value)
    allowed = parse_config(
        {"generator": {"engine": "openai", "openai": {**openai, "allow_plaintext": True}}}
    )
    assert allowed.generator.openai is not None and allowed.generator.openai.allow_plaintext


@pytest.mark.parametrize("key", ["api_key", "timeout_s"])
def test_an_unknown_key_of_the_server_is_named(key):
    # api_key in particular: the key comes from RAG_GENERATOR_API_KEY, never from this file.
    with pytest.raises(ConfigError) as excinfo:
        parse_config({"generator": {"engine": "openai", "openai": {**OPENAI, key: "x"}}})

    assert f"unknown key 'generator.openai.{key}'" in str(excinfo.value)


@pytest.mark.parametrize(
    ("field", "value"),
    [("connect_timeout_s", 0), ("read_timeout_s", -1), ("max_connections", 0)],
)
def test_server_limits_must_be_positive(field, value):
    with pytest.raises(ConfigError) as excinfo:
        parse_config({"generator": {"engine": "openai", "openai": {**OPENAI, field: value}}})

    assert f"'generator.openai.{field}'" in str(excinfo.value)


def test_the_tokenizer_of_an_external_server_is_the_one_named():
    generator = GeneratorConfig(
        engine="openai",
        model_source=".models/local",
        openai=OpenAIEngineConfig(base_url=OPENAI["base_url"], tokenizer=".models/served"),
    )

    assert generator.tokenizer_source() == ".models/served"


def test_the_tokenizer_of_an_external_server_defaults_to_the_model_source():
    generator = GeneratorConfig(
        engine="openai", model_source=".models/local", openai=OpenAIEngineConfig(**OPENAI)
    )

    assert generator.tokenizer_source() == ".models/local"


@pytest.mark.parametrize("engine", ["vllm", "paced"])
def test_other_engines_use_the_model_source_even_with_a_server_block(engine):
    server = OpenAIEngineConfig(base_url=OPENAI["base_url"], tokenizer="x", model="served")
    generator = GeneratorConfig(engine=engine, model_source=".models/local", openai=server)

    assert generator.tokenizer_source() == ".models/local"
    assert generator.served_model_name() == generator.model_id


def test_the_served_model_name_is_the_server_model_when_set():
    server = OpenAIEngineConfig(base_url=OPENAI["base_url"], model="Qwen/Qwen2.5-7B-Instruct")

    with_model = GeneratorConfig(engine="openai", model_id="rag", openai=server)
    without = GeneratorConfig(engine="openai", model_id="rag", openai=OpenAIEngineConfig(**OPENAI))

    assert with_model.served_model_name() == "Qwen/Qwen2.5-7B-Instruct"
    assert without.served_model_name() == "rag"


@pytest.mark.parametrize(
    "generator",
    [
        {"engine": "openai", "openai": OPENAI},
        {"engine": "paced"},
    ],
    ids=["openai", "paced"],
)
@pytest.mark.parametrize("kind", ["prefix_cache_affinity", "passage_affinity"])
def test_an_affinity_router_needs_the_vllm_engine(generator, kind):
    args = {"generator": {**generator, "request_router": {"kind": kind}}}

    with pytest.raises(ConfigError, match=f"{kind} needs engine 'vllm'"):
        parse_config(args)


@pytest.mark.parametrize("kind", ["prefix_cache_affinity", "passage_affinity"])
def test_an_affinity_router_is_accepted_for_vllm(kind):
    config = parse_config({"generator": {"request_router": {"kind": kind}}})

    assert config.generator.request_router.kind == kind


def test_the_shipped_serve_config_still_parses_with_the_vllm_engine():
    document = yaml.safe_load((PROJECT_ROOT / "serve_config.yaml").read_text())
    [application] = document["applications"]

    config = parse_config(application["args"])

    assert config.generator.engine == "vllm"
    assert config.generator.openai is None
    assert config.generator.tokenizer_source() == config.generator.model_source
    assert config.generator.served_model_name() == config.generator.model_id


def test_the_code_defaults_are_what_the_shipped_serve_config_serves():
    # serve_config.yaml names only what a deployment must (paths, the model folder), each as
    # the code's default: `make run` serves parse_config({}).
    document = yaml.safe_load((PROJECT_ROOT / "serve_config.yaml").read_text())
    [application] = document["applications"]

    assert parse_config(application["args"]) == parse_config({})


def test_hybrid_retrieval_needs_a_positive_weight():
    with pytest.raises(ConfigError, match=r"retriever\.hybrid.*one fusion weight must be positive"):
        parse_config({"retriever": {"hybrid": {"dense_weight": 0, "lexical_weight": 0}}})


def test_the_preparers_options_come_from_the_config():
    from prepare.options import PREPARATION_DEFAULTS, PreparationOptions

    config = RagAppConfig.model_validate(
        {
            "compression": {"sentence_prefilter_rate": 0.25},
            "conversation": {"history_max_tokens": 64},
        }
    )

    assert config.preparation_options() == PreparationOptions(
        sentence_prefilter_rate=0.25,
        history_max_tokens=64,
    )
    assert RagAppConfig().preparation_options() == PREPARATION_DEFAULTS
