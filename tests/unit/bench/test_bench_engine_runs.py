"""bench.engine_runs' environment helpers: what an engine run records about how its
threads ran, and the binding the quantization lab gives its engine by default."""

from __future__ import annotations

import os

import pytest

from bench import engine_runs


def test_every_cpu_lists_the_cores_this_process_may_use(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {3, 0, 1})
    assert engine_runs.every_cpu() == "0,1,3"


def test_engine_environment_records_set_and_unset_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0,1")
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    recorded = engine_runs.engine_environment()
    assert recorded["VLLM_CPU_OMP_THREADS_BIND"] == "0,1"
    assert recorded["LD_PRELOAD"] is None
    assert set(recorded) == set(engine_runs.ENGINE_ENVIRONMENT)
