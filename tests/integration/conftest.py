"""Start the real application once per test module, exactly as a user does: `serve run`.

The config is serve_config.yaml with only the HTTP port changed (to a free one) and
API keys required, so the tests go through the same auth a production deploy uses. With
`engine="openai"` the generator is vLLM's own OpenAI server, started here with the engine
arguments of the same config, and the application streams from it (generator.engine:
openai) instead of running vLLM inside Ray.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from app.config import parse_config
from bench.service import ServiceError, free_port, running_service, wait_for_every_stage
from bench.variant import apply_overrides
from bench.vllm_server import external_generator_overrides, serving_generator

ROOT = Path(__file__).resolve().parents[2]
API_KEY = "integration-test-key-0123456789"


@dataclass(frozen=True)
class Service:
    base_url: str
    api_key: str
    config: dict
    engine: str = "vllm"
    # The external OpenAI-compatible server (engine "openai"), for a test that stops it.
    external_server: subprocess.Popen | None = None

    def client(self, **kwargs) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.api_key}"}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=300, **kwargs)


@contextmanager
def started(
    tmp_path_factory: pytest.TempPathFactory,
    engine: str = "vllm",
    adjust: Callable[[dict, Path], None] | None = None,
) -> Iterator[Service]:
    """The application on a free port, its generator in Ray ("vllm") or an external vLLM
    OpenAI server ("openai"); everything started here is stopped on exit. `adjust(args,
    folder)` may change the application's args first (`folder` is this service's own).
    Collections live in `folder`, never in the checkout's indexes/."""
    folder = tmp_path_factory.mktemp(f"serve-{engine}")
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    port = free_port()
    config["http_options"]["port"] = port
    application = config["applications"][0]
    application["args"]["collections"]["root"] = str(folder / "collections")
    if adjust is not None:
        adjust(application["args"], folder)
    try:
        with ExitStack() as stack:
            external = None
            if engine == "openai":
                server = stack.enter_context(
                    serving_generator(application, folder / "vllm.log", ready_timeout_s=300)
                )
                external = server.process
                timeout_s = parse_config(application["args"]).ingress.request_timeout_s
                application["args"] = apply_overrides(
                    application["args"], external_generator_overrides(server.base_url, timeout_s)
                )
            config_path = folder / "serve_config.yaml"
            config_path.write_text(yaml.safe_dump(config))
            url = stack.enter_context(
                running_service(config_path, port, folder / "serve.log", {"RAG_API_KEYS": API_KEY})
            )
            # Ready means the required stages run; the tests want the optional
            # compressor too (it may start after the others, sooner with no vLLM in Ray).
            wait_for_every_stage(url)
            yield Service(url, API_KEY, application["args"], engine, external)
    except ServiceError as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="session")
def serving():
    """`started`, for a module that runs its tests against each generator engine."""
    return started


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with started(tmp_path_factory) as running:
        yield running
