"""Fault injection into a service this code started: find its processes, kill them.

Only descendants of a process we started are ever touched (the `serve run` or `ray start`
that a harness launched): Ray's workers live in process groups of their own, so ownership
is decided by ancestry, never by name alone.

- `replica_pids(root, deployment)`: the replica actors of one Serve deployment.
- `engine_pids(root)`: vLLM's engine-core processes (the model runs there, not in the
  replica): killing one leaves the replica alive with a dead engine.
- `kill(pid)`: SIGKILL, as a crash would.
"""

from __future__ import annotations

import contextlib
import os
import signal

import psutil

REPLICA_TITLE = "ray::ServeReplica:{app}:{deployment}"
ENGINE_TITLE = "VLLM::EngineCore"


def descendants(root_pid: int) -> list[psutil.Process]:
    """Every living process under `root_pid`, at any depth."""
    try:
        return psutil.Process(root_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def alive(process: psutil.Process) -> bool:
    """Running and not a zombie (a process that vanished meanwhile is not alive)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def titled(root_pid: int, title: str) -> list[int]:
    """Pids under `root_pid` whose process title (argv[0]) starts with `title`, oldest first."""
    found = []
    for process in descendants(root_pid):
        try:
            argv = process.cmdline()
            if argv and argv[0].startswith(title) and process.status() != psutil.STATUS_ZOMBIE:
                found.append((process.create_time(), process.pid))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return [pid for _, pid in sorted(found)]


def replica_pids(root_pid: int, deployment: str, app: str = "rag") -> list[int]:
    return titled(root_pid, REPLICA_TITLE.format(app=app, deployment=deployment))


def engine_pids(root_pid: int) -> list[int]:
    return titled(root_pid, ENGINE_TITLE)


def kill(pid: int, sig: int = signal.SIGKILL) -> None:
    """Send `sig` (SIGKILL: no cleanup, as a crash) to one process that may already be gone."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
