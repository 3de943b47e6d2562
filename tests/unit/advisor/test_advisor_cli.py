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
    path.write_text(json.dumps({"tpot_ms": 101.02337365333333, "output_tokens_per_s": 9.0}))
    report = advise(LLAMA_8B, L4, Workload(1000, 200), measured=load_bench_result(path))
    measured = {m.metric: m for m in report.measured}
    # TPOT floor 50.51169 ms (the L4 floors in test_advisor_floors.py) -> ratio 2.0;
    # ceiling 19.79740 tokens/s -> 9 / 19.79740.
    assert measured["tpot_ms"].ratio == close(2.0)
    assert measured["output_tokens_per_s"].bound_kind == "ceiling"
    assert measured["output_tokens_per_s"].ratio == close(9.0 * 0.05051168682666667)
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


def test_cli_takes_a_probed_device_instead_of_a_gpu(capsys, tmp_path):
    probe = tmp_path / "device.json"
    probe.write_text(
        json.dumps(
            {
                "name": "a 2-thread CPU",
                "memory_bandwidth_gb_per_s": 20.0,
                "bf16_tflops": 2.0,
                "int8_tops": 4.0,
                "memory_gb": 24.0,
            }
        )
    )
    args = ["--model", "qwen2.5-coder-1.5b", "--prompt-tokens", "900", "--output-tokens", "32"]

    assert main([*args, "--device", str(probe), "--quantization", "int8", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    # A step reads 1,777,088,000 B of int8 weights and 16-bit LM head, plus the KV cache of
    # 916 tokens x 28,672 B (2 x 28 x 2 x 128 x 2 B) = 26,263,552 B: / 20e9 B/s = 90.168 ms.
    assert report["gpu"]["name"] == "a 2-thread CPU"
    assert report["floors"]["tpot_floor_ms"] == close((1_777_088_000 + 26_263_552) / 20e9 * 1e3)
    with pytest.raises(SystemExit):
        main([*args, "--device", str(probe), "--gpu", "l4"])
    assert "not both" in capsys.readouterr().err


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
