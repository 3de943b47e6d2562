"""The reliability modules use the session's shared service (tests/services.py), with API
keys required. Faults are injected only into the processes of that service (harness.
processes); a module that kills replicas leaves the service whole again (every stage at
its configured replicas, nothing degraded) before the next module runs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from services import Service, wait_until_whole


@pytest.fixture(scope="module")
def service(shared_service: Service) -> Iterator[Service]:
    yield shared_service
    wait_until_whole(shared_service)
