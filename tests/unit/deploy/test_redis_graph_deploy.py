"""deploy/kubernetes-redis-graph: replicas serving a graph that lives in a Redis Cluster, pointed
at it through the Secret gnnserve-redis-graph, with the update log of deploy/kubernetes-redis
unchanged and no graph volume; and graph-loader.yaml, which loads the graph where they read it.

Schemas and the emulation against `kubectl kustomize` are checked in test_manifests.py."""

from __future__ import annotations

import re
import stat
from pathlib import Path
from typing import Any

import yaml

from graph_assets.remote.connect import PASSWORD_FILE_VARIABLE
from handler.graph.graph_source import GRAPH_PASSWORD_FILE_VARIABLE, GRAPH_URL_VARIABLE
from tests.unit.deploy.kustomize import load_docs, only, render

ROOT = Path(__file__).resolve().parents[3]
REDIS_LOG = ROOT / "deploy" / "kubernetes-redis"
REDIS_GRAPH = ROOT / "deploy" / "kubernetes-redis-graph"
LOADER = REDIS_GRAPH / "graph-loader.yaml"
SECRET = "gnnserve-redis-graph"
OPERATING_DOCS = (ROOT / "docs" / "redis-cluster.md", ROOT / "docs" / "kubernetes.md")


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"] if workload["kind"] == "Pod" else workload["spec"]["template"]["spec"]


def container(workload: dict[str, Any]) -> dict[str, Any]:
    (only_one,) = pod_spec(workload)["containers"]
    return only_one


def env_of(workload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in container(workload).get("env", [])}


def by_name(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in items}


def deployment(directory: Path = REDIS_GRAPH) -> dict[str, Any]:
    return only(render(directory), "Deployment")


def password_secret(workload: dict[str, Any], variable: str) -> dict[str, Any]:
    """The Secret volume whose mount holds the file ``variable`` names, checked read-only and
    mode 0440 at most (the handler refuses a file group can write or others can read)."""
    path = Path(env_of(workload)[variable]["value"])
    (mount,) = [
        m for m in container(workload)["volumeMounts"] if Path(m["mountPath"]) == path.parent
    ]
    assert mount.get("readOnly") is True
    secret = by_name(pod_spec(workload)["volumes"])[mount["name"]]["secret"]
    assert secret["defaultMode"] & (stat.S_IWGRP | stat.S_IRWXO) == 0
    assert secret["items"] == [{"key": "password", "path": path.name}]
    return secret


def from_secret(workload: dict[str, Any], variable: str) -> tuple[str, str]:
    item = env_of(workload)[variable]
    assert "value" not in item, f"{variable} must come from a Secret, never a literal"
    ref = item["valueFrom"]["secretKeyRef"]
    return ref["name"], ref["key"]


def test_the_replicas_read_the_graph_url_and_password_from_the_secret():
    served = deployment()
    assert from_secret(served, GRAPH_URL_VARIABLE) == (SECRET, "url")
    assert password_secret(served, GRAPH_PASSWORD_FILE_VARIABLE)["secretName"] == SECRET


def test_the_update_log_is_deploy_kubernetes_redis_s_and_only_the_graph_volume_goes():
    log, served = deployment(REDIS_LOG), deployment()
    env = env_of(served)
    for name, item in env_of(log).items():
        assert env[name] == item, name
    assert set(env) - set(env_of(log)) == {GRAPH_URL_VARIABLE, GRAPH_PASSWORD_FILE_VARIABLE}
    # The log's password stays its own Secret's: the graph's cluster may be another server.
    assert from_secret(served, "GNNSERVE_UPDATE_LOG_URL")[0] != SECRET
    volumes, log_volumes = by_name(pod_spec(served)["volumes"]), by_name(pod_spec(log)["volumes"])
    assert set(log_volumes) - set(volumes) == {"graphs"}
    assert set(volumes) - set(log_volumes) == {"redis-graph-secret"}
    mounts = by_name(container(served)["volumeMounts"])
    assert set(by_name(container(log)["volumeMounts"])) - set(mounts) == {"graphs"}
    for name, volume in volumes.items():
        assert log_volumes.get(name, volume) == volume, name
    unchanged = {k: v for k, v in container(log).items() if k not in ("env", "volumeMounts")}
    assert {k: container(served)[k] for k in unchanged} == unchanged


def test_no_pod_holds_the_graph():
    objects = render(REDIS_GRAPH)
    claims = [doc["metadata"]["name"] for doc in objects if doc["kind"] == "PersistentVolumeClaim"]
    assert claims == ["gnnserve-model-store"]  # the archive's, as in the base
    served = deployment()
    assert all(m["mountPath"] != "/graphs" for m in container(served)["volumeMounts"])
    claimed = [v for v in pod_spec(served)["volumes"] if "persistentVolumeClaim" in v]
    assert [v["persistentVolumeClaim"]["claimName"] for v in claimed] == claims


def test_at_least_three_replicas_one_down_at_a_time():
    objects = render(REDIS_GRAPH)
    hpa = only(objects, "HorizontalPodAutoscaler")
    assert hpa["spec"]["minReplicas"] >= 3 and hpa["spec"]["maxReplicas"] >= 3
    assert "replicas" not in deployment()["spec"]  # the HPA owns the count
    pdb = only(objects, "PodDisruptionBudget")
    labels = deployment()["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["maxUnavailable"] == 1


def test_no_manifest_carries_a_redis_url_or_a_password_as_a_literal():
    documents = [*render(REDIS_GRAPH), *load_docs(LOADER)]
    text = yaml.safe_dump_all(documents)
    assert not re.search(r"rediss?://", text), "a Redis URL belongs in the Secret"
    for doc in documents:
        if doc["kind"] in ("Deployment", "Pod"):
            for item in container(doc).get("env", []):
                if re.search(r"SECRET|PASSWORD|TOKEN|KEY|URL", item["name"]):
                    assert "valueFrom" in item or item["name"].endswith("_FILE"), item


def test_the_loader_loads_where_the_replicas_read():
    (loader,) = load_docs(LOADER)
    assert from_secret(loader, GRAPH_URL_VARIABLE) == (SECRET, "url")
    assert password_secret(loader, PASSWORD_FILE_VARIABLE)["secretName"] == SECRET
    served = container(deployment())
    assert container(loader)["image"] == served["image"]  # the server's dependencies
    assert pod_spec(loader)["restartPolicy"] == "Never"
    assert pod_spec(loader)["securityContext"] == pod_spec(deployment())["securityContext"]
    # What `kubectl cp` brings in (the store, graph_assets/) lands on the pod's emptyDir,
    # where Python finds graph_assets.
    (load,) = [v for v in pod_spec(loader)["volumes"] if "emptyDir" in v]
    (mount,) = [m for m in container(loader)["volumeMounts"] if m["name"] == load["name"]]
    assert env_of(loader)["PYTHONPATH"]["value"] == mount["mountPath"]
    assert container(loader)["workingDir"] == mount["mountPath"]


def test_the_operating_docs_name_the_secret_the_overlay_reads():
    text = "\n".join(path.read_text() for path in OPERATING_DOCS)
    assert "kubectl apply -k deploy/kubernetes-redis-graph" in text
    assert f"kubectl create secret generic {SECRET}" in text
    assert "--from-literal=url=" in text and "--from-file=password=" in text
    assert f"kubectl apply -f {LOADER.relative_to(ROOT)}" in text
    assert "python -m graph_assets load-redis" in text
