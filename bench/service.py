"""Start the real application from a serve config, wait until it is ready, stop it cleanly.

Used by the benchmarks (one service per variant) and the integration tests. It runs
`serve run CONFIG` exactly as a user does, in its own process group.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


class ServiceError(RuntimeError):
    """The service exited or did not become ready; the message ends with its log tail."""


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class RunningService:
    """A started `serve run`: where it answers, and the pid whose descendants are its
    processes (the Ray instance it started included)."""

    base_url: str
    pid: int


@contextmanager
def started_service(
    config_path: Path,
    port: int,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    ready_timeout_s: float = 420,
) -> Iterator[RunningService]:
    """Run `serve run config_path` (whose HTTP port must be `port`) until it is ready.

    On exit the application and the Ray instance it started are torn down.
    """
    serve_bin = Path(sys.executable).with_name("serve")
    environment = os.environ | {"RAY_USAGE_STATS_ENABLED": "0"} | dict(env or {})
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [str(serve_bin), "run", str(config_path)],
            cwd=ROOT,
            env=environment,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base_url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(base_url, process, log_path, ready_timeout_s)
        yield RunningService(base_url, process.pid)
    finally:
        _stop(process)


@contextmanager
def running_service(
    config_path: Path,
    port: int,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    ready_timeout_s: float = 420,
) -> Iterator[str]:
    """`started_service`, yielding only its base URL."""
    with started_service(config_path, port, log_path, env, ready_timeout_s) as service:
        yield service.base_url


def _wait_ready(base_url: str, process: subprocess.Popen, log_path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServiceError(f"serve run exited with {process.returncode}:\n{tail(log_path)}")
        try:
            if httpx.get(f"{base_url}/readyz", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(3)
    raise ServiceError(f"service not ready after {timeout_s:.0f} s:\n{tail(log_path)}")


def _stop(process: subprocess.Popen) -> None:
    """Stop `serve run` and the Ray instance it started: every process of the session we
    started it in, and nothing else. SIGTERM (a background `serve run` ignores SIGINT), then
    SIGKILL for whatever is left after a grace period."""
    stop_process_group(process.pid)
    process.wait()


def stop_process_group(pgid: int, grace_s: float = 30.0) -> None:
    """SIGTERM the process group `pgid` (one this code started), wait up to `grace_s` for it
    to empty, then SIGKILL what remains."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not _group_alive(pgid):
            return
        time.sleep(0.5)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    # Zombies of the group still count for killpg; only the leader is ours to reap.
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pgid, os.WNOHANG)
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def tail(path: Path, lines: int = 60) -> str:
    """The last `lines` lines of a log file."""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
