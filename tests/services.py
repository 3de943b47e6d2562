"""The real service that the integration and reliability tests talk to, started once.

One `serve run` of serve_config.yaml per pytest session (`shared_service`) serves every
module that does not need a different deployment graph: two retriever and two compressor
replicas (the collection tests need every stage to switch versions on more than one
replica), API keys required, collections in a temp dir, and a Ray instance of its own
(RAY_TMPDIR, dashboard) so that no test reads another instance's state on the machine.
Settings that only the ingress reads are changed per module through the ingress's
user_config (`Service.tuned`), as an operator would, with no replica restarted.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from app.config import parse_config
from harness.service import (
    RunningService,
    ServiceLaunch,
    deploy_user_config,
    free_port,
    start_server,
    stop_process,
    wait_for_every_stage,
    wait_ready,
)
from harness.variant import apply_overrides
from harness.vllm_server import GeneratorCommand, external_generator_overrides, generator_command
from pipeline.config_base import most_replicas

ROOT = Path(__file__).resolve().parents[1]
API_KEY = "shared-test-key-0123456789abcdef"
# A second key, for traffic that must not share the first one's rate-limit bucket.
SECOND_KEY = "shared-test-key-second-0123456789"
# A scoped key (RAG_API_KEYS_FILE): reads and writes TEAM_COLLECTION only (and reads the
# shipped default collection, as every key does).
TEAM_KEY = "shared-test-key-team-0123456789ab"
TEAM_COLLECTION = "team-notes"
# Ray's workers export their metrics every 10 s by default; the tests wait for less. Not
# below 6 s: a gauge not set again within two intervals is dropped from the export, and
# Serve sets its replica gauges once per health check (every 10 s by default).
METRICS_EXPORT_S = 6
TEST_ENV = {"RAY_metrics_report_interval_ms": str(METRICS_EXPORT_S * 1000)}
# Test folders in the order they run: the unit tests need no service.
FOLDER_ORDER = ("unit", "integration", "reliability")
# (what, seconds) of every service start this session, for the summary at its end.
START_TIMES: list[tuple[str, float]] = []


@dataclass(frozen=True)
class Service:
    """A started application: where it answers, with which key, and its Ray instance."""

    running: RunningService
    config_path: Path
    api_key: str = API_KEY
    engine: str = "vllm"
    # The external OpenAI-compatible server (engine "openai"), for a test that stops it.
    external_server: subprocess.Popen | None = None
    config: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        document = yaml.safe_load(self.config_path.read_text())
        object.__setattr__(self, "config", document["applications"][0]["args"])

    @property
    def base_url(self) -> str:
        return self.running.base_url

    @property
    def pid(self) -> int:
        return self.running.pid

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, headers=self.headers, timeout=300, **kwargs)

    def log_lines(self, needle: str) -> list[str]:
        """Lines holding `needle` in the logs of this service's own Ray instance (every
        process: Serve's proxy, the replicas, the engine)."""
        logs = self.running.ray_tmpdir / "ray" / "session_latest" / "logs"
        found = []
        for path in logs.rglob("*"):
            if path.is_file() and path.suffix in (".log", ".err", ".out"):
                with contextlib.suppress(OSError):
                    text = path.read_text(errors="replace")
                    found += [line for line in text.splitlines() if needle in line]
        return found

    @contextmanager
    def tuned(self, user_config: Mapping[str, Any]) -> Iterator[Service]:
        """The ingress reconfigured with `user_config` (app.tuning) for the block, then
        restored to the config it was built with."""
        deploy_user_config(self.running, self.config_path, "RagIngress", user_config)
        try:
            yield self
        finally:
            deploy_user_config(self.running, self.config_path, "RagIngress", {})


# The tests' reader: SmolLM2-135M starts in seconds and answers a short question in about a
# second, which keeps `make test` inside its time; the reader `make run` serves (the 1.5B)
# takes minutes to start and tens of seconds an answer here. What the tests check (the
# pipeline, the API, faults) does not depend on how well the reader reads.
TEST_READER = {"model_id": "smollm2-135m-instruct", "model_source": ".models/smollm2-135m-instruct"}


def write_config(folder: Path, adjust: Any = None) -> tuple[Path, int, dict[str, Any]]:
    """serve_config.yaml with the tests' reader (TEST_READER) on a free port, collections
    under `folder`; `adjust(application)` may change the application entry first. Returns
    the file, the port and the entry."""
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    port = free_port()
    config["http_options"]["port"] = port
    application = config["applications"][0]
    application["args"]["generator"].update(TEST_READER)
    # SmolLM2's cost model for `auto`, as the profiles that serve it ship it (the default is
    # the 1.5B's).
    scale = yaml.safe_load((ROOT / "serve_config.scale.yaml").read_text())["applications"][0]
    application["args"]["compression"]["cost_model"] = scale["args"]["compression"]["cost_model"]
    application["args"]["collections"]["root"] = str(folder / "collections")
    if adjust is not None:
        adjust(application)
    path = folder / "serve_config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, port, application


# A crafted upload's parse is stopped after this long in the shared service (30 s shipped).
PARSE_TIMEOUT_S = 3.0


def two_replicas_each(application: dict[str, Any]) -> None:
    """Two retrievers and two compressors (behind the shipped conversation router), with
    CPU reservations that fit two cores; a short parse limit, so the test of a crafted PDF
    waits seconds, not the shipped 30; an upload budget of one largest upload per key; and
    vLLM's request log on."""
    args = application["args"]
    for stage, cpus in (("retriever", 0.1), ("compression", 0.2)):
        options = args[stage].setdefault("deployment", {})
        options.update(num_replicas=2, ray_actor_options={"num_cpus": cpus})
    args["collections"]["parse_timeout_s"] = PARSE_TIMEOUT_S
    # One largest upload in flight per key: the upload-budget test holds one open and sees
    # the next refused (shipped: two).
    collections = args["collections"]
    largest = parse_config(args).collections.max_upload_bytes
    collections["upload_bytes_in_flight_per_caller"] = largest
    # vLLM logs each request it takes and each it aborts: the disconnect test reads them.
    args["generator"].setdefault("engine_kwargs", {})["enable_log_requests"] = True


def service_env(folder: Path) -> dict[str, str]:
    """The keys (two admin keys, and TEAM_KEY from a key file written to `folder`)."""
    key_file = folder / "keys.yaml"
    key_file.write_text(
        f"- key: {TEAM_KEY}\n  scopes: [read:{TEAM_COLLECTION}, write:{TEAM_COLLECTION}]\n"
    )
    return {
        "RAG_API_KEYS": f"{API_KEY},{SECOND_KEY}",
        "RAG_API_KEYS_FILE": str(key_file),
        **TEST_ENV,
    }


class SharedLaunch:
    """The session's shared service: launched once (early, from the collection hook, or
    by the first test that asks), awaited once, stopped when the session ends."""

    def __init__(self) -> None:
        self.launch: ServiceLaunch | None = None
        self.folder: Path | None = None
        self.config_path: Path | None = None
        self.service: Service | None = None

    def start(self) -> None:
        if self.launch is not None:
            return
        self.folder = Path(tempfile.mkdtemp(prefix="rag-shared-"))
        self.config_path, port, _ = write_config(self.folder, two_replicas_each)
        self.launch = ServiceLaunch(
            self.config_path, port, self.folder / "serve.log", service_env(self.folder)
        )

    def ready(self) -> Service:
        self.start()
        assert self.launch is not None and self.config_path is not None
        if self.service is None:
            running = self.launch.ready()
            # Ready means the required stages run; the tests want the optional compressor
            # (and every replica of it) too.
            wait_for_every_stage(running.base_url)
            START_TIMES.append(("shared service", time.monotonic() - self.launch.started_at))
            self.service = Service(running, self.config_path)
        return self.service

    def stop(self) -> None:
        """Stop it; a test that asks for it afterwards gets a fresh one."""
        if self.launch is not None:
            self.launch.stop()
        if self.folder is not None:
            keep_logs_in = os.environ.get("RAG_TEST_KEEP_LOGS")
            if keep_logs_in:  # the service's log outlives its temp dir, for a post-mortem
                skip = shutil.ignore_patterns("collections")
                target = Path(keep_logs_in) / self.folder.name
                shutil.copytree(self.folder, target, ignore=skip, dirs_exist_ok=True)
            shutil.rmtree(self.folder, ignore_errors=True)
        self.launch = self.folder = self.config_path = self.service = None


SHARED = SharedLaunch()


class ExternalEngineLaunch:
    """An application of its own whose generator is vLLM's own OpenAI server (generator.
    engine: openai): both processes start at once (the generator tolerates a server that
    comes up after it), awaited once, stopped together."""

    def __init__(self) -> None:
        self.folder: Path | None = None
        self.stack = ExitStack()
        self.started_at = 0.0
        self.service: Service | None = None

    def start(self) -> None:
        if self.folder is not None:
            return
        self.folder = Path(tempfile.mkdtemp(prefix="rag-openai-"))
        self.started_at = time.monotonic()
        commands: list[GeneratorCommand] = []

        def to_external(application: dict[str, Any]) -> None:
            command = generator_command(application)
            timeout_s = parse_config(application["args"]).ingress.request_timeout_s
            overrides = external_generator_overrides(command.base_url, timeout_s)
            application["args"] = apply_overrides(application["args"], overrides)
            commands.append(command)

        self.config_path, port, _ = write_config(self.folder, to_external)
        [self.command] = commands
        self.server = start_server(self.command.argv, self.folder / "vllm.log", self.command.env)
        self.stack.callback(stop_process, self.server, 60.0)
        self.launch = ServiceLaunch(
            self.config_path, port, self.folder / "serve.log", service_env(self.folder)
        )
        self.stack.callback(self.launch.stop)

    def ready(self) -> Service:
        self.start()
        assert self.folder is not None
        if self.service is None:
            running = self.launch.ready()
            health = f"{self.command.base_url}/health"
            wait_ready(self.server, health, self.folder / "vllm.log", "vllm serve", 300)
            wait_for_every_stage(running.base_url)
            START_TIMES.append(
                ("openai service and its vLLM server", time.monotonic() - self.started_at)
            )
            self.service = Service(
                running, self.config_path, engine="openai", external_server=self.server
            )
        return self.service

    def stop(self) -> None:
        self.stack.close()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None


EXTERNAL = ExternalEngineLaunch()


def wait_until_whole(service: Service, timeout_s: float = 300) -> None:
    """Until every stage runs as many replicas as its config asks and none is degraded:
    what a module that killed replicas leaves for the next one."""
    config = parse_config(service.config)
    wanted = {
        "retriever": most_replicas(config.retriever.deployment),
        "compressor": most_replicas(config.compression.deployment),
        "generator": most_replicas(config.generator.deployment),
        "writer": 1,
    }
    deadline = time.monotonic() + timeout_s
    body: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            body = httpx.get(f"{service.base_url}/readyz", timeout=10).json()
        except (httpx.HTTPError, ValueError):
            body = {}
        replicas = body.get("replicas", {})
        if body.get("degraded") == [] and all(
            replicas.get(stage, 0) >= count for stage, count in wanted.items()
        ):
            return
        time.sleep(0.5)
    pytest.fail(f"the service did not get back to {wanted} replicas in {timeout_s} s: {body}")


def read_http_reply(connection: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 answer read off a raw socket: status, headers (lower-case names) and the
    body its Content-Length announces; it does not wait for the server to close."""
    reply = b""
    while b"\r\n\r\n" not in reply:
        reply += _received(connection, reply)
    head, _, body = reply.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.strip().lower(): value.strip()
               for name, _, value in (line.partition(":") for line in lines)}  # fmt: skip
    while len(body) < int(headers.get("content-length", 0)):
        body += _received(connection, head + body)
    return int(status_line.split()[1]), headers, body[: int(headers.get("content-length", 0))]


def _received(connection: socket.socket, so_far: bytes) -> bytes:
    chunk = connection.recv(65536)
    if not chunk:
        raise ConnectionError(f"the server closed the connection after {so_far[:500]!r}")
    return chunk
