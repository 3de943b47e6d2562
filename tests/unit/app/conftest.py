"""Fixtures for the HTTP-layer tests, around the fakes of app_fakes.py."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from app_fakes import FakeStages, make_state
from fastapi.testclient import TestClient

from app.api import create_api


@pytest.fixture
def stages() -> FakeStages:
    return FakeStages()


@pytest.fixture
def client_for() -> Callable[..., TestClient]:
    """A TestClient around `make_state(**kwargs)`; server errors come back as responses."""

    def build(**kwargs) -> TestClient:
        return TestClient(create_api(make_state(**kwargs)), raise_server_exceptions=False)

    return build


@pytest.fixture
def client(client_for, stages) -> TestClient:
    return client_for(stages=stages)
