"""The shipped cost model is the fit it cites: the config's defaults and every CPU profile
equal the coefficients `bench.context_sweep` stored in docs/results (issue 29: a default that
claims to be fitted is checked against the results it cites)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from prepare.config import CostModelConfig

ROOT = Path(__file__).resolve().parents[3]
PREFIX = "compression.cost_model."


def stored_fit(run: str) -> dict[str, float]:
    fit = json.loads((ROOT / "docs/results" / run / "cost_model.json").read_text())
    return {key.removeprefix(PREFIX): value for key, value in fit.items()}


def flat(cost_model: dict) -> dict[str, float]:
    """`{a: {b: 1}}` as `{"a.b": 1}`: the keys the fits are stored under."""
    out: dict[str, float] = {}
    for key, value in cost_model.items():
        if isinstance(value, dict):
            out |= {f"{key}.{inner}": v for inner, v in value.items()}
        else:
            out[key] = value
    return out


def cited() -> dict[str, float]:
    """Prefill and LLMLingua from the LLMLingua sweep, sentence selection from its own."""
    llmlingua, sentences = stored_fit("context-llmlingua"), stored_fit("context-sentences")
    return {
        **{k: v for k, v in llmlingua.items() if k.startswith(("prefill", "llmlingua"))},
        **{k: v for k, v in sentences.items() if k.startswith("sentences")},
    }


def test_the_config_defaults_are_the_stored_fits():
    assert flat(CostModelConfig().model_dump()) == cited()


@pytest.mark.parametrize(
    "profile", ["serve_config.yaml", "serve_config.scale.yaml", "serve_config.multinode.yaml"]
)
def test_every_cpu_profile_ships_the_stored_fits(profile):
    document = yaml.safe_load((ROOT / profile).read_text())
    cost_model = document["applications"][0]["args"]["compression"]["cost_model"]

    assert flat(CostModelConfig(**cost_model).model_dump()) == cited()
