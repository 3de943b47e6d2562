"""deployments.generator's `weights: fastest` swap reaches the folder vLLM loads: the
engine config that the builder's LLMConfig already cached, not only model_source (an
earlier swap changed model_source alone and vLLM loaded the bf16 folder anyway)."""

from __future__ import annotations

from pathlib import Path

import pytest
from ray.serve.llm import LLMConfig

from deployments import generator as generator_module
from deployments.builder import generator_llm_config
from generation.config import GeneratorConfig


@pytest.fixture
def reader_with_int8(tmp_path: Path) -> Path:
    reader = tmp_path / "reader"
    reader.mkdir()
    int8 = tmp_path / "reader-w8a8-rtn"
    int8.mkdir()
    (int8 / "quantization.json").write_text("{}")
    return reader


def cached_llm_config(model_source: Path) -> LLMConfig:
    config = LLMConfig(**generator_llm_config(GeneratorConfig(model_source=str(model_source))))
    config.get_engine_config()  # what the builder and Serve do before the replica starts
    return config


def test_fastest_on_an_amx_cpu_points_vllm_at_the_int8_folder(reader_with_int8, monkeypatch):
    monkeypatch.setattr(generator_module, "cpu_flags", lambda: {"amx_int8", "avx512f"})
    config = cached_llm_config(reader_with_int8)

    generator_module._resolve_weights(config, "fastest")

    int8 = str(reader_with_int8.with_name("reader-w8a8-rtn"))
    assert config.model_loading_config.model_source == int8
    assert config.get_engine_config().actual_hf_model_id == int8
    assert config.get_engine_config().get_initialization_kwargs()["model"] == int8


@pytest.mark.parametrize(
    ("weights", "flags"), [("fastest", {"avx512f"}), ("given", {"amx_int8", "avx512f"})]
)
def test_given_or_a_cpu_without_amx_leaves_the_reader(
    reader_with_int8, monkeypatch, weights, flags
):
    monkeypatch.setattr(generator_module, "cpu_flags", lambda: flags)
    config = cached_llm_config(reader_with_int8)

    generator_module._resolve_weights(config, weights)

    assert config.get_engine_config().actual_hf_model_id == str(reader_with_int8)
