"""harness.processes against a small process tree started here: a Python root whose children take
Ray's and vLLM's process titles (`exec -a`), one of them with a child of its own. Only what
lies under the given root is found. Every process started here is killed by its pid, found
with psutil directly, never through harness.processes (a broken `descendants` must not make the
cleanup kill processes that are not ours)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable

import psutil
import pytest

from harness import processes

RETRIEVER = "ray::ServeReplica:rag:Retriever"
GENERATOR = "ray::ServeReplica:rag:Generator"

# Starts two Retriever replicas (50 ms apart, so their start times differ), a Generator
# replica whose own child is the engine, and a plain worker; prints their pids (exec keeps
# the pid of each bash child); never reaps them, so a killed child stays a zombie.
ROOT = """
import json, subprocess, time
def start(command):
    return subprocess.Popen(["bash", "-c", command])
first = start('exec -a "ray::ServeReplica:rag:Retriever" sleep 60')
time.sleep(0.05)
second = start('exec -a "ray::ServeReplica:rag:Retriever" sleep 60')
generator = start(
    '(exec -a VLLM::EngineCore sleep 60) & exec -a "ray::ServeReplica:rag:Generator" sleep 60'
)
worker = start('exec -a "ray::IDLE" sleep 60')
print(json.dumps([first.pid, second.pid, generator.pid, worker.pid]), flush=True)
time.sleep(60)
"""


def wait_for(condition, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def kill_and_reap(process: subprocess.Popen, started: Iterable[int] = ()) -> None:
    """SIGKILL `process`, its children and the pids in `started`, found with psutil alone:
    cleanup must not trust the code under test to say which processes are ours."""
    try:
        children = [p.pid for p in psutil.Process(process.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        children = []
    for pid in {*children, *started} - {os.getpid(), process.pid}:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if process.poll() is None:
        process.kill()
    process.wait(timeout=10)


@pytest.fixture
def tree():
    """(root Popen, pids of: first retriever, second retriever, generator, idle worker,
    engine). Every process of the tree is killed afterwards, by pid."""
    root = subprocess.Popen([sys.executable, "-c", ROOT], stdout=subprocess.PIPE, text=True)
    started: list[int] = []
    try:
        first, second, generator, worker = json.loads(root.stdout.readline())
        started += [first, second, generator, worker]

        def ready():
            # Every child has taken its title, and the engine has started under the
            # generator (read with psutil, not with the code under test).
            titles = [argv0(pid) for pid in (first, second, generator, worker)]
            if titles != [RETRIEVER, RETRIEVER, GENERATOR, "ray::IDLE"]:
                return None
            engines = psutil.Process(generator).children()
            if len(engines) == 1 and argv0(engines[0].pid) == "VLLM::EngineCore":
                return engines[0].pid
            return None

        engine = wait_for(ready)
        started.append(engine)
        yield root, (first, second, generator, worker, engine)
    finally:
        kill_and_reap(root, started)  # reparented ones included
        root.stdout.close()


def argv0(pid: int) -> str:
    try:
        return (psutil.Process(pid).cmdline() or [""])[0]
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return ""


@pytest.fixture
def outsider():
    """A Retriever-titled process that is not under the tree's root."""
    process = subprocess.Popen(["bash", "-c", f'exec -a "{RETRIEVER}" sleep 60'])
    try:
        wait_for(lambda: argv0(process.pid) == RETRIEVER)
        yield process
    finally:
        kill_and_reap(process)


def test_descendants_are_every_process_under_the_root_at_any_depth(tree, outsider):
    root, (first, second, generator, worker, engine) = tree

    found = {process.pid for process in processes.descendants(root.pid)}

    assert found == {first, second, generator, worker, engine}
    assert {p.pid for p in processes.descendants(generator)} == {engine}
    assert processes.descendants(engine) == []


def test_descendants_of_a_gone_process_are_none():
    process = subprocess.Popen(["true"])
    process.wait()
    assert processes.descendants(process.pid) == []


def test_replica_pids_are_the_titled_descendants_oldest_first(tree, outsider):
    root, (first, second, generator, _, engine) = tree

    assert processes.replica_pids(root.pid, "Retriever") == [first, second]
    assert outsider.pid not in processes.replica_pids(root.pid, "Retriever")
    assert processes.replica_pids(root.pid, "Generator") == [generator]
    assert processes.replica_pids(root.pid, "Compressor") == []
    assert processes.replica_pids(root.pid, "Retriever", app="other") == []
    assert processes.engine_pids(root.pid) == [engine]
    # Under the generator replica only: the engine is its child.
    assert processes.engine_pids(generator) == [engine]
    assert processes.replica_pids(generator, "Generator") == []  # the root itself is not listed


def test_titled_matches_the_start_of_argv0(tree):
    root, (first, second, generator, worker, _) = tree

    assert processes.titled(root.pid, "ray::ServeReplica:") == [first, second, generator]
    assert processes.titled(root.pid, "ray::") == [first, second, generator, worker]
    assert processes.titled(root.pid, GENERATOR) == [generator]
    # argv[0] is the title; the arguments after it are not searched.
    assert processes.titled(root.pid, "60") == []
    assert processes.titled(root.pid, "sleep") == []


def test_titled_under_a_root_without_such_children_is_empty(outsider):
    assert processes.titled(os.getpid(), "no-such-title::") == []
    # The outsider is our own child, so it is found from here (so are the real replicas of
    # a service this pytest session started, if any: they are ours too).
    ours = processes.titled(os.getpid(), RETRIEVER)
    assert outsider.pid in ours
    assert all(RETRIEVER in " ".join(psutil.Process(pid).cmdline()) for pid in ours)


def test_kill_ends_one_replica_and_leaves_the_rest(tree):
    root, (first, second, generator, worker, engine) = tree
    victim = psutil.Process(first)

    processes.kill(first)

    # The root never reaps its children: the victim stays a zombie, which is not alive and
    # no longer listed as a replica.
    wait_for(lambda: not processes.alive(victim))
    assert victim.status() == psutil.STATUS_ZOMBIE
    assert processes.replica_pids(root.pid, "Retriever") == [second]
    assert all(processes.alive(psutil.Process(pid)) for pid in (second, generator, worker, engine))


def test_kill_of_the_engine_leaves_its_replica_alive(tree):
    root, (_, _, generator, _, engine) = tree

    processes.kill(engine, signal.SIGTERM)

    wait_for(lambda: processes.engine_pids(root.pid) == [])
    assert processes.replica_pids(root.pid, "Generator") == [generator]


def test_kill_tolerates_a_process_that_is_already_gone():
    process = subprocess.Popen(["true"])
    process.wait()

    processes.kill(process.pid, 0)  # signal 0: no harm even if the pid were reused meanwhile
    with open("/proc/sys/kernel/pid_max") as pid_max:
        processes.kill(int(pid_max.read()) + 1)  # a pid that cannot exist, with SIGKILL


def test_alive():
    process = subprocess.Popen(["sleep", "60"])
    handle = psutil.Process(process.pid)
    try:
        assert processes.alive(handle)
        processes.kill(process.pid)
        wait_for(lambda: handle.status() == psutil.STATUS_ZOMBIE)
        assert not processes.alive(handle)  # dead, not yet reaped
    finally:
        kill_and_reap(process)
    assert not processes.alive(handle)  # reaped: gone
