"""A weight-only 4-bit checkpoint refused in float32 when the config loads, not at the
engine's first request."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from generation.checkpoints import dtype_problem, weight_only_bits
from generation.config import GeneratorConfig

W4A16 = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "input_activations": None,
            "weights": {"num_bits": 4, "strategy": "group", "group_size": 128},
        }
    },
}
W8A8 = {
    "quant_method": "compressed-tensors",
    "config_groups": {
        "group_0": {
            "input_activations": {"num_bits": 8, "dynamic": True, "strategy": "token"},
            "weights": {"num_bits": 8, "strategy": "channel"},
        }
    },
}


def _folder(tmp_path: Path, quantization: dict | None) -> str:
    config = {"architectures": ["Qwen2ForCausalLM"]}
    if quantization is not None:
        config["quantization_config"] = quantization
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


def test_weight_only_bits_reads_each_format() -> None:
    assert weight_only_bits(W4A16) == 4
    assert weight_only_bits(W8A8) is None  # activations quantized too
    assert weight_only_bits({"quant_method": "awq", "bits": 4}) == 4
    assert weight_only_bits({"quant_method": "gptq", "bits": 8}) == 8


def test_a_4_bit_checkpoint_in_float32_is_refused_with_the_fix(tmp_path: Path) -> None:
    source = _folder(tmp_path, W4A16)
    with pytest.raises(ValidationError, match=r"engine_kwargs\.dtype to bfloat16"):
        GeneratorConfig(model_source=source, engine_kwargs={"dtype": "float32"})
    config = GeneratorConfig(model_source=source, engine_kwargs={"dtype": "bfloat16"})
    assert config.engine_kwargs["dtype"] == "bfloat16"


@pytest.mark.parametrize(
    ("quantization", "dtype"),
    [
        (None, "float32"),
        (W8A8, "float32"),
        (W4A16, None),
        (W4A16, "auto"),
        (W4A16, "float16"),
        (W4A16, "fastest"),
    ],
)
def test_what_runs_is_let_through(tmp_path: Path, quantization: dict | None, dtype: str) -> None:
    assert dtype_problem(_folder(tmp_path, quantization), dtype) is None


def test_a_hub_id_or_missing_folder_is_left_to_vllm(tmp_path: Path) -> None:
    assert dtype_problem("Qwen/Qwen2.5-1.5B-Instruct-AWQ", "float32") is None
    assert dtype_problem(str(tmp_path / "absent"), "float32") is None
