"""scripts/kuberay_manifest.py: the committed RayService is generated from serve_config.gpu.yaml,
carries it as serveConfigV2, validates against the vendored KubeRay CRD, and holds the facts the
deploy guide promises (secret, volumes, probes, GPU group). No network, no cluster.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from app.config import parse_config
from scripts import kuberay_manifest as km

ROOT = Path(__file__).resolve().parents[3]
CRD = ROOT / "deploy" / "kuberay" / "crd" / "ray.io_rayservices.yaml"
SERVE_CONFIG_TEXT = km.SERVE_CONFIG.read_text()
RAY_VERSION = km.ray_version_pinned(km.PYPROJECT.read_text())


def _load(text: str) -> Any:
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


@functools.cache
def _committed() -> dict[str, Any]:
    return _load(km.MANIFEST.read_text())


def _manifest() -> dict[str, Any]:
    return copy.deepcopy(_committed())


def _serve_config() -> dict[str, Any]:
    return yaml.safe_load(SERVE_CONFIG_TEXT)


def _rendered(serve_config: dict[str, Any]) -> dict[str, Any]:
    return yaml.safe_load(km.render(yaml.safe_dump(serve_config), RAY_VERSION))


def _pods(manifest: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(group name, pod spec) for the head and each worker group."""
    cluster = manifest["spec"]["rayClusterConfig"]
    yield "head", cluster["headGroupSpec"]["template"]["spec"]
    for group in cluster["workerGroupSpecs"]:
        yield group["groupName"], group["template"]["spec"]


def _group(manifest: dict[str, Any], name: str) -> dict[str, Any]:
    groups = manifest["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    return next(group for group in groups if group["groupName"] == name)


# --- the CRD's OpenAPI v3 schema as JSON Schema --------------------------------------------


def _to_json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A Kubernetes structural schema (OpenAPI v3) as JSON Schema, as the API server applies it.

    - x-kubernetes-int-or-string: an integer or a string (controller-gen also writes the anyOf).
    - x-kubernetes-preserve-unknown-fields: that object keeps fields the schema does not name.
    - Any other object with `properties` rejects unknown fields: the API server would prune
      them and `kubectl apply` (its default --validate=strict) fails on them, so a misspelled
      field must fail here too rather than vanish.
    - nullable: null is allowed as well.
    Not evaluated: x-kubernetes-validations (CEL rules on managedBy and the GCS backend, which
    this manifest does not set), list-map key uniqueness and defaults.
    """
    out = {k: v for k, v in schema.items() if not k.startswith("x-kubernetes-") and k != "nullable"}
    if "properties" in schema:
        out["properties"] = {name: _to_json_schema(s) for name, s in schema["properties"].items()}
        if "additionalProperties" not in schema and not schema.get(
            "x-kubernetes-preserve-unknown-fields"
        ):
            out["additionalProperties"] = False
    if isinstance(schema.get("additionalProperties"), dict):
        out["additionalProperties"] = _to_json_schema(schema["additionalProperties"])
    if "items" in schema:
        out["items"] = _to_json_schema(schema["items"])
    for key in ("anyOf", "allOf", "oneOf"):
        if key in schema:
            out[key] = [_to_json_schema(s) for s in schema[key]]
    if schema.get("x-kubernetes-int-or-string") and "anyOf" not in schema:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if schema.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


FORMATS = jsonschema.FormatChecker(formats=())


@FORMATS.checks("int32")
def _int32(value: object) -> bool:
    return not isinstance(value, int) or -(2**31) <= value < 2**31


@FORMATS.checks("int64")
def _int64(value: object) -> bool:
    return not isinstance(value, int) or -(2**63) <= value < 2**63


@functools.cache
def _validator() -> jsonschema.Draft7Validator:
    crd = _load(CRD.read_text())
    (version,) = (v for v in crd["spec"]["versions"] if v["name"] == "v1")
    assert version["served"] and version["storage"]
    schema = _to_json_schema(version["schema"]["openAPIV3Schema"])
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema, format_checker=FORMATS)


def _errors(manifest: dict[str, Any]) -> list[str]:
    return [f"{e.json_path}: {e.message}" for e in _validator().iter_errors(manifest)]


# --- (a) generated, (b) one source of truth ------------------------------------------------


def test_the_committed_manifest_is_what_the_generator_writes():
    assert km.MANIFEST.read_text() == km.render(SERVE_CONFIG_TEXT, RAY_VERSION)
    assert km.main(["--check"]) == 0


def test_check_fails_on_a_stale_manifest_and_passes_once_regenerated(tmp_path, capsys):
    output = tmp_path / "rayservice.yaml"
    output.write_text(km.MANIFEST.read_text().replace("minReplicas: 2", "minReplicas: 3"))

    assert km.main(["--check", "--output", str(output)]) == 1
    assert "stale" in capsys.readouterr().err
    assert km.main(["--output", str(output)]) == 0
    assert km.main(["--check", "--output", str(output)]) == 0


def test_serve_config_v2_is_the_gpu_profile_verbatim():
    serve_config_v2 = _committed()["spec"]["serveConfigV2"]

    assert serve_config_v2 == SERVE_CONFIG_TEXT
    assert yaml.safe_load(serve_config_v2) == _serve_config()
    assert yaml.safe_load(serve_config_v2)["applications"] == _serve_config()["applications"]


def test_serve_config_v2_is_a_valid_serve_deploy_config():
    """KubeRay sends serveConfigV2 to the dashboard's /api/serve/applications/ as JSON: the
    schema of `serve deploy`, http_options and proxy_location included."""
    from ray.serve.schema import ServeDeploySchema

    deploy = ServeDeploySchema.model_validate(yaml.safe_load(_committed()["spec"]["serveConfigV2"]))

    assert deploy.http_options.host == "0.0.0.0"
    assert [application.name for application in deploy.applications] == ["rag"]


def test_an_edited_serve_config_changes_the_manifest():
    serve_config = _serve_config()
    serve_config["applications"][0]["args"]["generator"]["deployment"]["autoscaling_config"] = {
        "min_replicas": 1,
        "max_replicas": 12,
        "target_ongoing_requests": 32,
    }
    manifest = _rendered(serve_config)

    assert yaml.safe_load(manifest["spec"]["serveConfigV2"]) == serve_config
    assert _group(manifest, "gpu")["maxReplicas"] == 12 + 2


# --- (c) valid against the vendored CRD, (d) and validation can fail ------------------------


def test_the_manifest_validates_against_the_vendored_rayservice_crd():
    assert _errors(_manifest()) == []


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(manifest: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = manifest
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        if value is _DELETE:
            del node[last]
        else:
            node[last] = value

    return mutate


_DELETE = object()
WORKER_0 = "spec.rayClusterConfig.workerGroupSpecs.0"
CONTAINER_0 = f"{WORKER_0}.template.spec.containers.0"


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (_set("spec.serveConfigV3", "applications: []"), "'serveConfigV3' was unexpected"),
        (_set("spec.rayClusterConfig.headGroupSpec.rayStartParam", {}), "'rayStartParam' was"),
        (_set(f"{WORKER_0}.replicas", "two"), "'two' is not of type 'integer'"),
        (_set(f"{WORKER_0}.minReplicas", 2**31), "is not a 'int32'"),
        (_set("spec.rayClusterConfig.headGroupSpec", _DELETE), "'headGroupSpec' is a required"),
        (_set(f"{CONTAINER_0}.resources.limits.memory", "lots"), "does not match"),
        (_set("spec.rayClusterConfig.autoscalerOptions.upscalingMode", "Fast"), "is not one of"),
        (_set("spec.rayClusterConfig.authOptions.mode", "password"), "is not one of"),
        (_set("spec.serveConfigV2", {"applications": []}), "is not of type 'string'"),
    ],
    ids=[
        "misspelled-spec-field",
        "misspelled-head-field",
        "replicas-not-an-integer",
        "replicas-beyond-int32",
        "missing-head-group",
        "bad-quantity",
        "bad-enum",
        "bad-auth-mode",
        "serve-config-not-a-string",
    ],
)
def test_validation_rejects_a_broken_manifest(mutate, message):
    manifest = _manifest()
    mutate(manifest)

    errors = _errors(manifest)

    assert errors
    assert any(message in error for error in errors), errors


# --- (e) the facts the guide promises -------------------------------------------------------


def test_every_ray_container_gets_the_api_keys_from_the_secret():
    runtime_env = _serve_config()["applications"][0]["runtime_env"]
    assert runtime_env["env_vars"]["RAG_ENV"] == "production"  # which refuses to start keyless

    for group, pod in _pods(_manifest()):
        (container,) = pod["containers"]
        env = {var["name"]: var for var in container["env"]}
        assert env["RAG_API_KEYS"]["valueFrom"]["secretKeyRef"] == {
            "name": km.API_KEY_SECRET,
            "key": "RAG_API_KEYS",
        }, group
        assert "value" not in env["RAG_API_KEYS"]
        assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]["optional"] is True


def test_the_index_volume_is_a_read_only_claim_holding_the_retrievers_index_path():
    index_path = _serve_config()["applications"][0]["args"]["retriever"]["index_path"]
    assert index_path.startswith(km.INDEX_MOUNT + "/")

    for group, pod in _pods(_manifest()):
        volumes = {volume["name"]: volume for volume in pod["volumes"]}
        assert volumes["indexes"]["persistentVolumeClaim"] == {
            "claimName": km.INDEX_CLAIM,
            "readOnly": True,
        }, group
        assert "emptyDir" in volumes["model-cache"]
        (container,) = pod["containers"]
        mounts = {mount["name"]: mount for mount in container["volumeMounts"]}
        assert mounts["indexes"] == {
            "name": "indexes",
            "mountPath": "/mnt/indexes",
            "readOnly": True,
        }


def test_the_collections_volume_is_a_read_write_claim_on_every_pod_holding_the_root():
    """The one writer (on any pod) publishes versions under collections.root and every
    retriever and compressor replica reads them: one shared volume, writable everywhere."""
    collections = _serve_config()["applications"][0]["args"]["collections"]
    assert collections.get("enabled", True)
    assert collections["root"] == km.COLLECTIONS_MOUNT == "/mnt/collections"

    groups = []
    for group, pod in _pods(_manifest()):
        groups.append(group)
        volumes = {volume["name"]: volume for volume in pod["volumes"]}
        assert volumes["collections"] == {
            "name": "collections",
            "persistentVolumeClaim": {"claimName": km.COLLECTIONS_CLAIM},
        }, group
        assert km.COLLECTIONS_CLAIM == "rag-collections"
        (container,) = pod["containers"]
        mounts = {mount["name"]: mount for mount in container["volumeMounts"]}
        assert mounts["collections"] == {"name": "collections", "mountPath": "/mnt/collections"}
        assert not mounts["collections"].get("readOnly", False), group
    assert groups == ["head", "cpu", "gpu"]


def test_without_collections_no_pod_mounts_a_collections_volume():
    serve_config = _serve_config()
    collections = serve_config["applications"][0]["args"]["collections"]
    collections["enabled"] = False
    collections.pop("root")  # the relative default is fine when nothing reads it
    manifest = _rendered(serve_config)

    assert _errors(manifest) == []
    for group, pod in _pods(manifest):
        assert "collections" not in {volume["name"] for volume in pod["volumes"]}, group
        (container,) = pod["containers"]
        mounts = {mount["name"] for mount in container["volumeMounts"]}
        assert mounts == {"indexes", "model-cache"}, group
    assert km.COLLECTIONS_CLAIM not in km.render(yaml.safe_dump(serve_config), RAY_VERSION)


def test_the_collection_writer_counts_toward_the_cpu_pods():
    serve_config = _serve_config()
    args = serve_config["applications"][0]["args"]
    args["collections"]["deployment"] = {"ray_actor_options": {"num_cpus": 8}}
    config = parse_config(args)

    # Ingress 1..4 CPUs plus the writer's 8, on 4-CPU pods.
    assert km.cpu_worker_bounds(config) == (3, 3)
    args["collections"]["enabled"] = False
    assert km.cpu_worker_bounds(parse_config(args)) == (2, 2)


def test_probes_are_left_to_kuberay_on_the_port_named_serve():
    """KubeRay injects probes only into containers without them; its worker readiness probe
    checks the Serve proxy's /-/healthz on the container port named `serve`."""
    serve_port = _serve_config()["http_options"]["port"]

    for group, pod in _pods(_manifest()):
        (container,) = pod["containers"]
        assert not {"readinessProbe", "livenessProbe", "startupProbe"} & container.keys(), group
        ports = {port["name"]: port["containerPort"] for port in container["ports"]}
        assert ports["serve"] == serve_port, group


def test_the_head_runs_no_replicas_and_nothing_is_exposed_outside_the_cluster():
    spec = _manifest()["spec"]
    head = spec["rayClusterConfig"]["headGroupSpec"]
    (container,) = head["template"]["spec"]["containers"]

    assert head["rayStartParams"]["num-cpus"] == "0"
    assert "dashboard-host" not in head["rayStartParams"]  # KubeRay's in-cluster default
    assert "nvidia.com/gpu" not in container["resources"]["limits"]
    assert head["serviceType"] == "ClusterIP"
    assert not head.get("enableIngress")
    assert "client" not in {port["name"] for port in container["ports"]}
    assert "serveService" not in spec  # KubeRay's own, of the head's ClusterIP type
    assert "LoadBalancer" not in km.MANIFEST.read_text()
    assert "NodePort" not in km.MANIFEST.read_text()
    assert spec["excludeHeadPodFromServeSvc"] is True
    assert spec["rayClusterConfig"]["authOptions"] == {"mode": "token"}


def test_the_gpu_group_places_the_generator_on_one_l4_per_pod():
    args = _serve_config()["applications"][0]["args"]
    accelerator = args["generator"]["accelerator_type"]
    group = _group(_manifest(), "gpu")
    pod = group["template"]["spec"]
    (container,) = pod["containers"]

    assert accelerator == "L4"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert container["resources"]["requests"] == container["resources"]["limits"]
    # The resource Ray's NVML detection adds on an L4 node, declared for the autoscaler.
    assert group["resources"] == {"accelerator_type:L4": "1"}
    assert "num-cpus" not in group.get("rayStartParams", {})  # KubeRay refuses both at once
    assert pod["nodeSelector"] == {km.GPU_PRODUCT_LABEL: "NVIDIA-L4"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    cpu_group = _group(_manifest(), "cpu")
    (cpu_container,) = cpu_group["template"]["spec"]["containers"]
    assert "nvidia.com/gpu" not in cpu_container["resources"]["limits"]


def test_the_ray_autoscaler_reads_the_groups_as_intended():
    """Ray's own reader of a RayCluster spec (the pinned Ray's, private) sees what the
    manifest means: a head with no CPUs for replicas, and GPU pods able to hold the
    generator's {GPU: 1, accelerator_type:L4: 0.001} bundle before any of them exists."""
    from ray.autoscaler._private.kuberay.autoscaling_config import (
        _derive_autoscaling_config_from_ray_cr,
    )

    cluster = {
        "metadata": {"name": "rag-x", "namespace": "default"},
        "spec": _manifest()["spec"]["rayClusterConfig"],
    }
    node_types = _derive_autoscaling_config_from_ray_cr(cluster)["available_node_types"]

    assert node_types["headgroup"]["resources"]["CPU"] == 0
    assert "GPU" not in node_types["cpu"]["resources"]
    gpu = node_types["gpu"]["resources"]
    assert (gpu["GPU"], gpu["accelerator_type:L4"]) == (1, 1)
    assert gpu["CPU"] == km.GPU_WORKER.cpus


def test_worker_group_bounds_follow_the_stages_replicas():
    config = parse_config(_serve_config()["applications"][0]["args"])
    manifest = _manifest()

    # 1..8 generators, one L4 each, plus the retriever (0.1) and compressor (0.25) GPU shares.
    assert km.gpu_worker_bounds(config) == (1 + 1, 8 + 2)
    assert km.cpu_worker_bounds(config) == (2, 2)  # ingress: 1..4 CPUs, the floor of two pods
    gpu, cpu = _group(manifest, "gpu"), _group(manifest, "cpu")
    assert (gpu["minReplicas"], gpu["maxReplicas"]) == km.gpu_worker_bounds(config)
    assert (cpu["minReplicas"], cpu["maxReplicas"]) == km.cpu_worker_bounds(config)
    assert gpu["replicas"] == gpu["minReplicas"]
    assert manifest["spec"]["rayClusterConfig"]["rayVersion"] == RAY_VERSION


def test_ten_tenths_of_a_gpu_fill_one_pod_not_two():
    assert km._pods_for(cpus=1.0, gpus=10 * 0.1, size=km.GPU_WORKER) == 1


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda c: c["http_options"].update(host="127.0.0.1"), "http_options.host"),
        (
            lambda c: c["applications"][0]["args"]["retriever"].update(index_path="indexes/x"),
            "not on the index volume",
        ),
        (
            lambda c: c["applications"][0]["args"]["generator"]["engine_kwargs"].update(
                tensor_parallel_size=2
            ),
            "tensor_parallel_size=2",
        ),
        (
            lambda c: c["applications"][0]["args"]["collections"].pop("root"),
            "'indexes/collections' is not on the collections volume",
        ),
        (
            lambda c: c["applications"][0]["args"]["collections"].update(
                root="/mnt/indexes/collections"
            ),
            "a folder inside each pod would keep a pod's changes from the others",
        ),
        (
            lambda c: c["applications"][0]["args"]["collections"].update(
                root="/mnt/collections/../scratch"
            ),
            "not on the collections volume, mounted read-write at /mnt/collections",
        ),
    ],
    ids=[
        "proxy-on-loopback",
        "index-off-the-volume",
        "tensor-parallel-beyond-one-gpu",
        "collections-in-each-pod",
        "collections-on-the-read-only-index-volume",
        "collections-escaping-the-volume",
    ],
)
def test_a_serve_config_this_manifest_cannot_run_is_refused(edit, message):
    serve_config = _serve_config()
    edit(serve_config)

    with pytest.raises(km.ManifestError, match=message):
        km.render(yaml.safe_dump(serve_config), RAY_VERSION)


def test_the_vendored_crd_is_the_targeted_kuberay_release():
    readme = (CRD.parent / "README.md").read_text()

    assert km.KUBERAY_VERSION in readme
    assert "Apache-2.0" in readme
    assert _load(CRD.read_text())["metadata"]["name"] == "rayservices.ray.io"
