"""Session hooks and fixtures around the services of tests/services.py: unit tests first,
the shared service launched as soon as the session knows it will be needed (its start
overlaps the unit tests; RAG_TEST_EARLY_START=0 turns that off), every service stopped at
the end, and the time of each start printed in the summary."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from services import EXTERNAL, FOLDER_ORDER, ROOT, SHARED, START_TIMES, Service

from harness.service import ServiceError


@pytest.hookimpl(trylast=True)  # after -k/-m deselection: only the tests that will run
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def folder_rank(item: pytest.Item) -> int:
        parts = Path(str(item.path)).relative_to(ROOT / "tests").parts
        return FOLDER_ORDER.index(parts[0]) if parts[0] in FOLDER_ORDER else len(FOLDER_ORDER)

    def external_last(item: pytest.Item) -> int:
        # The external-engine tests go last, after the shared service has been stopped:
        # three full applications (theirs, ours, one more on the machine) do not fit in
        # 24 GiB (Ray's memory monitor killed workers when they ran side by side).
        callspec = getattr(item, "callspec", None)
        return int(callspec is not None and callspec.params.get("service") == "openai")

    items.sort(key=lambda item: (external_last(item), folder_rank(item)))
    if config.option.collectonly or os.environ.get("RAG_TEST_EARLY_START", "1") == "0":
        return
    # Only the shared service: launching the external-engine one here too slowed the
    # shared start from 141 s to 274 s on 2 cores (docs/testing.md); it starts when its
    # tests begin, its vLLM server and its application side by side.
    if any("shared_service" in item.fixturenames for item in items):
        SHARED.start()


def pytest_unconfigure(config: pytest.Config) -> None:
    EXTERNAL.stop()
    SHARED.stop()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if START_TIMES:
        terminalreporter.section("service starts")
        for what, seconds in START_TIMES:
            terminalreporter.write_line(f"{seconds:7.1f} s  {what}")


@pytest.fixture(scope="session")
def shared_service() -> Service:
    try:
        return SHARED.ready()
    except ServiceError as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="module")
def external_service() -> Iterator[Service]:
    """An application of its own, its generator vLLM's own OpenAI server (engine openai);
    stopped with the module that asked for it, so that it holds no CPU or memory while the
    later modules run."""
    SHARED.stop()  # the external-engine tests run last (see above): free its memory first
    try:
        yield EXTERNAL.ready()
    except ServiceError as exc:
        pytest.fail(str(exc))
    finally:
        EXTERNAL.stop()
