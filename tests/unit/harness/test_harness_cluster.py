"""harness.cluster's parts that need no Ray: forgetting the current-cluster file, and reading
`ray list` and `serve status` answers (canned here, good and bad)."""

from __future__ import annotations

import json
import subprocess
import tempfile

import pytest

from harness import cluster as cluster_module
from harness.cluster import Cluster

GCS = "127.0.0.1:6379"
DASHBOARD = "http://127.0.0.1:8265"


# --- _forget_address ----------------------------------------------------------------------


@pytest.fixture
def marker(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    path = tmp_path / "ray" / "ray_current_cluster"
    path.parent.mkdir()
    return path


def test_forget_address_removes_the_marker_of_this_cluster(marker):
    marker.write_text("127.0.0.1:6379\n")
    cluster_module._forget_address(GCS)
    assert not marker.exists()


def test_forget_address_keeps_the_marker_of_another_cluster(marker):
    marker.write_text("127.0.0.1:6380")
    cluster_module._forget_address(GCS)
    assert marker.read_text() == "127.0.0.1:6380"


def test_forget_address_keeps_the_marker_of_a_port_that_only_ends_alike(marker):
    # The whole port is compared, not its last digits (port 16379 is not port 6379).
    marker.write_text("127.0.0.1:16379")
    cluster_module._forget_address(GCS)
    assert marker.exists()


def test_forget_address_without_a_marker_does_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    cluster_module._forget_address(GCS)  # no ray/ directory at all
    assert list(tmp_path.iterdir()) == []


# --- ray list -----------------------------------------------------------------------------


def answer(stdout: str = "", returncode: int = 0, stderr: str = "") -> subprocess.CompletedProcess:
    return subprocess.CompletedProcess(["ray"], returncode, stdout, stderr)


class FakeRay:
    """Cluster.ray: answers `ray list <kind> ...` from `answers[kind]`, recording the args."""

    def __init__(self, **answers: subprocess.CompletedProcess) -> None:
        self.answers = answers
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
        self.calls.append(args)
        return self.answers[args[1]]


def cluster_with(monkeypatch, **answers: subprocess.CompletedProcess) -> tuple[Cluster, FakeRay]:
    cluster = Cluster(GCS, DASHBOARD)
    fake = FakeRay(**answers)
    monkeypatch.setattr(cluster, "ray", fake)
    return cluster, fake


NODES = [
    {"node_id": "n1", "state": "ALIVE", "resources_total": {"CPU": 1.0, "node_a": 1.0}},
    {"node_id": "n2", "state": "DEAD", "resources_total": {"CPU": 1.0, "node_b": 1.0}},
    {"node_id": "n3", "state": "ALIVE", "resources_total": {"CPU": 1.0}},
]


def test_list_asks_ray_for_json_at_the_clusters_address(monkeypatch):
    cluster, fake = cluster_with(monkeypatch, nodes=answer(json.dumps(NODES)))

    assert cluster._list("nodes", "--detail") == NODES
    assert fake.calls == [("list", "nodes", "--format", "json", "--address", GCS, "--detail")]


@pytest.mark.parametrize(
    "reply",
    [
        answer(json.dumps(NODES), returncode=1),  # a failed command, whatever it printed
        answer("Failed to connect to GCS", returncode=1),
        answer("not json at all"),
        answer(""),
        answer(json.dumps({"nodes": NODES})),  # not a list
        answer("null"),
    ],
)
def test_list_is_empty_while_the_cluster_cannot_answer(monkeypatch, reply):
    cluster, _ = cluster_with(monkeypatch, nodes=reply)
    assert cluster._list("nodes") == []
    assert cluster.alive_nodes() == 0


def test_alive_nodes_counts_the_alive_ones(monkeypatch):
    cluster, fake = cluster_with(monkeypatch, nodes=answer(json.dumps(NODES)))
    assert cluster.alive_nodes() == 2
    assert fake.calls[0][:2] == ("list", "nodes")


def test_placement_names_each_nodes_replicas(monkeypatch):
    actors = [
        {"class_name": "ServeReplica:rag:Retriever", "node_id": "n2"},
        {"class_name": "ServeReplica:rag:Generator", "node_id": "n1"},
        {"class_name": "ServeReplica:rag:Compressor", "node_id": "n1"},
        {"class_name": "ServeController", "node_id": "n1"},  # not a replica
        {"class_name": "ProxyActor", "node_id": "n2"},
        {"class_name": "ServeReplica:rag:RagIngress", "node_id": "n3"},  # no node_ resource
        {"class_name": "ServeReplica:rag:Retriever", "node_id": "gone"},  # unknown node
        {"node_id": "n1"},  # no class name
    ]
    cluster, fake = cluster_with(
        monkeypatch, nodes=answer(json.dumps(NODES)), actors=answer(json.dumps(actors))
    )

    placement = cluster.placement()

    assert placement == {
        "?": ["rag:RagIngress", "rag:Retriever"],
        "node_a": ["rag:Compressor", "rag:Generator"],
        "node_b": ["rag:Retriever"],
    }
    assert list(placement) == sorted(placement)
    assert fake.calls[0] == ("list", "nodes", "--format", "json", "--address", GCS, "--detail")
    assert fake.calls[1][:2] == ("list", "actors")
    assert "state=ALIVE" in fake.calls[1]


def test_placement_of_an_unanswering_cluster_is_empty(monkeypatch):
    cluster, _ = cluster_with(
        monkeypatch, nodes=answer("", returncode=1), actors=answer("", returncode=1)
    )
    assert cluster.placement() == {}


def test_env_points_the_cli_at_the_cluster_with_token_auth():
    env = Cluster(GCS, DASHBOARD).env()
    assert env["RAY_ADDRESS"] == GCS
    assert env["RAY_AUTH_MODE"] == "token"
    assert env["RAY_USAGE_STATS_ENABLED"] == "0"


# --- serve status -------------------------------------------------------------------------


STATUS = """\
proxies:
  abc: HEALTHY
applications:
  rag:
    status: RUNNING
    message: ''
    deployments:
      Retriever:
        status: HEALTHY
  other:
    status: DEPLOY_FAILED
    message: 'boom: the replica died'
"""


@pytest.fixture
def serve_status(monkeypatch):
    """Replaces subprocess.run with `serve status` answering `reply` (a CompletedProcess or an
    exception to raise); the calls are recorded."""
    state: dict = {"reply": answer(STATUS), "calls": []}

    def run(argv, **kwargs):
        state["calls"].append((argv, kwargs))
        if isinstance(state["reply"], BaseException):
            raise state["reply"]
        return state["reply"]

    monkeypatch.setattr(cluster_module.subprocess, "run", run)
    return state


def test_app_status_reads_the_application_from_serve_status(serve_status):
    cluster = Cluster(GCS, DASHBOARD)

    assert cluster.app_status() == ("RUNNING", "")
    assert cluster.app_status("other") == ("DEPLOY_FAILED", "boom: the replica died")

    argv, kwargs = serve_status["calls"][0]
    assert argv[0].endswith("serve") and argv[1:] == ["status", "--address", DASHBOARD]
    assert kwargs["env"]["RAY_ADDRESS"] == GCS
    assert kwargs["timeout"] == 60


def test_app_status_without_a_message_is_empty(serve_status):
    serve_status["reply"] = answer("applications:\n  rag:\n    status: DEPLOYING\n")
    assert Cluster(GCS, DASHBOARD).app_status() == ("DEPLOYING", "")


@pytest.mark.parametrize(
    "stdout",
    [
        "",  # nothing printed
        "garbage",  # a plain string, not a mapping
        "applications: [unclosed",  # not YAML
        "applications:\n  other:\n    status: RUNNING\n",  # no such app
        "applications: null\n",
        "- a\n- b\n",
    ],
)
def test_app_status_of_an_unreadable_answer_is_unknown_with_stderr(serve_status, stdout):
    stderr = "x" * 600 + "ConnectionError: the dashboard is not up"
    serve_status["reply"] = answer(stdout, returncode=1, stderr=stderr)

    status, message = Cluster(GCS, DASHBOARD).app_status()

    assert status == "UNKNOWN"
    assert message == stderr[-500:]
    assert message.endswith("the dashboard is not up")


def test_app_status_when_serve_status_does_not_answer(serve_status):
    serve_status["reply"] = subprocess.TimeoutExpired(["serve", "status"], 60)
    assert Cluster(GCS, DASHBOARD).app_status() == (
        "UNKNOWN",
        "serve status did not answer in 60 s",
    )
