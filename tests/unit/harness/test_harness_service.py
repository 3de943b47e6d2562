"""harness.service's processes, with small Python processes in place of `serve run` and
`vllm serve`: a server started in its own session, awaited on its readiness URL and stopped
through its process group, and nothing else."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from harness import service
from harness.service import (
    ServiceError,
    free_port,
    running_server,
    started_service,
    stop_process,
    stop_process_group,
)

ROOT = Path(__file__).resolve().parents[3]

# argv: PORT READY_PATH READY_AFTER. Answers READY_PATH with 200 from its READY_AFTER + 1st
# GET on (503 before), anything else with 404; says where it runs before it listens.
SERVER = """
import http.server, os, sys
port, ready_path, ready_after = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
gets = 0
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        global gets
        gets += 1
        if self.path != ready_path:
            self.send_response(404)
        else:
            self.send_response(200 if gets > ready_after else 503)
        self.end_headers()
    def log_message(self, *args):
        pass
print("serving", os.getpid(), os.getcwd(), os.environ.get("SERVER_MARK"), flush=True)
http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


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


def wait_dead(pid: int, timeout_s: float = 5) -> bool:
    deadline = time.monotonic() + timeout_s
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pid)


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def server(port: int, ready_path: str = "/ready", ready_after: int = 0) -> list[str]:
    return [sys.executable, "-c", SERVER, str(port), ready_path, str(ready_after)]


def run(argv: list[str], ready_url: str, log: Path, **options):
    settings = {"env": dict(os.environ), "name": "test server", "ready_timeout_s": 30.0}
    settings |= {"poll_s": 0.05, "stop_grace_s": 10.0} | options
    return running_server(argv, ready_url, log, **settings)


# --- stopping -----------------------------------------------------------------------------


def test_stop_process_terminates_a_server():
    process = python_process("import time; print('up', flush=True); time.sleep(60)")
    assert process.stdout is not None and process.stdout.readline().strip() == "up"
    started = time.monotonic()
    stop_process(process, grace_s=10)
    assert process.returncode == -signal.SIGTERM
    assert time.monotonic() - started < 5


def server_with_child(
    *, server_ignores_sigterm: bool = False, child_ignores_sigterm: bool = False
) -> tuple[subprocess.Popen, int]:
    """A server in a session of its own with one child process: (server, the child's pid),
    once both ignore SIGTERM as asked."""
    ignore = "signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    child = (
        f"import os, signal, time; {ignore if child_ignores_sigterm else ''}"
        "print(os.getpid(), flush=True); time.sleep(60)"
    )
    code = (
        f"import signal, subprocess, sys, time; {ignore if server_ignores_sigterm else ''}"
        f"subprocess.Popen([sys.executable, '-c', {child!r}]); time.sleep(60)"
    )
    process = python_process(code)
    assert process.stdout is not None
    return process, int(process.stdout.readline())


def test_stop_process_kills_a_server_that_ignores_sigterm_and_its_children():
    process, child = server_with_child(server_ignores_sigterm=True)
    stop_process(process, grace_s=0.5)
    assert process.returncode == -signal.SIGKILL
    assert wait_dead(child)


def test_stop_process_kills_children_left_behind_by_the_server():
    process, child = server_with_child()
    stop_process(process, grace_s=10)
    assert process.returncode == -signal.SIGTERM
    assert wait_dead(child)


def test_stop_process_kills_a_child_that_ignores_sigterm_once_the_grace_is_over():
    process, child = server_with_child(child_ignores_sigterm=True)
    started = time.monotonic()
    stop_process(process, grace_s=0.5)
    assert process.returncode == -signal.SIGTERM  # the server exits on SIGTERM ...
    assert time.monotonic() - started >= 0.5  # ... the group does not: the grace runs out
    assert wait_dead(child)


def test_stop_process_group_leaves_other_sessions_alone():
    ours = python_process("import time; print('up', flush=True); time.sleep(60)")
    other = python_process("import time; print('up', flush=True); time.sleep(60)")
    try:
        for process in (ours, other):
            assert process.stdout is not None and process.stdout.readline().strip() == "up"
        stop_process_group(ours.pid, grace_s=5)
        ours.wait(timeout=5)  # already reaped by stop_process_group, which had no leader
        assert not alive(ours.pid)
        assert other.poll() is None and alive(other.pid)
    finally:
        other.kill()
        other.wait()


def test_stop_process_group_of_a_group_that_is_gone_returns_at_once():
    process = python_process("pass")
    process.wait()
    started = time.monotonic()
    stop_process_group(process.pid, grace_s=10)
    assert time.monotonic() - started < 1


# --- running a server ---------------------------------------------------------------------


def test_running_server_yields_once_ready_and_stops_the_server(tmp_path):
    port = free_port()
    log = tmp_path / "server.log"
    url = f"http://127.0.0.1:{port}/ready"
    env = dict(os.environ) | {"SERVER_MARK": "marked"}
    with run(server(port, ready_after=2), url, log, env=env) as process:
        # Two 503s first: only a third poll saw 200, so this fourth GET gets 200 too.
        assert httpx.get(url, trust_env=False).status_code == 200
        words = log.read_text().split()
        assert words[:2] == ["serving", str(process.pid)]
        assert words[2:] == [str(ROOT), "marked"]  # run from the repository root, with env
        assert os.getpgid(process.pid) == process.pid  # a session of its own
    assert process.returncode == -signal.SIGTERM
    assert not listening(port)


def test_running_server_reports_an_early_exit_with_the_log_tail(tmp_path):
    argv = [sys.executable, "-c", "import sys; print('bad flag --nope'); sys.exit(2)"]
    with (
        pytest.raises(ServiceError, match=r"^test server exited with 2:\nbad flag --nope"),
        run(argv, "http://127.0.0.1:9/ready", tmp_path / "log"),
    ):
        pass


def test_running_server_stops_a_server_that_is_never_ready(tmp_path):
    port = free_port()
    log = tmp_path / "log"
    with (
        # 5 s, not 1: on a loaded machine the server's interpreter may not have written
        # its first log line within a second, and the tail is what this checks.
        pytest.raises(ServiceError, match=r"^test server not ready after 5 s:\nserving "),
        run(server(port, ready_after=10**6), f"http://127.0.0.1:{port}/ready", log,
            ready_timeout_s=5.0),
    ):  # fmt: skip
        pass
    pid = int(log.read_text().split()[1])
    assert wait_dead(pid) and not listening(port)


def test_running_server_stops_the_server_when_the_body_fails(tmp_path):
    port = free_port()
    with (
        pytest.raises(KeyboardInterrupt),
        run(server(port), f"http://127.0.0.1:{port}/ready", tmp_path / "log") as process,
    ):
        raise KeyboardInterrupt
    assert process.returncode == -signal.SIGTERM
    assert not listening(port)


# --- `serve run` --------------------------------------------------------------------------


def test_started_service_runs_serve_run_and_waits_for_readyz(tmp_path, monkeypatch):
    """A fake `serve` next to a fake interpreter path: the command, environment, readiness
    URL and stop of `serve run`, with no Ray."""
    port = free_port()
    config = tmp_path / "serve.json"
    config.write_text(json.dumps({"port": port}))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_serve = bin_dir / "serve"
    fake_serve.write_text(
        f"#!{sys.executable}\n"
        "import json, os, runpy, sys\n"
        "assert sys.argv[1:4] == ['run', '--address', 'local'], sys.argv\n"
        "port = json.load(open(sys.argv[4]))['port']\n"
        "print('env', os.environ['RAY_USAGE_STATS_ENABLED'], os.environ['RAG_API_KEYS'])\n"
        f"sys.argv = ['server', str(port), '/readyz', '1']\n"
        f"exec({SERVER!r})\n"
    )
    fake_serve.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python"))
    monkeypatch.setattr(service, "SERVICE_POLL_S", 0.05)
    log = tmp_path / "serve.log"

    with started_service(config, port, log, {"RAG_API_KEYS": "k"}, ready_timeout_s=30) as svc:
        assert svc.base_url == f"http://127.0.0.1:{port}"
        assert httpx.get(f"{svc.base_url}/readyz", trust_env=False).status_code == 200
        assert log.read_text().splitlines()[0] == "env 0 k"
        pid = svc.pid
    assert wait_dead(pid) and not listening(port)
