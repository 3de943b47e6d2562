"""Start the real application from a serve config, wait until it is ready, stop it cleanly.

Used by the benchmarks (one service per variant) and the integration tests. It runs
`serve run CONFIG` exactly as a user does, in its own process group.

Any other server (`vllm serve` in bench.vllm_server) is started, awaited and stopped the same
way by `running_server`. Processes are stopped only through the process group this code
started them in, never by name and never with `ray stop`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench import faults

ROOT = Path(__file__).resolve().parent.parent
# Seconds between readiness polls of `serve run`.
SERVICE_POLL_S = 3.0
# How long a stopped server's process group may take to exit before it is killed.
STOP_GRACE_S = 30.0


class ServiceError(RuntimeError):
    """A service or server exited or did not become ready; the message ends with its log tail."""


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
    launcher: Sequence[str] = (),
) -> Iterator[RunningService]:
    """Run `serve run config_path` (whose HTTP port must be `port`) until it is ready;
    `launcher` prefixes the command (e.g. `taskset -c 0` to pin it and all it starts).

    On exit the application and the Ray instance it started are torn down: every process of
    the session it was started in (SIGTERM, since a background `serve run` ignores SIGINT,
    then SIGKILL for whatever is left after a grace period), and nothing else.
    """
    serve_bin = Path(sys.executable).with_name("serve")
    environment = os.environ | {"RAY_USAGE_STATS_ENABLED": "0"} | dict(env or {})
    base_url = f"http://127.0.0.1:{port}"
    # `--address local`: always a Ray instance of its own, never one found on this machine
    # (a `ray start` cluster, or the stale address file a stopped one leaves behind).
    with running_server(
        [*launcher, str(serve_bin), "run", "--address", "local", str(config_path)],
        f"{base_url}/readyz",
        log_path,
        env=environment,
        name="serve run",
        ready_timeout_s=ready_timeout_s,
        poll_s=SERVICE_POLL_S,
    ) as process:
        yield RunningService(base_url, process.pid)


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


# --- any server: started in its own session, stopped by its process group ----------------


@contextmanager
def running_server(
    argv: Sequence[str],
    ready_url: str,
    log_path: Path,
    *,
    env: Mapping[str, str],
    name: str,
    ready_timeout_s: float,
    poll_s: float,
    stop_grace_s: float = STOP_GRACE_S,
) -> Iterator[subprocess.Popen]:
    """Run `argv` from the repository root in a session of its own, its output in
    `log_path`, and yield the process once GET `ready_url` answers 200 (ServiceError, with
    the log's tail, when it exits first or is not ready within `ready_timeout_s`). On exit,
    whatever happened (an error, Ctrl-C), its process group is stopped (`stop_process`)."""
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            list(argv),
            cwd=ROOT,
            env=dict(env),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait_ready(process, ready_url, log_path, name, ready_timeout_s, poll_s)
        yield process
    finally:
        stop_process(process, stop_grace_s)


def _wait_ready(
    process: subprocess.Popen,
    ready_url: str,
    log_path: Path,
    name: str,
    timeout_s: float,
    poll_s: float,
) -> None:
    """Poll GET `ready_url` every `poll_s` until it answers 200; ServiceError when `process`
    exits first or `timeout_s` passes, naming the server and ending with its log's tail."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(trust_env=False, timeout=5) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise ServiceError(f"{name} exited with {process.returncode}:\n{tail(log_path)}")
            try:
                if client.get(ready_url).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(poll_s)
    raise ServiceError(f"{name} not ready after {timeout_s:.0f} s:\n{tail(log_path)}")


def wait_for_every_stage(base_url: str, timeout_s: float = 300, poll_s: float = 2.0) -> None:
    """/readyz answers 200 once the required stages run; wait until the optional ones (the
    compressor) run too, i.e. until it names no stage as degraded."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(trust_env=False, timeout=10) as client:
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                response = client.get(f"{base_url}/readyz")
                if response.status_code == 200 and response.json().get("degraded") == []:
                    return
            time.sleep(poll_s)
    raise ServiceError(f"a stage of {base_url} is still not running after {timeout_s:.0f} s")


def stop_process(process: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> None:
    """Stop `process`, started with start_new_session, and every process of its group: its
    session, which holds its children (`stop_process_group`); then reap it, keeping its exit
    status in `process.returncode`. Descendants that moved to process groups of their own
    (Ray's workers do) usually exit with their parent; any still alive after the grace
    period are killed by pid, since they too were started under `process`."""
    others = [p for p in faults.descendants(process.pid) if _own_group(p.pid) != process.pid]
    stop_process_group(process.pid, grace_s, leader=process)
    process.wait()
    deadline = time.monotonic() + grace_s
    while others and time.monotonic() < deadline:
        others = [p for p in others if faults.alive(p)]
        time.sleep(0.2)
    for survivor in others:
        faults.kill(survivor.pid)


def _own_group(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def stop_process_group(
    pgid: int, grace_s: float = STOP_GRACE_S, leader: subprocess.Popen | None = None
) -> None:
    """SIGTERM the process group `pgid` (one this code started), wait up to `grace_s` for it
    to empty, then SIGKILL what remains. `leader`: the group's leader as started here, reaped
    through it so that its exit status is kept."""
    if not _signal_group(pgid, signal.SIGTERM):
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not _group_alive(pgid, leader):
            return
        time.sleep(0.2)
    _signal_group(pgid, signal.SIGKILL)


def _group_alive(pgid: int, leader: subprocess.Popen | None) -> bool:
    if not _signal_group(pgid, 0):
        return False
    # A zombie leader still counts for killpg; only the leader is ours to reap.
    if leader is not None:
        leader.poll()
    else:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pgid, os.WNOHANG)
    return _signal_group(pgid, 0)


def _signal_group(pgid: int, signum: int) -> bool:
    """Send `signum` to process group `pgid`; False when the group is gone, or holds only
    processes we may not signal (nothing of ours)."""
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def tail(path: Path, lines: int = 60) -> str:
    """The last `lines` lines of a log file."""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
