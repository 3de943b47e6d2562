"""Every variant of every plan must be a valid config before any service starts."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from app.config import parse_config
from bench.suite import PLANS, QUALITY_PLANS
from harness.variant import write_variant

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    "variant", [v for plan in PLANS.values() for v in plan], ids=lambda v: v.name
)
def test_every_variant_is_a_valid_serve_config(variant, tmp_path):
    out = write_variant(
        ROOT / "serve_config.yaml", dict(variant.overrides), tmp_path / "v.yaml", port=8123
    )

    written = yaml.safe_load(out.read_text())
    assert written["http_options"]["port"] == 8123
    config = parse_config(written["applications"][0]["args"])
    for key, value in variant.overrides.items():
        node = config.model_dump()
        for part in key.split("."):
            node = node[part]
        assert node == value


def test_load_point_labels_are_unique_within_a_plan():
    for plan in PLANS.values():
        labels = [load.label for variant in plan for load in variant.loads]
        assert len(labels) == len(set(labels))


def test_quality_plans_serve_the_squad_index():
    assert {plan.index_path for plan in QUALITY_PLANS.values()} == {"indexes/squad-dev"}


def test_plans_keep_the_reader_their_figures_were_measured_with():
    """The stored figures were read by SmolLM2 in fp32: a plan that names no reader still
    gets it, though serve_config.yaml now ships the 1.5B; eval-default serves the file as is."""
    from bench.suite import SMOLLM2_GENERATOR, service_overrides

    quick = service_overrides({"generator.engine_kwargs.enable_prefix_caching": False})
    assert quick["generator.model_source"] == SMOLLM2_GENERATOR["generator.model_source"]
    assert quick["generator.engine_kwargs.dtype"] == "float32"
    named = service_overrides({"generator.model_source": ".models/qwen2.5-coder-0.5b-instruct"})
    assert named["generator.model_source"] == ".models/qwen2.5-coder-0.5b-instruct"
    default = QUALITY_PLANS["eval-default"]
    assert default.as_shipped
    assert service_overrides(dict(default.overrides), default.as_shipped) == {}


@pytest.mark.parametrize("name", sorted(QUALITY_PLANS))
def test_every_quality_plan_is_a_valid_serve_config(name, tmp_path):
    from bench.suite import service_overrides

    plan = QUALITY_PLANS[name]
    overrides = {"retriever.index_path": plan.index_path, **plan.overrides}
    write_variant(
        ROOT / "serve_config.yaml",
        service_overrides(overrides, plan.as_shipped),
        tmp_path / "v.yaml",
    )


def test_questions_on_the_command_line_replace_a_quality_plan_s_own(monkeypatch, tmp_path):
    from bench import suite

    ran = []
    (tmp_path / "x").write_text("report")
    monkeypatch.setattr(
        suite, "run_quality", lambda plan, out, base: ran.append(plan) or tmp_path / "x"
    )

    assert (
        suite.main(["--plan", "default-vllm-binding", "--questions", "16", "--out", str(tmp_path)])
        == 0
    )

    assert ran[0].questions == 16
    assert ran[0].overrides == {"generator.weights": "given", "generator.cpu_binding": None}
    assert QUALITY_PLANS["default-vllm-binding"].questions == 32  # the plan itself is unchanged


def test_the_as_filed_plan_serves_the_prompt_it_names_not_todays():
    # AS_FILED rebuilds the old prompt by replacing today's rule 4: a reworded rule would
    # leave it equal to today's prompt, and the ABBA would compare a setting with itself.
    from bench.suite import AS_FILED
    from prepare.prompt import DEFAULT_SYSTEM_PROMPT

    old = AS_FILED["prompt.system_prompt"]
    assert old != DEFAULT_SYSTEM_PROMPT
    assert "in at most a few sentences" in old


def test_plans_paired_with_default_bf16_serve_bf16_weights_like_it():
    # make run serves INT8 on a CPU with AMX (generator.weights: fastest): a plan measured
    # against default-bf16 that left it would change two things at once.
    from bench.suite import AS_FILED, QUALITY_PLANS

    for name in ("default-bf16", "default-vllm-binding", "default-stream250"):
        assert QUALITY_PLANS[name].overrides["generator.weights"] == "given", name
    assert AS_FILED["generator.weights"] == "given"
    assert "generator.weights" not in QUALITY_PLANS["default-now"].overrides
