"""The deploy/ manifests, checked without a cluster.

Every Kubernetes object is validated against the official Kubernetes JSON schemas that the
kubernetes-validate package ships (strict: unknown fields are errors), with the network closed
to prove it. The KServe InferenceService, a CRD outside those schemas, is validated against a
compact schema of the fields we use. The rest are the promises deploy/README.md makes: probes,
ports, tokens, resources, writable paths, scaling.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.unit.deploy.kustomize import (
    generated_config_maps,
    kustomization,
    load_docs,
    object_key,
    only,
    render,
)

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "kubernetes"
OVERLAY = DEPLOY / "kubernetes-gateway-auth"
KSERVE = DEPLOY / "kserve"
REDIS = DEPLOY / "redis"
REDIS_LOG = DEPLOY / "kubernetes-redis"
REDIS_GRAPH = DEPLOY / "kubernetes-redis-graph"
# Every directory that `kubectl apply -k` takes.
KUSTOMIZATIONS = (K8S, OVERLAY, REDIS, REDIS_LOG, REDIS_GRAPH)
KUBERNETES_DOC = ROOT / "docs" / "kubernetes.md"
# Manifests that are applied by hand, not through kustomization.yaml.
STANDALONE = (K8S / "model-store-loader.yaml", REDIS_GRAPH / "graph-loader.yaml")
# The oldest Kubernetes release we support and the newest one the schema package knows.
K8S_VERSIONS = ("1.30", ".".join(kubernetes_validate.latest_version().split(".")[:2]))


def base_objects() -> list[dict[str, Any]]:
    return render(K8S)


def overlay_object(kind: str) -> dict[str, Any]:
    """The base's `kind` object as the gateway overlay leaves it (its patches applied)."""
    return only(render(OVERLAY), kind)


def overlay_deployment() -> dict[str, Any]:
    return overlay_object("Deployment")


def read_properties(path: Path) -> dict[str, str]:
    """Java properties as we write them: `key=value` lines, `#` comments."""
    properties = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "!")):
            key, _, value = line.partition("=")
            properties[key.strip()] = value.strip()
    return properties


def host_port(address: str) -> tuple[str, int]:
    match = re.fullmatch(r"https?://([^:/]+):(\d+)", address)
    assert match, f"not an http(s)://host:port address: {address!r}"
    return match.group(1), int(match.group(2))


def pod_spec(deployment: dict[str, Any]) -> dict[str, Any]:
    return deployment["spec"]["template"]["spec"]


def server_container(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = pod_spec(deployment)["containers"]
    return container


def container_port(container: dict[str, Any], port: int | str) -> int:
    """A probe's or Service's port, by number or by the container port's name."""
    if isinstance(port, int):
        return port
    (number,) = [p["containerPort"] for p in container["ports"] if p["name"] == port]
    return number


def mount_of(deployment: dict[str, Any], path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The (volumeMount, volume) that holds `path` inside the server container."""
    mounts = [
        mount
        for mount in server_container(deployment)["volumeMounts"]
        if path == mount["mountPath"] or path.startswith(mount["mountPath"].rstrip("/") + "/")
    ]
    assert mounts, f"{path} is on no volume (the root filesystem is read-only)"
    mount = max(mounts, key=lambda m: len(m["mountPath"]))
    (volume,) = [v for v in pod_spec(deployment)["volumes"] if v["name"] == mount["name"]]
    return mount, volume


def kserve_pod() -> dict[str, Any]:
    """The predictor pod as KServe builds it from the InferenceService: the predictor's PodSpec
    fields, and the model as the `kserve-container`, so the official schemas check them."""
    (isvc,) = load_docs(KSERVE / "inferenceservice.yaml")
    predictor = copy.deepcopy(isvc["spec"]["predictor"])
    model = predictor.pop("model")
    pod_fields = {k: v for k, v in predictor.items() if k not in ("minReplicas", "maxReplicas")}
    kserve_only = ("modelFormat", "protocolVersion", "storageUri")
    container = {"name": "kserve-container"} | {
        k: v for k, v in model.items() if k not in kserve_only
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": isvc["metadata"]["name"]},
        "spec": {**pod_fields, "containers": [container]},
    }


def documented_manifests() -> list[dict[str, Any]]:
    """The Kubernetes objects in docs/kubernetes.md's ```yaml blocks (kustomize patches and
    other fragments there have no `kind`)."""
    blocks = re.findall(
        r"^```yaml\n(.*?)^```", KUBERNETES_DOC.read_text(), re.DOTALL | re.MULTILINE
    )
    docs = [doc for block in blocks for doc in yaml.safe_load_all(block) if doc]
    return [doc for doc in docs if isinstance(doc, dict) and "kind" in doc]


@pytest.fixture
def no_network(monkeypatch):
    """Any connection attempt fails the test: the schemas must come from the package."""

    def refuse(*args, **kwargs):
        raise AssertionError("schema validation tried to use the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def all_kubernetes_objects() -> list[tuple[str, dict[str, Any]]]:
    """Every object of every kustomization (overlays as rendered, patches applied), the
    standalone manifests, the KServe predictor's pod and the manifests in the docs."""
    objects = []
    for directory in KUSTOMIZATIONS:
        objects += [
            (f"{directory.name}:{doc['kind']}:{doc['metadata']['name']}", doc)
            for doc in render(directory)
        ]
    objects += [
        (f"{path.name}:{doc['kind']}", doc) for path in STANDALONE for doc in load_docs(path)
    ]
    objects.append(("kserve:Pod", kserve_pod()))
    objects += [
        (f"docs/kubernetes.md:{doc['kind']}:{doc['metadata']['name']}", doc)
        for doc in documented_manifests()
    ]
    return objects


# --- schemas -------------------------------------------------------------------------------


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=[d.name for d in KUSTOMIZATIONS])
def test_kustomization_lists_every_manifest_and_generator_file(directory):
    resources = kustomization(directory)["resources"]
    listed = {name for name in resources if name.endswith(".yaml")}
    on_disk = {path.name for path in directory.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk - {path.name for path in STANDALONE if path.parent == directory}
    for name in set(resources) - listed:
        assert (directory / name / "kustomization.yaml").is_file(), name
    for generator in kustomization(directory).get("configMapGenerator", []):
        for name in generator["files"]:
            assert (directory / name).is_file(), name
            # kustomize's default load restrictor refuses files outside the directory.
            assert "/" not in name, name
    assert kustomization(OVERLAY)["resources"][0] == "../kubernetes"


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize(
    ("label", "manifest"), all_kubernetes_objects(), ids=[n for n, _ in all_kubernetes_objects()]
)
def test_manifest_matches_the_kubernetes_schema(label, manifest, version, no_network):
    kubernetes_validate.validate(manifest, version, strict=True)


def test_the_schema_check_catches_broken_manifests(no_network):
    deployment = only(base_objects(), "Deployment")
    wrong_type = copy.deepcopy(deployment)
    server_container(wrong_type)["ports"][0]["containerPort"] = "8080"
    misspelt = copy.deepcopy(deployment)
    server_container(misspelt)["readinesProbe"] = server_container(misspelt).pop("readinessProbe")
    for broken in (wrong_type, misspelt):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, K8S_VERSIONS[0], strict=True)


# --- the Deployment ------------------------------------------------------------------------


def test_the_container_runs_torchserve_on_the_mounted_config_and_archive():
    deployment = only(base_objects(), "Deployment")
    command = server_container(deployment)["command"]
    assert command[0].endswith("/bin/torchserve")
    assert {"--start", "--foreground", "--ncs"} <= set(command)
    ts_config = Path(command[command.index("--ts-config") + 1])
    store = command[command.index("--model-store") + 1]
    # deploy/README.md rolls out a new version by replacing command/8.
    assert command[8] == "gnn=gnn.mar" and command[7] == "--models"
    config_mount, config_volume = mount_of(deployment, str(ts_config))
    assert config_mount.get("readOnly") is True
    (config_map,) = generated_config_maps(K8S)
    assert config_volume["configMap"]["name"] == config_map["metadata"]["name"]
    assert ts_config.name in config_map["data"]
    store_mount, store_volume = mount_of(deployment, store)
    assert store_mount["mountPath"] == store and store_mount.get("readOnly") is True
    pvc = only(base_objects(), "PersistentVolumeClaim")
    assert store_volume["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    config = read_properties(K8S / ts_config.name)
    assert config["model_store"] == store


def test_probes_use_the_metrics_port_and_the_management_api_with_the_token():
    deployment = only(base_objects(), "Deployment")
    container = server_container(deployment)
    config = read_properties(K8S / "config.properties")
    _, metrics_port = host_port(config["metrics_address"])
    for probe in ("startupProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        assert get["path"] == "/metrics"
        assert container_port(container, get["port"]) == metrics_port
    readiness = container["readinessProbe"]["exec"]["command"]
    script = next(part for part in readiness if part.endswith(".py"))
    mount, volume = mount_of(deployment, script)
    assert "configMap" in volume and Path(script).name in generated_config_maps(K8S)[0]["data"]
    assert readiness[readiness.index("--model") + 1] == "gnn"
    # The probe reads key_file.json from the working directory, where TorchServe writes it.
    assert "--key-file" not in readiness and container["workingDir"] != mount["mountPath"]
    assert "torchserve --stop" in " ".join(container["lifecycle"]["preStop"]["exec"]["command"])


def test_every_container_has_cpu_and_memory_requests_and_limits():
    pods = [pod_spec(only(base_objects(), "Deployment"))]
    pods += [load_docs(path)[0]["spec"] for path in STANDALONE]
    for pod in pods:
        for container in pod["containers"]:
            for bound in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(container["resources"][bound]), container["name"]


def test_the_server_runs_as_non_root_on_a_read_only_root_filesystem():
    deployment = only(base_objects(), "Deployment")
    pod_security = pod_spec(deployment)["securityContext"]
    assert pod_security["runAsNonRoot"] is True and pod_security["runAsUser"] != 0
    security = server_container(deployment)["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]


def test_every_path_torchserve_writes_is_an_empty_dir():
    deployment = only(base_objects(), "Deployment")
    container = server_container(deployment)
    env = {item["name"]: item["value"] for item in container["env"]}
    writable = [env["TEMP"], env["TMPDIR"], env["LOG_LOCATION"], env["METRICS_LOCATION"]]
    for path in [*writable, container["workingDir"]]:
        mount, volume = mount_of(deployment, path)
        assert "emptyDir" in volume and not mount.get("readOnly"), path
    # The graph cache hard-links the unpacked archive: same volume for both temp dirs.
    assert mount_of(deployment, env["TEMP"])[1] is mount_of(deployment, env["TMPDIR"])[1]
    # The keys stay in memory.
    assert mount_of(deployment, container["workingDir"])[1]["emptyDir"]["medium"] == "Memory"


def test_the_hpa_scales_the_deployment_on_cpu_and_owns_the_replica_count():
    objects = base_objects()
    deployment, hpa = only(objects, "Deployment"), only(objects, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": deployment["apiVersion"],
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Resource" and metric["resource"]["name"] == "cpu"
    assert hpa["spec"]["minReplicas"] >= 1
    assert hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    assert "replicas" not in deployment["spec"]
    assert "cpu" in server_container(deployment)["resources"]["requests"]


# --- the Service and the server configuration ----------------------------------------------


def test_the_service_exposes_inference_and_metrics_but_not_management():
    objects = base_objects()
    deployment, service = only(objects, "Deployment"), only(objects, "Service")
    container = server_container(deployment)
    assert service["spec"]["type"] == "ClusterIP"
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    config = read_properties(K8S / "config.properties")
    _, management_port = host_port(config["management_address"])
    targets = {container_port(container, p["targetPort"]) for p in service["spec"]["ports"]}
    _, inference_port = host_port(config["inference_address"])
    assert inference_port in targets
    assert management_port not in targets
    assert management_port not in {p["port"] for p in service["spec"]["ports"]}
    assert management_port not in {p["containerPort"] for p in container["ports"]}


def test_the_pod_config_keeps_tokens_on_and_the_model_api_off():
    config = read_properties(K8S / "config.properties")
    assert config.get("disable_token_authorization", "false") == "false"
    assert config["enable_model_api"] == "false"
    container = server_container(only(base_objects(), "Deployment"))
    assert "--disable-token-auth" not in container["command"]
    # Reachable from the Service, the kubelet and Prometheus; management from the pod only.
    assert host_port(config["inference_address"]) == ("0.0.0.0", container_port(container, 8080))
    assert host_port(config["metrics_address"])[0] == "0.0.0.0"
    assert host_port(config["management_address"])[0] == "127.0.0.1"
    assert config["grpc_inference_address"] == config["grpc_management_address"] == "127.0.0.1"


INFERENCE, METRICS = {"port": 8080, "protocol": "TCP"}, {"port": 8082, "protocol": "TCP"}


def rules_for(policy: dict[str, Any], port: dict[str, Any]) -> list[dict[str, Any]]:
    return [rule for rule in policy["spec"]["ingress"] if port in rule["ports"]]


def test_the_network_policy_admits_metrics_only_from_the_monitoring_selectors():
    objects = base_objects()
    deployment, policy = only(objects, "Deployment"), only(objects, "NetworkPolicy")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    # A rule without ports would admit every port; each admits exactly one.
    assert [rule["ports"] for rule in policy["spec"]["ingress"]] == [[INFERENCE], [METRICS]]
    (metrics,) = rules_for(policy, METRICS)
    # One peer holding both selectors: the pod must match both (two peers would admit either).
    (peer,) = metrics["from"]
    assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "monitoring"}
    assert peer["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "prometheus"}
    # Inference: any pod of the cluster (the token authorizes); management is loopback-only.
    (inference,) = rules_for(policy, INFERENCE)
    assert "from" not in inference
    config = read_properties(K8S / "config.properties")
    assert host_port(config["metrics_address"])[1] == METRICS["port"]
    assert host_port(config["inference_address"])[1] == INFERENCE["port"]


def test_the_gateway_overlay_trades_the_token_for_a_network_policy():
    deployment = overlay_deployment()
    assert server_container(deployment)["command"][-1] == "--disable-token-auth"
    policy, base = overlay_object("NetworkPolicy"), only(base_objects(), "NetworkPolicy")
    (inference,) = rules_for(policy, INFERENCE)
    assert inference["from"] == [{"podSelector": {"matchLabels": {"gnnserve/client": "true"}}}]
    assert rules_for(policy, METRICS) == rules_for(base, METRICS)
    # NetworkPolicies add up: a second policy beside the base's would not narrow anything.
    assert kustomization(OVERLAY)["resources"] == ["../kubernetes"]


# --- the image -----------------------------------------------------------------------------


def test_the_image_is_built_from_the_pinned_torchserve_release():
    (pin,) = re.findall(r'"torchserve==([^"]+)"', (ROOT / "pyproject.toml").read_text())
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert f"ARG BASE_IMAGE=pytorch/torchserve:{pin}-cpu" in dockerfile
    assert f"BASE_IMAGE=pytorch/torchserve-kfs:{pin}" in dockerfile
    venv = re.search(r"^ARG VENV=(\S+)$", dockerfile, re.MULTILINE)
    assert venv, "deploy/Dockerfile must declare ARG VENV"
    command = server_container(only(base_objects(), "Deployment"))["command"]
    isvc = load_docs(KSERVE / "inferenceservice.yaml")[0]
    for program in (command[0], isvc["spec"]["predictor"]["model"]["args"][0]):
        assert program == f"{venv.group(1)}/bin/torchserve"


def test_the_image_forks_its_workers_from_the_prefork_hook():
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    copied = re.search(r"^COPY prefork (\S+)$", dockerfile, re.MULTILINE)
    assert copied, "deploy/Dockerfile must copy prefork/ into the image"
    assert f"ENV PYTHONPATH={copied.group(1)}" in dockerfile
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    assert "!prefork" in ignore  # the build context admits the folder


# --- KServe --------------------------------------------------------------------------------

RESOURCE_LIST = {
    "type": "object",
    "properties": {"cpu": {"type": ["string", "number"]}, "memory": {"type": "string"}},
    "required": ["cpu", "memory"],
    "additionalProperties": False,
}

# The fields of serving.kserve.io/v1beta1 InferenceService that deploy/kserve uses, with
# KServe's types; unknown keys are errors so a typo cannot pass as an ignored field.
INFERENCE_SERVICE_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "serving.kserve.io/v1beta1"},
        "kind": {"const": "InferenceService"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "pattern": "^[a-z]([-a-z0-9]*[a-z0-9])?$"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
        "spec": {
            "type": "object",
            "required": ["predictor"],
            "additionalProperties": False,
            "properties": {
                "predictor": {
                    "type": "object",
                    "required": ["model"],
                    "additionalProperties": False,
                    "properties": {
                        "minReplicas": {"type": "integer", "minimum": 0},
                        "maxReplicas": {"type": "integer", "minimum": 1},
                        # PodSpec fields: kserve_pod() checks them against Kubernetes' schema.
                        "automountServiceAccountToken": {"type": "boolean"},
                        "securityContext": {"type": "object"},
                        "volumes": {"type": "array"},
                        "model": {
                            "type": "object",
                            "required": ["modelFormat", "protocolVersion", "storageUri"],
                            "additionalProperties": False,
                            "properties": {
                                "modelFormat": {
                                    "type": "object",
                                    "required": ["name"],
                                    "properties": {
                                        "name": {"type": "string"},
                                        "version": {"type": "string"},
                                    },
                                    "additionalProperties": False,
                                },
                                "protocolVersion": {"enum": ["v1", "v2", "grpc-v2"]},
                                "storageUri": {
                                    "type": "string",
                                    "pattern": "^(pvc|s3|gs|https?|hdfs|webhdfs|oci)://.+",
                                },
                                "image": {"type": "string"},
                                "args": {"type": "array", "items": {"type": "string"}},
                                "env": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "required": ["name", "value"],
                                        "properties": {
                                            "name": {"type": "string"},
                                            "value": {"type": "string"},
                                        },
                                        "additionalProperties": False,
                                    },
                                },
                                "resources": {
                                    "type": "object",
                                    "required": ["requests", "limits"],
                                    "properties": {
                                        "requests": RESOURCE_LIST,
                                        "limits": RESOURCE_LIST,
                                    },
                                    "additionalProperties": False,
                                },
                                # Container fields, checked through kserve_pod() too.
                                "securityContext": {"type": "object"},
                                "volumeMounts": {"type": "array"},
                            },
                        },
                    },
                },
            },
        },
    },
}


def inference_service() -> dict[str, Any]:
    return only(load_docs(KSERVE / "inferenceservice.yaml"), "InferenceService")


def test_the_inference_service_matches_its_schema():
    jsonschema.Draft202012Validator.check_schema(INFERENCE_SERVICE_SCHEMA)
    jsonschema.Draft202012Validator(INFERENCE_SERVICE_SCHEMA).validate(inference_service())


def test_the_inference_service_schema_catches_typos():
    validator = jsonschema.Draft202012Validator(INFERENCE_SERVICE_SCHEMA)
    misspelt = inference_service()
    model = misspelt["spec"]["predictor"]["model"]
    model["protocolversion"] = model.pop("protocolVersion")
    bad_uri = inference_service()
    bad_uri["spec"]["predictor"]["model"]["storageUri"] = "/mnt/models"
    for broken in (misspelt, bad_uri):
        assert not validator.is_valid(broken)


def test_the_inference_service_uses_the_torchserve_runtime_with_v2_and_no_envelope():
    isvc = inference_service()
    model = isvc["spec"]["predictor"]["model"]
    assert model["modelFormat"]["name"] == "pytorch"
    assert model["protocolVersion"] == "v2"
    assert "serviceEnvelope" not in isvc["metadata"].get("labels", {})
    assert "--model-store=/mnt/models/model-store" in model["args"]
    assert "--ts-config=/mnt/models/config/config.properties" in model["args"]
    for bound in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(model["resources"][bound])


def test_the_kserve_config_has_the_runtime_keys_and_a_batching_snapshot():
    config = read_properties(KSERVE / "config" / "config.properties")
    for key in (
        "inference_address",
        "management_address",
        "metrics_address",
        "grpc_inference_port",
        "enable_envvars_config",
        "install_py_dep_per_model",
        "model_store",
        "model_snapshot",
    ):
        assert key in config, key
    assert config["model_store"] == "/mnt/models/model-store"
    snapshot = json.loads(config["model_snapshot"])
    assert snapshot["modelCount"] == len(snapshot["models"]) == 1
    versions = snapshot["models"]["gnn"]
    (version,) = versions.values()
    assert version["marName"] == "gnn.mar" and version["defaultVersion"] is True
    assert version["batchSize"] > 1 and version["maxBatchDelay"] > 0
    assert version["minWorkers"] >= 1
    assert version["minWorkers"] <= version["maxWorkers"]
    # An envelope answers only the first request of a batch: none here, and no TS_* override.
    assert not config.get("service_envelope")
    assert config["enable_envvars_config"] == "false"
    # The Open Inference Protocol's health and gRPC service, as in the shipped config (whose
    # servers tests/integration/test_grpc.py checks).
    assert config["ts_open_inference_protocol"] == "true"


def test_the_kserve_config_turns_tokens_off_only_behind_loopback():
    config = read_properties(KSERVE / "config" / "config.properties")
    if config.get("disable_token_authorization", "false") == "true":
        for key in ("inference_address", "management_address"):
            assert host_port(config[key])[0] == "127.0.0.1", key
        for key in ("grpc_inference_address", "grpc_management_address"):
            assert config[key] == "127.0.0.1", key
    assert config["enable_model_api"] == "false"


def test_the_inference_service_runs_as_non_root_without_a_token_or_privileges():
    pod = kserve_pod()["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] == 1000
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}


def test_every_path_torchserve_writes_in_the_kserve_pod_is_an_empty_dir():
    pod = kserve_pod()
    (container,) = pod["spec"]["containers"]
    deployment_like = {"spec": {"template": pod}}
    env = {item["name"]: item["value"] for item in container["env"]}
    for name in ("TEMP", "TMPDIR", "LOG_LOCATION", "METRICS_LOCATION"):
        mount, volume = mount_of(deployment_like, env[name])
        assert "emptyDir" in volume and not mount.get("readOnly"), name
    assert mount_of(deployment_like, env["TEMP"])[1] is mount_of(deployment_like, env["TMPDIR"])[1]
    # The working directory stays read-only: with tokens off no key_file.json is written there.
    config = read_properties(KSERVE / "config" / "config.properties")
    assert config["disable_token_authorization"] == "true"


# --- the emulation against kustomize itself ------------------------------------------------


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=[d.name for d in KUSTOMIZATIONS])
def test_kustomize_renders_what_the_tests_check(directory):
    """The objects every test here builds (tests/unit/deploy/kustomize.py) are the objects
    `kubectl kustomize` builds, up to the content hash kustomize appends to ConfigMap names."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed: the emulation is checked where it is")
    done = subprocess.run(
        [kubectl, "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    emulated = {object_key(doc): doc for doc in render(directory)}
    text = done.stdout
    for name in {name for kind, name in emulated if kind == "ConfigMap"}:
        text = re.sub(rf"\b{re.escape(name)}-[a-z0-9]{{10}}\b", name, text)
    rendered = {object_key(doc): doc for doc in yaml.safe_load_all(text) if doc}
    assert rendered.keys() == emulated.keys()
    for key, doc in rendered.items():
        assert doc == emulated[key], key
