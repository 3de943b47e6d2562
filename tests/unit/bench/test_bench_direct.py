"""bench.direct's pure parts: the vLLM command from the config, the comparison arithmetic, the
report; and stopping a server process. No model loads, no vLLM: the command is checked
against the rules of vLLM's own parser, written out by hand, and servers are small Python
processes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from app.api import _plan
from app.config import ConfigError, parse_config
from app.schemas import CompressionOptions, RagOptions
from bench import direct
from bench.direct import (
    VLLM_SERVER_MODULE,
    MetricComparison,
    check_prompts,
    compare_p50,
    compression_plan,
    engine_flag,
    markdown_report,
    mismatch_warning,
    read_serve_config,
    running_vllm,
    stop_process,
    ttft_breakdown,
    vllm_environment,
    vllm_serve_argv,
)
from bench.loadgen import RequestRecord
from bench.service import ServiceError, free_port
from bench.stats import summarize
from pipeline.messages import COMPRESSION_METHODS

ROOT = Path(__file__).resolve().parents[3]


def generator(**engine_kwargs):
    return parse_config(
        {
            "generator": {
                "model_id": "tiny-chat",
                "max_model_len": 4096,
                "engine_kwargs": engine_kwargs,
                "env_vars": {"VLLM_CPU_KVCACHE_SPACE": "2"},
            }
        }
    ).generator


def rec(
    index: int,
    *,
    ttft: float | None = 100.0,
    e2e: float = 1100.0,
    tokens: int = 11,
    ok: bool = True,
    timings: dict[str, float] | None = None,
    prompt: int | None = 900,
    cached: int | None = 256,
    endpoint: str = "rag",
) -> RequestRecord:
    """A finished request, sent at 0 ms; TPOT is (e2e - ttft) / (tokens - 1)."""
    return RequestRecord(
        index,
        endpoint,
        f"question {index}",
        send_at_ms=0.0,
        end_at_ms=e2e,
        ttft_ms=ttft if ok else None,
        e2e_ms=e2e,
        output_tokens=tokens,
        usage_completion_tokens=tokens if ok else None,
        usage_prompt_tokens=prompt if ok else None,
        usage_cached_prompt_tokens=cached if ok else None,
        ok=ok,
        status=200 if ok else 503,
        error_kind=None if ok else "http_503",
        server_timings_ms=timings,
    )


# --- the vLLM command ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "flags"),
    [
        ("enforce_eager", True, ["--enforce-eager"]),
        ("enable_prefix_caching", False, ["--no-enable-prefix-caching"]),
        ("max_num_seqs", 16, ["--max-num-seqs", "16"]),
        ("dtype", "float32", ["--dtype", "float32"]),
        ("gpu_memory_utilization", 0.85, ["--gpu-memory-utilization", "0.85"]),
        ("speculative_config", {"method": "ngram", "num_speculative_tokens": 4},
         ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 4}']),
        ("allowed_origins", ["a", "b"], ["--allowed-origins", "a", "b"]),
        ("quantization", None, []),
        ("middleware", [], []),
    ],
)  # fmt: skip
def test_engine_flag_follows_vllms_config_file_rules(key, value, flags):
    assert engine_flag(key, value) == flags


def test_vllm_command_carries_every_engine_arg_of_the_generator():
    config = generator(dtype="float32", enforce_eager=True, enable_prefix_caching=False,
                       enable_prompt_tokens_details=True, max_num_seqs=16)  # fmt: skip
    argv = vllm_serve_argv("/venv/bin/python", "/models/tiny", config, "127.0.0.1", 8123)

    assert argv == [
        "/venv/bin/python", "-m", VLLM_SERVER_MODULE, "--model", "/models/tiny",
        "--host", "127.0.0.1", "--port", "8123",
        "--served-model-name", "tiny-chat", "--max-model-len", "4096",
        "--dtype", "float32", "--enforce-eager", "--no-enable-prefix-caching",
        "--enable-prompt-tokens-details", "--max-num-seqs", "16",
    ]  # fmt: skip


def test_vllm_command_from_the_shipped_config_names_each_engine_kwarg():
    config = read_serve_config(ROOT / "serve_config.yaml").app.generator
    argv = vllm_serve_argv(sys.executable, "/m", config, "127.0.0.1", 9000)

    assert argv[argv.index("--served-model-name") + 1] == config.model_id
    assert argv[argv.index("--max-model-len") + 1] == str(config.max_model_len)
    for key, value in config.engine_kwargs.items():
        name = key.replace("_", "-")
        flag = f"--no-{name}" if value is False else f"--{name}"
        assert flag in argv, key


@pytest.mark.parametrize("key", ["port", "served_model_name", "model", "host"])
def test_vllm_command_refuses_engine_kwargs_it_sets_itself(key):
    with pytest.raises(ValueError, match=key):
        vllm_serve_argv("python", "/m", generator(**{key: "x"}), "127.0.0.1", 1)


def test_vllm_environment_layers_app_then_generator_vars():
    env = vllm_environment(
        {"PATH": "/bin", "HF_HUB_OFFLINE": "0", "VLLM_CPU_KVCACHE_SPACE": "9"},
        {"HF_HUB_OFFLINE": "1"},
        generator(),
    )
    assert env == {"PATH": "/bin", "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "2"}


# --- the config ---------------------------------------------------------------------------


def test_shipped_serve_config_reads_with_its_replica_environment():
    serve_config = read_serve_config(ROOT / "serve_config.yaml")
    assert serve_config.env_vars["HF_HUB_OFFLINE"] == "1"
    assert serve_config.app.generator.env_vars  # VLLM_CPU_KVCACHE_SPACE and the like


def test_serve_config_errors_name_the_problem(tmp_path):
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump({"applications": []}))
    with pytest.raises(ValueError, match="no 'applications'"):
        read_serve_config(path)
    path.write_text(yaml.safe_dump({"applications": [{"runtime_env": {"env_vars": [1]}}]}))
    with pytest.raises(ValueError, match="env_vars is not a mapping"):
        read_serve_config(path)
    path.write_text(yaml.safe_dump({"applications": [{"args": {"generator": {"bogus": 1}}}]}))
    with pytest.raises(ConfigError, match=r"generator\.bogus"):
        read_serve_config(path)
    path.write_text(yaml.safe_dump({"applications": [{"args": {}}]}))
    assert read_serve_config(path).env_vars == {}


@pytest.mark.parametrize("method", [None, *COMPRESSION_METHODS])
def test_compression_plan_is_the_one_the_ingress_makes(method):
    config = parse_config({"compression": {"rate": 0.3, "target_tokens": 200}})
    options = RagOptions(compression=CompressionOptions(method=method) if method else None)
    assert compression_plan(config, method) == _plan(config, options)


# --- comparison ---------------------------------------------------------------------------


def test_compare_p50_differences_and_ratios():
    # Pipeline: TTFT 300, TPOT (1300 - 300) / 10 = 100, E2E 1300.
    # Direct:   TTFT 200, TPOT (1000 - 200) / 10 = 80,  E2E 1000.
    pipeline = summarize([rec(0, ttft=300, e2e=1300), rec(1, ttft=300, e2e=1300)])
    vllm = summarize([rec(0, ttft=200, e2e=1000), rec(1, ttft=200, e2e=1000)])

    rows = {row.metric: row for row in compare_p50(pipeline, vllm)}
    assert list(rows) == ["TTFT", "TPOT", "E2E"]
    assert rows["TTFT"] == MetricComparison("TTFT", 300.0, 200.0, 100.0, 1.5)
    assert rows["TPOT"].diff_ms == pytest.approx(20.0) and rows["TPOT"].ratio == pytest.approx(1.25)
    assert rows["E2E"] == MetricComparison("E2E", 1300.0, 1000.0, 300.0, 1.3)


def test_compare_p50_without_a_side_has_no_difference():
    pipeline = summarize([rec(0)])
    failed = summarize([rec(0, ok=False)])
    ttft = compare_p50(pipeline, failed)[0]
    assert ttft == MetricComparison("TTFT", 100.0, None, None, None)


def test_ttft_breakdown_splits_each_gap_and_takes_medians():
    stages = [
        {"retrieve": 20.0, "compress": 5.0, "ttft": 260.0, "total": 900.0},
        {"retrieve": 30.0, "compress": 7.0, "ttft": 280.0, "total": 900.0},
        {"retrieve": 40.0, "compress": 9.0, "ttft": 330.0, "total": 900.0},
    ]
    pipeline = [
        rec(0, ttft=300, timings=stages[0]),
        rec(1, ttft=310, timings=stages[1]),
        rec(2, ttft=350, timings=stages[2]),
        rec(3, ttft=999, timings=None),  # no server timings: left out
        rec(4, ok=False),  # failed: left out
    ]
    vllm = [rec(i, ttft=200, endpoint="chat") for i in range(5)]

    parts = ttft_breakdown(pipeline, vllm)
    # Gaps 100, 110, 150; edges (client - server TTFT) 40, 30, 20;
    # rests 100-20-5-40 = 35, 110-30-7-30 = 43, 150-40-9-20 = 81.
    assert parts.questions == 3
    assert (parts.gap_ms, parts.retrieve_ms, parts.compress_ms) == (110.0, 30.0, 7.0)
    assert (parts.edge_ms, parts.rest_ms) == (30.0, 43.0)


def test_ttft_breakdown_without_pairs_is_empty():
    parts = ttft_breakdown([rec(0, ok=False)], [rec(0)])
    assert parts.questions == 0 and parts.gap_ms is None and parts.rest_ms is None


def test_prompt_checks_flag_differences_loudly():
    pipeline = [rec(0, prompt=900), rec(1, prompt=912), rec(2, ok=False)]
    vllm = [rec(0, prompt=900, cached=128), rec(1, prompt=911), rec(2, prompt=880)]

    checks = check_prompts(pipeline, vllm, [900, 912, 880])
    assert [check.status for check in checks] == ["ok", "MISMATCH", "unchecked"]
    assert (checks[0].pipeline_cached_tokens, checks[0].direct_cached_tokens) == (256, 128)
    assert checks[1].question == "question 1" and checks[1].local_prompt_tokens == 912
    warning = mismatch_warning(checks)
    assert warning is not None
    assert warning.startswith("PROMPT MISMATCH on 1 of 3 questions")
    assert "#1 (912 vs 911)" in warning
    assert mismatch_warning(checks[:1]) is None


def test_markdown_report_tables_and_warning():
    timings = {"retrieve": 20.0, "compress": 5.0, "ttft": 260.0, "total": 900.0}
    pipeline_records = [rec(0, ttft=300, e2e=1300, timings=timings, prompt=900)]
    vllm_records = [rec(0, ttft=200, e2e=1000, prompt=901, endpoint="chat")]
    pipeline, vllm = summarize(pipeline_records), summarize(vllm_records)
    checks = check_prompts(pipeline_records, vllm_records, [900])

    report = markdown_report(
        "setup line",
        compare_p50(pipeline, vllm),
        ttft_breakdown(pipeline_records, vllm_records),
        checks,
        pipeline,
        vllm,
    )
    assert "setup line" in report
    assert "**PROMPT MISMATCH on 1 of 1 questions" in report
    assert "| TTFT | 300.0 | 200.0 | +100.0 | 1.50x |" in report
    assert "| retrieve stage | +20.0 | 20% |" in report
    # Gap 100 = retrieve 20 + compress 5 + edge 40 + rest 35.
    assert "| HTTP edge | +40.0 | 40% |" in report
    assert "| generator hop | +35.0 | 35% |" in report
    assert "| 0 | question 0 | 900 | 900 | 901 | 256 / 256 | 11 / 11 | **MISMATCH** |" in report
    assert "## Pipeline: /v1/rag/query through Ray Serve" in report
    assert "| server retrieve | 1 |" in report  # the phase's full table


def test_markdown_report_without_mismatch_has_no_warning():
    records = [rec(0)]
    summary = summarize(records)
    checks = check_prompts(records, records, [None])
    report = markdown_report(
        "s", compare_p50(summary, summary), ttft_breakdown(records, records), checks,
        summary, summary,
    )  # fmt: skip
    assert "MISMATCH" not in report and "| 0 | question 0 | - | 900 | 900 |" in report
    assert "| TTFT | 100.0 | 100.0 | +0.0 | 1.00x |" in report


# --- the server process -------------------------------------------------------------------


def python_process(code: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True
    )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers signal 0; it is dead all the same.
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


def test_stop_process_terminates_a_server():
    process = python_process("import time; print('up', flush=True); time.sleep(60)")
    assert process.stdout is not None and process.stdout.readline().strip() == "up"
    started = time.monotonic()
    stop_process(process, timeout_s=10, grace_s=0.2)
    assert process.returncode == -signal.SIGTERM
    assert time.monotonic() - started < 5


def test_stop_process_kills_a_server_that_ignores_sigterm_and_its_children():
    code = (
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    process = python_process(code)
    assert process.stdout is not None
    child = int(process.stdout.readline())
    stop_process(process, timeout_s=0.5, grace_s=0.2)
    assert process.returncode == -signal.SIGKILL
    deadline = time.monotonic() + 5
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child)


def test_stop_process_kills_children_left_behind_by_the_server():
    code = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    process = python_process(code)
    assert process.stdout is not None
    child = int(process.stdout.readline())
    stop_process(process, timeout_s=10, grace_s=0.2)  # the parent dies, the child lingers
    deadline = time.monotonic() + 5
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child)


HEALTH_SERVER = """
import http.server, sys
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
print("serving", flush=True)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""


def test_running_vllm_yields_once_healthy_and_stops_the_server(tmp_path, monkeypatch):
    monkeypatch.setattr(direct, "HEALTH_POLL_S", 0.05)
    port = free_port()
    argv = [sys.executable, "-c", HEALTH_SERVER, str(port)]
    log = tmp_path / "server.log"
    with running_vllm(argv, dict(os.environ), f"http://127.0.0.1:{port}", log, 30) as url:
        assert url == f"http://127.0.0.1:{port}"
        assert "serving" in log.read_text()
    with pytest.raises(OSError):  # nothing listens any more
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_running_vllm_reports_an_early_exit_with_the_log_tail(tmp_path, monkeypatch):
    monkeypatch.setattr(direct, "HEALTH_POLL_S", 0.05)
    argv = [sys.executable, "-c", "import sys; print('bad flag --nope'); sys.exit(2)"]
    with (
        pytest.raises(ServiceError, match=r"exited with 2:\nbad flag --nope"),
        running_vllm(argv, dict(os.environ), "http://127.0.0.1:9", tmp_path / "log", 30),
    ):
        pass


def test_running_vllm_stops_the_server_when_the_body_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(direct, "HEALTH_POLL_S", 0.05)
    port = free_port()
    argv = [sys.executable, "-c", HEALTH_SERVER, str(port)]
    stopped: list[int | None] = []
    real_stop = direct.stop_process

    def stop(process, *args, **kwargs):
        real_stop(process, *args, **kwargs)
        stopped.append(process.returncode)

    monkeypatch.setattr(direct, "stop_process", stop)
    with (
        pytest.raises(KeyboardInterrupt),
        running_vllm(argv, dict(os.environ), f"http://127.0.0.1:{port}", tmp_path / "log", 30),
    ):
        raise KeyboardInterrupt
    assert stopped == [-signal.SIGTERM]


# --- CLI ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--num-requests", "0"], "--num-requests must be at least 1"),
        (["--max-tokens", "100000"], "--max-tokens must be in 1.."),
        (["--ready-timeout-s", "0"], "--ready-timeout-s must be a positive number"),
    ],
)
def test_cli_refuses_bad_arguments_before_starting_anything(tmp_path, capsys, extra, message):
    with pytest.raises(SystemExit) as exit_info:
        direct.main(["--out", str(tmp_path), *extra])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_cli_refuses_llmlingua_when_the_config_does_not_load_it(tmp_path, capsys):
    document = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    args = document["applications"][0]["args"]
    args["compression"]["llmlingua"]["enabled"] = False
    config = tmp_path / "serve.yaml"
    config.write_text(json.dumps(document))  # JSON is YAML
    with pytest.raises(SystemExit):
        direct.main(["--out", str(tmp_path / "out"), "--base-config", str(config),
                     "--compression", "llmlingua"])  # fmt: skip
    assert "needs compression.llmlingua.enabled" in capsys.readouterr().err
