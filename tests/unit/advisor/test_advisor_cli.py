"""advisor.cli: the report, measured figures beside their floors, and the CLI.

The floors themselves are checked against hand-worked values in test_advisor_floors.py, the
techniques' gains in test_advisor_recommendations.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from advisor.cli import advise, load_bench_result, main
from advisor.floors import MEMORY_BOUND_DECODE, Workload
from advisor.hardware import GPUS, MODELS

REPO_ROOT = Path(__file__).resolve().parents[3]
LLAMA_8B = MODELS["llama-3-8b"]
L4 = GPUS["l4"]


def close(expected: float):
    return pytest.approx(expected, rel=1e-9)


def test_bench_result_is_joined_with_ratios(tmp_path):
    path = tmp_path / "result.json"
    path.write_text(json.dumps({"tpot_ms": 108.02786133333333, "output_tokens_per_s": 9.0}))
    report = advise(LLAMA_8B, L4, Workload(1000, 200), measured=load_bench_result(path))
    measured = {m.metric: m for m in report.measured}
    # TPOT floor 54.01393 ms (the L4 floors in test_advisor_floors.py) -> ratio 2.0;
    # ceiling 18.51374 tokens/s -> 9 / 18.51374.
    assert measured["tpot_ms"].ratio == close(2.0)
    assert measured["output_tokens_per_s"].bound_kind == "ceiling"
    assert measured["output_tokens_per_s"].ratio == close(9.0 * 0.05401393066666667)
    assert "ttft_ms" not in measured


def test_bench_result_rejects_unknown_keys(tmp_path):
    path = tmp_path / "result.json"
    path.write_text(json.dumps({"ttft": 3.0}))
    with pytest.raises(ValueError, match="unknown keys"):
        load_bench_result(path)


CLI_ARGS = [
    "--model",
    "llama-3-8b",
    "--gpu",
    "l4",
    "--quantization",
    "awq",
    "--prompt-tokens",
    "2000",
    "--output-tokens",
    "200",
    "--concurrency",
    "16",
]


def test_cli_json_parses(capsys):
    assert main([*CLI_ARGS, "--cached-tokens", "256", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["floors"]["kv_bytes_per_token"] == 131072
    assert report["floors"]["max_concurrent_sequences"] == 52
    assert report["floors"]["prefill_tokens"] == 1744
    assert report["bottleneck"] == MEMORY_BOUND_DECODE
    assert {r["technique"] for r in report["recommendations"]} >= {
        "speculative decoding",
        "prefix caching",
        "more replicas",
    }


def test_cli_text_joins_a_bench_result(capsys, tmp_path):
    path = tmp_path / "result.json"
    path.write_text(json.dumps({"ttft_ms": 531.0, "tpot_ms": 66.6}))
    assert main([*CLI_ARGS, "--bench-result", str(path)]) == 0
    out = capsys.readouterr().out
    assert "bottleneck: memory-bandwidth-bound decode" in out
    assert "measured vs bound" in out
    assert "ttft_ms" in out


def test_cli_custom_model_and_gpu_by_numbers(capsys):
    # The toy model on the toy GPU: 2e9 B of weights, 20,000 B of KV per token.
    argv = [
        *("--params", "1e9", "--layers", "10", "--kv-heads", "5", "--head-dim", "100"),
        *("--bandwidth-gb-per-s", "1000", "--peak-tflops", "100", "--memory-gb", "12"),
        *("--prompt-tokens", "600", "--output-tokens", "400", "--json"),
    ]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["floors"]["weight_bytes"] == 2e9
    assert report["floors"]["kv_bytes_per_token"] == 20000
    assert report["floors"]["ridge_flops_per_byte"] == 100


def test_cli_rejects_an_incomplete_custom_model(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--params", "1e9", "--gpu", "l4", "--prompt-tokens", "10", "--output-tokens", "1"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    # The real flag spellings, and only the missing ones.
    assert "--layers, --kv-heads, --head-dim" in err
    assert "--params" not in err.split("error:")[1]


def test_module_runs_as_a_script():
    result = subprocess.run(
        [sys.executable, "-m", "advisor", *CLI_ARGS, "--json"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert json.loads(result.stdout)["gpu"]["name"] == "L4"
