"""Start the real application once per test module, exactly as a user does: `serve run`.

The config is serve_config.yaml with only the HTTP port changed (to a free one) and
API keys required, so the tests go through the same auth a production deploy uses.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 420
API_KEY = "integration-test-key-0123456789"


@dataclass(frozen=True)
class Service:
    base_url: str
    api_key: str
    config: dict

    def client(self, **kwargs) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.api_key}"}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=300, **kwargs)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    port = _free_port()
    config["http_options"]["port"] = port
    config_path = tmp_path_factory.mktemp("serve") / "serve_config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    log_path = config_path.with_name("serve.log")

    env = os.environ | {"RAG_API_KEYS": API_KEY, "RAY_USAGE_STATS_ENABLED": "0"}
    serve_bin = Path(sys.executable).with_name("serve")
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [str(serve_bin), "run", str(config_path)],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base_url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(base_url, process, log_path)
        yield Service(base_url, API_KEY, config["applications"][0]["args"])
    finally:
        _stop(process)


def _wait_ready(base_url: str, process: subprocess.Popen, log_path: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"serve run exited with {process.returncode}:\n{_tail(log_path)}")
        try:
            if httpx.get(f"{base_url}/readyz", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(3)
    pytest.fail(f"service not ready after {READY_TIMEOUT_S} s:\n{_tail(log_path)}")


def _stop(process: subprocess.Popen) -> None:
    # SIGINT lets `serve run` tear down the application and the Ray instance it started.
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    ray_bin = Path(sys.executable).with_name("ray")
    subprocess.run([str(ray_bin), "stop", "--force"], capture_output=True, check=False)


def _tail(path: Path, lines: int = 60) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
