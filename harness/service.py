"""Start the real application from a serve config, wait until it is ready, stop it cleanly.

Used by the benchmarks (one service per variant) and the integration tests. It runs
`serve run CONFIG` exactly as a user does, in its own process group.

Any other server (`vllm serve` in harness.vllm_server) is started, awaited and stopped the same
way by `running_server`. Processes are stopped only through the process group this code
started them in, never by name and never with `ray stop`.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from app.proxy_guard import PROXY_CALLBACK, PROXY_CALLBACK_ENV
from harness import processes

ROOT = Path(__file__).resolve().parent.parent
# Seconds between readiness polls of `serve run`.
SERVICE_POLL_S = 0.5
# How long a stopped server's process group may take to exit before it is killed.
STOP_GRACE_S = 30.0
# What every service started here runs with: no usage reports, the key check in Serve's proxy.
SERVICE_ENVIRONMENT = {"RAY_USAGE_STATS_ENABLED": "0", PROXY_CALLBACK_ENV: PROXY_CALLBACK}


class ServiceError(RuntimeError):
    """A service or server exited or did not become ready; the message ends with its log tail."""


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class RunningService:
    """A started `serve run`: where it answers, the pid whose descendants are its processes
    (the Ray instance it started included), and that Ray instance's own temp dir and
    dashboard (its session files, metrics discovery and Serve API: never another
    instance's, whatever else runs on the machine)."""

    base_url: str
    pid: int
    ray_tmpdir: Path | None = None
    dashboard_url: str | None = None

    @property
    def metrics_discovery_file(self) -> Path:
        """Where this instance lists its metrics export endpoints (Prometheus file_sd)."""
        if self.ray_tmpdir is None:
            raise ServiceError("this service was not started with a Ray temp dir of its own")
        return self.ray_tmpdir / "ray" / "session_latest" / "prom_metrics_service_discovery.json"


class ServiceLaunch:
    """`serve run config_path` started now and awaited later (`ready()`), so a caller can
    overlap the minutes of a start with other work; `stop()` ends it (idempotent).

    The Ray instance gets a temp dir of its own (RAY_TMPDIR, unless `env` names one), so
    its session files are never confused with another instance's on the machine; it is
    removed on stop. `launcher` prefixes the command (e.g. `taskset -c 0`)."""

    def __init__(
        self,
        config_path: Path,
        port: int,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        launcher: Sequence[str] = (),
    ) -> None:
        serve_bin = Path(sys.executable).with_name("serve")
        environment = os.environ | SERVICE_ENVIRONMENT | dict(env or {})
        self._own_tmpdir = "RAY_TMPDIR" not in environment
        if self._own_tmpdir:
            # Short, in /tmp: Ray's socket paths live under it and must stay under 108 bytes.
            environment["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="ray", dir="/tmp")
        self.ray_tmpdir = Path(environment["RAY_TMPDIR"])
        self.base_url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        self._running: RunningService | None = None
        # `--address local`: always a Ray instance of its own, never one found on this machine
        # (a `ray start` cluster, or the stale address file a stopped one leaves behind).
        argv = [*launcher, str(serve_bin), "run", "--address", "local", str(config_path)]
        self.process = start_server(argv, log_path, environment)
        self.started_at = time.monotonic()

    def ready(self, ready_timeout_s: float = 420) -> RunningService:
        """Block until /readyz answers 200 (ServiceError with the log's tail if `serve run`
        exits first or `ready_timeout_s` passes from the launch)."""
        if self._running is None:
            remaining_s = max(0.0, ready_timeout_s - (time.monotonic() - self.started_at))
            ready_url = f"{self.base_url}/readyz"
            _wait_ready(
                self.process, ready_url, self.log_path, "serve run", remaining_s, SERVICE_POLL_S
            )
            self._running = RunningService(
                self.base_url, self.process.pid, self.ray_tmpdir, dashboard_url(self.log_path)
            )
        return self._running

    def stop(self) -> None:
        if self.process.returncode is None:
            stop_process(self.process)
        if self._own_tmpdir:
            shutil.rmtree(self.ray_tmpdir, ignore_errors=True)


@contextmanager
def started_service(
    config_path: Path,
    port: int,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    ready_timeout_s: float = 420,
    launcher: Sequence[str] = (),
) -> Iterator[RunningService]:
    """Run `serve run config_path` (whose HTTP port must be `port`) until it is ready
    (`ServiceLaunch`).

    On exit the application and the Ray instance it started are torn down: every process of
    the session it was started in (SIGTERM, since a background `serve run` ignores SIGINT,
    then SIGKILL for whatever is left after a grace period), and nothing else.
    """
    launch = ServiceLaunch(config_path, port, log_path, env, launcher)
    try:
        yield launch.ready(ready_timeout_s)
    finally:
        launch.stop()


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


# Ray's line at start-up, colours and all: "... View the dashboard at http://127.0.0.1:8266".
_DASHBOARD_LINE = re.compile(r"View the dashboard at (?:\x1b\[[0-9;]*m)*(http://[0-9.]+:[0-9]+)")


def dashboard_url(log_path: Path) -> str | None:
    """The dashboard address the Ray instance of a `serve run` log announced (8265 is only
    its first choice: a busy port moves it), or None if the log names none."""
    found = _DASHBOARD_LINE.search(log_path.read_text(errors="replace"))
    return found.group(1) if found else None


# --- changing a running application ------------------------------------------------------


def ray_auth_headers() -> dict[str, str]:
    """The Authorization header Ray's token authentication asks of its dashboard's HTTP API
    (RAY_AUTH_TOKEN, else the file RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token), or none."""
    token = os.environ.get("RAY_AUTH_TOKEN", "").strip()
    if not token:
        path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
        token = path.read_text().strip() if path.exists() else ""
    return {"Authorization": f"Bearer {token}"} if token else {}


def serve_applications(service: RunningService) -> dict[str, Any]:
    """Serve's own account of the service's applications (the dashboard's Serve API, as
    `serve status` reads it): application name -> its details."""
    if service.dashboard_url is None:
        raise ServiceError("the service's dashboard address is unknown")
    response = httpx.get(
        f"{service.dashboard_url}/api/serve/applications/",
        headers=ray_auth_headers(),
        timeout=30,
        trust_env=False,
    )
    response.raise_for_status()
    return dict(response.json().get("applications") or {})


def deploy_user_config(
    service: RunningService,
    config_path: Path,
    deployment: str,
    user_config: Mapping[str, Any],
    timeout_s: float = 180,
) -> None:
    """`serve deploy` the serve config at `config_path` (the one the service runs) with
    `user_config` for `deployment` of its first application: Serve reconfigures that
    deployment's running replicas in place. Returns once Serve reports the new user_config
    applied and the application running again; ServiceError otherwise."""
    document = yaml.safe_load(config_path.read_text())
    application = document["applications"][0]
    others = [d for d in application.get("deployments", []) if d.get("name") != deployment]
    application["deployments"] = [*others, {"name": deployment, "user_config": dict(user_config)}]
    deployed = config_path.with_name(f"{config_path.stem}.deployed.yaml")
    deployed.write_text(yaml.safe_dump(document))
    serve_bin = Path(sys.executable).with_name("serve")
    result = subprocess.run(
        [str(serve_bin), "deploy", "--address", str(service.dashboard_url), str(deployed)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=os.environ | {"RAY_AUTH_MODE": "token"},
    )
    if result.returncode != 0:
        raise ServiceError(f"serve deploy failed:\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
    name = application["name"]
    deadline = time.monotonic() + timeout_s
    details: dict[str, Any] = {}
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            details = serve_applications(service).get(name, {})
            state = details.get("deployments", {}).get(deployment, {})
            applied = state.get("deployment_config", {}).get("user_config") == dict(user_config)
            if applied and details.get("status") == "RUNNING" and state.get("status") == "HEALTHY":
                return
        time.sleep(SERVICE_POLL_S)
    raise ServiceError(f"{deployment}'s user_config not applied in {timeout_s:.0f} s: {details}")


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
    process = start_server(argv, log_path, env)
    try:
        _wait_ready(process, ready_url, log_path, name, ready_timeout_s, poll_s)
        yield process
    finally:
        stop_process(process, stop_grace_s)


def start_server(argv: Sequence[str], log_path: Path, env: Mapping[str, str]) -> subprocess.Popen:
    """Start `argv` from the repository root in a session of its own (so that its process
    group is ours to stop), its output in `log_path`; do not wait for it."""
    with log_path.open("wb") as log:
        return subprocess.Popen(
            list(argv),
            cwd=ROOT,
            env=dict(env),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def wait_ready(
    process: subprocess.Popen, ready_url: str, log_path: Path, name: str, timeout_s: float
) -> None:
    """Poll GET `ready_url` until it answers 200, for a server `start_server` started
    (ServiceError, with the log's tail, when it exits first or `timeout_s` passes)."""
    _wait_ready(process, ready_url, log_path, name, timeout_s, SERVICE_POLL_S)


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
        while True:  # asked at least once: a server launched long ago may be ready by now
            if process.poll() is not None:
                raise ServiceError(f"{name} exited with {process.returncode}:\n{tail(log_path)}")
            try:
                if client.get(ready_url).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() >= deadline:
                break
            time.sleep(poll_s)
    raise ServiceError(f"{name} not ready after {timeout_s:.0f} s:\n{tail(log_path)}")


def wait_for_every_stage(
    base_url: str, timeout_s: float = 300, poll_s: float = SERVICE_POLL_S
) -> None:
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
    others = [p for p in processes.descendants(process.pid) if _own_group(p.pid) != process.pid]
    stop_process_group(process.pid, grace_s, leader=process)
    process.wait()
    deadline = time.monotonic() + grace_s
    while others and time.monotonic() < deadline:
        others = [p for p in others if processes.alive(p)]
        time.sleep(0.2)
    for survivor in others:
        processes.kill(survivor.pid)


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
