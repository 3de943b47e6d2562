"""corpus.job_thread: the job thread's priority is lowered, and only that thread's."""

from __future__ import annotations

import os
import sys

import pytest

from corpus.job_thread import job_executor, lower_this_thread

linux = pytest.mark.skipif(sys.platform != "linux", reason="per-thread scheduling is Linux's")


def scheduling_of_this_thread() -> tuple[int, int]:
    return os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0)


@linux
def test_idle_puts_the_job_thread_under_sched_idle_and_leaves_the_caller_alone():
    before = scheduling_of_this_thread()
    with job_executor("idle", 10) as executor:
        policy, _ = executor.submit(scheduling_of_this_thread).result()
        # The same (only) thread runs every job.
        again = executor.submit(scheduling_of_this_thread).result()

    assert policy == os.SCHED_IDLE and again[0] == os.SCHED_IDLE
    assert scheduling_of_this_thread() == before


@linux
def test_nice_sets_the_job_threads_nice_value_only():
    before = scheduling_of_this_thread()
    with job_executor("nice", 7) as executor:
        policy, niceness = executor.submit(scheduling_of_this_thread).result()

    assert policy == os.SCHED_OTHER and niceness == 7
    assert scheduling_of_this_thread() == before


def test_without_sched_idle_it_falls_back_to_the_nice_value(monkeypatch):
    monkeypatch.delattr(os, "SCHED_IDLE", raising=False)
    with job_executor("nice", 0) as executor:
        applied = executor.submit(lower_this_thread, "idle", 5).result()

    assert applied == "nice 5"
