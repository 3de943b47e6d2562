"""Start the real application for a reliability module: `serve run` of a config variant,
with API keys required, once per module. Faults are injected only into the processes of
the service a module started (bench.faults)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bench.service import ServiceError, free_port, started_service
from bench.variant import write_variant

ROOT = Path(__file__).resolve().parents[2]
API_KEY = "reliability-test-key-0123456789"


@dataclass(frozen=True)
class Service:
    base_url: str
    pid: int
    api_key: str = API_KEY

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}


@contextmanager
def launched(
    tmp_path_factory: pytest.TempPathFactory,
    overrides: dict[str, Any],
    base: str = "serve_config.yaml",
) -> Iterator[Service]:
    folder = tmp_path_factory.mktemp("serve")
    port = free_port()
    config = write_variant(ROOT / base, overrides, folder / "serve_config.yaml", port=port)
    try:
        with started_service(
            config, port, folder / "serve.log", {"RAG_API_KEYS": API_KEY}
        ) as service:
            yield Service(service.base_url, service.pid)
    except ServiceError as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="session")
def launch():
    """`launched`, for the module-scoped service fixtures of this folder."""
    return launched
