"""harness.vllm_server: the vLLM command from the config, checked against the rules of vLLM's
own parser (written out by hand, no vLLM runs), and the server's run, with a small Python
HTTP server in vLLM's place."""

from __future__ import annotations

import os
import signal
import socket
import sys
from pathlib import Path

import pytest

from app.config import parse_config
from harness import service, vllm_server
from harness.service import ServiceError, free_port
from harness.variant import apply_overrides, first_application
from harness.vllm_server import (
    STOP_TIMEOUT_S,
    VLLM_SERVER_MODULE,
    engine_flag,
    running_vllm,
    vllm_environment,
    vllm_serve_argv,
)

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
    config = parse_config(first_application(ROOT / "serve_config.yaml")[1]["args"]).generator
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
    monkeypatch.setattr(vllm_server, "HEALTH_POLL_S", 0.05)
    port = free_port()
    argv = [sys.executable, "-c", HEALTH_SERVER, str(port)]
    log = tmp_path / "server.log"
    with running_vllm(argv, dict(os.environ), f"http://127.0.0.1:{port}", log, 30) as url:
        assert url == f"http://127.0.0.1:{port}"
        assert "serving" in log.read_text()
    with pytest.raises(OSError):  # nothing listens any more
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_running_vllm_reports_an_early_exit_with_the_log_tail(tmp_path, monkeypatch):
    monkeypatch.setattr(vllm_server, "HEALTH_POLL_S", 0.05)
    argv = [sys.executable, "-c", "import sys; print('bad flag --nope'); sys.exit(2)"]
    with (
        pytest.raises(ServiceError, match=r"vllm serve exited with 2:\nbad flag --nope"),
        running_vllm(argv, dict(os.environ), "http://127.0.0.1:9", tmp_path / "log", 30),
    ):
        pass


def test_running_vllm_stops_the_server_when_the_body_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(vllm_server, "HEALTH_POLL_S", 0.05)
    port = free_port()
    argv = [sys.executable, "-c", HEALTH_SERVER, str(port)]
    stopped: list[tuple[int | None, float]] = []
    real_stop = service.stop_process

    def stop(process, grace_s):
        real_stop(process, grace_s)
        stopped.append((process.returncode, grace_s))

    monkeypatch.setattr(service, "stop_process", stop)
    with (
        pytest.raises(KeyboardInterrupt),
        running_vllm(argv, dict(os.environ), f"http://127.0.0.1:{port}", tmp_path / "log", 30),
    ):
        raise KeyboardInterrupt
    assert stopped == [(-signal.SIGTERM, STOP_TIMEOUT_S)]


def test_external_generator_overrides_point_the_application_at_the_server():
    _, application = first_application(ROOT / "serve_config.yaml")
    overrides = vllm_server.external_generator_overrides("http://127.0.0.1:9001", 45.0)

    config = parse_config(apply_overrides(application["args"], overrides))

    assert config.generator.engine == "openai"
    assert config.generator.openai is not None
    assert config.generator.openai.base_url == "http://127.0.0.1:9001/v1"
    assert config.generator.openai.read_timeout_s == 45.0
    assert config.generator.deployment["ray_actor_options"] == {"num_cpus": 0.1}
