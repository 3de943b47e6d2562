"""The GPU profile's reader is one vLLM's CUDA build loads with the profile's setting.

`serve_config.gpu.yaml` names hugging-quants' AWQ INT4 Llama-3.1-8B with `quantization:
awq_marlin`. Its config.json (AutoAWQ's format, as published on its hub page; no hub here)
says `quant_method: awq`, 4 bits, groups of 128, zero points, GEMM layout. vLLM compares the
two in ModelConfig._verify_quantization: the checkpoint's method must equal the asked one
unless a config class "overrides" it. This runs vLLM's own override check as its CUDA build
would (the CPU build skips AWQ overrides), so a rename or a format vLLM stops accepting
fails here rather than at the profile's first start on a GPU.
"""

from __future__ import annotations

from pathlib import Path
from unittest import mock

import pytest
import yaml

PUBLISHED_AWQ_CONFIG = {
    "quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm",
}  # fmt: skip


def _profile_generator() -> dict:
    config = yaml.safe_load(Path("serve_config.gpu.yaml").read_text())
    return config["applications"][0]["args"]["generator"]


def test_the_profile_names_the_awq_checkpoint_and_marlin() -> None:
    generator = _profile_generator()
    assert generator["model_source"] == "hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4"
    assert generator["engine_kwargs"]["quantization"] == "awq_marlin"


def test_vllm_cuda_accepts_that_checkpoint_with_that_setting() -> None:
    pytest.importorskip("vllm")
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS, auto_awq

    asked = _profile_generator()["engine_kwargs"]["quantization"]
    assert asked in QUANTIZATION_METHODS
    with mock.patch.object(auto_awq.current_platform, "is_cpu", return_value=False):
        chosen = auto_awq.AutoAWQConfig.override_quantization_method(PUBLISHED_AWQ_CONFIG, asked)
    assert chosen == "auto_awq"  # vLLM then picks the Marlin AWQ kernel on a capable GPU
    config = auto_awq.AutoAWQConfig.from_config(PUBLISHED_AWQ_CONFIG)
    assert (config.weight_bits, config.group_size, config.zero_point) == (4, 128, True)
