"""The shipped cost models are the fits they cite (issue 29: a default that claims to be
fitted is checked against the results it cites). The config's defaults are the fit for the
reader `make run` serves: its prefill and sentence selection from the sweep that served it
(docs/results/context-sentences-15b), LLMLingua's own time from the sweep of its scorer
(docs/results/context-llmlingua; the scorer does not change with the reader). The profiles
that serve SmolLM2 ship SmolLM2's fit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from app.config import parse_config
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


def cited(prefill_and_sentences: str) -> dict[str, float]:
    """Prefill and sentence selection from one sweep, LLMLingua from the LLMLingua sweep."""
    reader, llmlingua = stored_fit(prefill_and_sentences), stored_fit("context-llmlingua")
    return {
        **{k: v for k, v in reader.items() if k.startswith(("prefill", "sentences"))},
        **{k: v for k, v in llmlingua.items() if k.startswith("llmlingua")},
    }


def smollm2_fit() -> dict[str, float]:
    """SmolLM2's: prefill from the LLMLingua sweep, which served it, sentences from theirs."""
    llmlingua, sentences = stored_fit("context-llmlingua"), stored_fit("context-sentences")
    return {
        **{k: v for k, v in llmlingua.items() if k.startswith(("prefill", "llmlingua"))},
        **{k: v for k, v in sentences.items() if k.startswith("sentences")},
    }


def test_the_config_defaults_are_the_fit_for_the_reader_make_run_serves():
    assert flat(CostModelConfig().model_dump()) == cited("context-sentences-15b")
    run = json.loads((ROOT / "docs/results/context-sentences-15b/context.json").read_text())
    shipped = yaml.safe_load((ROOT / "serve_config.yaml").read_text())["applications"][0]
    assert run["config"]["base_config"].endswith("serve_config.yaml")
    assert "cost_model" not in shipped["args"]["compression"]  # make run: the defaults


@pytest.mark.parametrize("profile", ["serve_config.scale.yaml", "serve_config.multinode.yaml"])
def test_the_profiles_serving_smollm2_ship_its_fit(profile):
    document = yaml.safe_load((ROOT / profile).read_text())
    args = document["applications"][0]["args"]
    assert "smollm2" in args["generator"]["model_source"]

    config = parse_config(args)

    assert flat(config.compression.cost_model.model_dump()) == smollm2_fit()
