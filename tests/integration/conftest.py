"""Start the real application once per test module, exactly as a user does: `serve run`.

The config is serve_config.yaml with only the HTTP port changed (to a free one) and
API keys required, so the tests go through the same auth a production deploy uses.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from bench.service import ServiceError, free_port, running_service

ROOT = Path(__file__).resolve().parents[2]
API_KEY = "integration-test-key-0123456789"


@dataclass(frozen=True)
class Service:
    base_url: str
    api_key: str
    config: dict

    def client(self, **kwargs) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.api_key}"}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=300, **kwargs)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    port = free_port()
    config["http_options"]["port"] = port
    config_path = tmp_path_factory.mktemp("serve") / "serve_config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    log_path = config_path.with_name("serve.log")
    try:
        with running_service(config_path, port, log_path, {"RAG_API_KEYS": API_KEY}) as url:
            yield Service(url, API_KEY, config["applications"][0]["args"])
    except ServiceError as exc:
        pytest.fail(str(exc))
