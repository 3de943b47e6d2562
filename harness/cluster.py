"""A real multi-node Ray cluster on this machine, started and stopped by this code alone.

Each node is one `ray start --block` in a process session of its own, with its own logical
CPUs and a custom resource named after it (so stages can be pinned to nodes). The app is
deployed with `serve deploy`, as on any cluster. Taking a node away kills that node's
raylet (SIGKILL, as a machine that vanishes); teardown stops the processes under the
`ray start` commands this code launched, and nothing else: never `ray stop`, which would
stop every Ray instance on the machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from harness import processes
from harness.service import ROOT, stop_process_group, tail

BIN = Path(sys.executable).parent
# Ray 2.60 turns token auth on; its CLI sends the token only when told to.
TOKEN_ENV = {"RAY_AUTH_MODE": "token", "RAY_USAGE_STATS_ENABLED": "0"}


class ClusterError(RuntimeError):
    """A node did not start or the cluster did not form; the message ends with a log tail."""


@dataclass(frozen=True)
class NodeSpec:
    name: str
    num_cpus: int


@dataclass
class Node:
    spec: NodeSpec
    process: subprocess.Popen
    log_path: Path
    # Processes of this node seen before it was taken away: orphans once its raylet dies.
    orphans: list[int] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.process.pid

    def raylet_pids(self) -> list[int]:
        return [
            p.pid
            for p in processes.descendants(self.pid)
            if p.name() == "raylet" or "raylet" in " ".join(p.cmdline()[:1])
        ]


@dataclass
class Cluster:
    gcs_address: str
    dashboard_url: str
    nodes: list[Node] = field(default_factory=list)

    def node(self, name: str) -> Node:
        return next(node for node in self.nodes if node.spec.name == name)

    def env(self) -> dict[str, str]:
        return os.environ | TOKEN_ENV | {"RAY_ADDRESS": self.gcs_address}

    def ray(self, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(BIN / "ray"), *args], capture_output=True, text=True, timeout=timeout_s,
            env=self.env(), check=False,
        )  # fmt: skip

    def alive_nodes(self) -> int:
        nodes = self._list("nodes")
        return sum(node.get("state") == "ALIVE" for node in nodes)

    def _list(self, kind: str, *args: str) -> list[dict]:
        """`ray list <kind>` as JSON records; [] while the cluster cannot answer yet."""
        result = self.ray("list", kind, "--format", "json", "--address", self.gcs_address, *args)
        try:
            records = json.loads(result.stdout) if result.returncode == 0 else []
        except ValueError:
            return []
        return records if isinstance(records, list) else []

    def deploy(self, config: Path, log_path: Path) -> None:
        result = subprocess.run(
            [str(BIN / "serve"), "deploy", str(config), "--address", self.dashboard_url],
            capture_output=True, text=True, timeout=300, env=self.env(), cwd=ROOT, check=False,
        )  # fmt: skip
        log_path.write_text(result.stdout + result.stderr)
        if result.returncode != 0:
            raise ClusterError(f"serve deploy failed:\n{result.stdout}\n{result.stderr}")

    def app_status(self, app: str = "rag") -> tuple[str, str]:
        """(status, message) of the application as `serve status` reports it."""
        try:
            result = subprocess.run(
                [str(BIN / "serve"), "status", "--address", self.dashboard_url],
                capture_output=True, text=True, timeout=60, env=self.env(), check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            return "UNKNOWN", "serve status did not answer in 60 s"
        try:
            application = yaml.safe_load(result.stdout)["applications"][app]
        except (TypeError, KeyError, yaml.YAMLError):
            return "UNKNOWN", result.stderr[-500:]
        return str(application.get("status")), str(application.get("message", ""))

    def placement(self) -> dict[str, list[str]]:
        """Node name -> the Serve replicas running on it (class names)."""
        nodes = self._list("nodes", "--detail")
        names = {
            node["node_id"]: next(
                (n for n in node.get("resources_total", {}) if n.startswith("node_")), "?"
            )
            for node in nodes
        }
        actors = self._list("actors", "--detail", "--limit", "1000", "--filter", "state=ALIVE")
        placed: dict[str, list[str]] = {}
        for actor in actors:
            name = actor.get("class_name", "")
            if name.startswith("ServeReplica:"):
                node = names.get(actor.get("node_id"), "?")
                placed.setdefault(node, []).append(name.removeprefix("ServeReplica:"))
        return {node: sorted(replicas) for node, replicas in sorted(placed.items())}

    def take_away(self, name: str) -> list[int]:
        """Kill the raylet of node `name` (SIGKILL): the node is lost with what ran on it."""
        node = self.node(name)
        node.orphans = [p.pid for p in processes.descendants(node.pid)]
        pids = node.raylet_pids()
        for pid in pids:
            processes.kill(pid)
        return pids


@contextmanager
def local_cluster(
    specs: Sequence[NodeSpec], log_dir: Path, port: int, dashboard_port: int
) -> Iterator[Cluster]:
    """Start `specs[0]` as the head and the rest as workers joined to it; stop them all on
    exit, in reverse order."""
    log_dir.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(f"127.0.0.1:{port}", f"http://127.0.0.1:{dashboard_port}")
    try:
        head, *workers = specs
        cluster.nodes.append(
            _start_node(
                head, log_dir,
                ["--head", "--port", str(port), "--dashboard-host", "127.0.0.1",
                 "--dashboard-port", str(dashboard_port)],
            )
        )  # fmt: skip
        _wait(lambda: cluster.alive_nodes() >= 1, cluster, 120, "the head did not start")
        for spec in workers:
            cluster.nodes.append(_start_node(spec, log_dir, ["--address", cluster.gcs_address]))
        _wait(lambda: cluster.alive_nodes() >= len(specs), cluster, 120, "the workers did not join")
        yield cluster
    finally:
        for node in reversed(cluster.nodes):
            _stop_node(node)
        _forget_address(cluster.gcs_address)


def _start_node(spec: NodeSpec, log_dir: Path, role_args: list[str]) -> Node:
    log_path = log_dir / f"{spec.name}.log"
    argv = [
        str(BIN / "ray"), "start", "--block", "--disable-usage-stats",
        "--num-cpus", str(spec.num_cpus), "--resources", json.dumps({spec.name: 1}),
        *role_args,
    ]  # fmt: skip
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            argv, cwd=ROOT, env=os.environ | TOKEN_ENV, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    return Node(spec, process, log_path)


def _stop_node(node: Node) -> None:
    """Stop everything under this node's `ray start`: its session first, then any
    descendant that lives in a process group of its own (Ray's workers do)."""
    strays = [p.pid for p in processes.descendants(node.pid)] + node.orphans
    stop_process_group(node.pid, grace_s=20)
    for pid in strays:
        processes.kill(pid)
    if node.process.poll() is None:
        node.process.kill()
    node.process.wait()


def _forget_address(gcs_address: str) -> None:
    """Remove the machine's "current cluster" file if it names the cluster stopped here (as
    `ray stop` would), so a later `ray.init()` does not try to join a cluster that is gone."""
    marker = Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster"
    with contextlib.suppress(OSError):
        if marker.read_text().strip().rsplit(":", 1)[-1] == gcs_address.rsplit(":", 1)[-1]:
            marker.unlink()


def _wait(condition, cluster: Cluster, timeout_s: float, message: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        for node in cluster.nodes:
            if node.process.poll() is not None:
                raise ClusterError(f"{node.spec.name} exited:\n{tail(node.log_path)}")
        time.sleep(2)
    logs = "\n".join(tail(node.log_path, 20) for node in cluster.nodes)
    raise ClusterError(f"{message} in {timeout_s:.0f} s:\n{logs}")
