"""The thread ingestion jobs run on: one, with a CPU priority below the query path's.

On two cores, jobs at nice 10 still slowed queries under continuous ingestion: query p99
2.22x that of quiet phases, the retriever's p50 about 2x (bench.ingestion run 3, in
docs/retired.md); under SCHED_IDLE, which gives the job only CPU time nothing else wants,
p99 was 0.94x and the retriever unchanged (run 4). A likely reason: vLLM's CPU forward pass
runs one OpenMP thread per core and waits at every barrier for the slowest, so a slice of
either core taken by a job stalls the whole pass (bench.thread_contention, without the
service, saw only 1.04x from nice 10 on a two-thread pass). The priority is the thread's own (Linux
schedules threads), so nothing else in the replica, such as listings answered on asyncio's
default threads, is slowed or starved.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

from pipeline.log import get_logger

logger = get_logger(__name__)

Scheduling = Literal["idle", "nice"]


def job_executor(scheduling: Scheduling, niceness: int) -> ThreadPoolExecutor:
    """One worker thread, lowered by `lower_this_thread` as it starts."""
    return ThreadPoolExecutor(
        max_workers=1,
        thread_name_prefix="ingestion-job",
        initializer=_lower_and_log,
        initargs=(scheduling, niceness),
    )


def lower_this_thread(scheduling: Scheduling, niceness: int) -> str:
    """Lower the calling thread's CPU priority: SCHED_IDLE for 'idle' where the OS has it,
    else (or for 'nice') the nice value `niceness`. Returns what was applied."""
    if scheduling == "idle" and hasattr(os, "SCHED_IDLE"):
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            return "SCHED_IDLE"
        except OSError:
            pass
    try:
        os.setpriority(os.PRIO_PROCESS, 0, niceness)
    except OSError:
        return "unchanged"
    return f"nice {niceness}"


def _lower_and_log(scheduling: Scheduling, niceness: int) -> None:
    logger.info("ingestion jobs run at %s", lower_this_thread(scheduling, niceness))
