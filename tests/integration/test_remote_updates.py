"""Live updates on a graph in a Redis Cluster, through TorchServe: one node archive served from
a real 3+3 cluster (``--graph-location redis://...``) and the same archive (same weights) served
from the local store, each with two workers and its own update log, take the same seeded random
stream of updates (add and remove nodes and edges, set features) and answer every prediction
identically (probabilities within 1e-6, same classes, same graph version), on both workers."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import requests

from bench.harness.redis_server import MISSING, redis_server_binary
from bench.harness.torchserve import Serve, TorchServe
from tests.redis_cluster import LocalCluster

from .archives import ROOT, write_small_graph

pytestmark = pytest.mark.integration
SECRET = "remote-updates-secret-0123456789"
PREFIX, SEED, UPDATES, TOLERANCE = "live", 11, 30, 1e-6
COMMON = [
    *("--arch", "gcn", "--fanouts", "-1,-1", "--device", "cpu", "--batch-size", "1"),
    *("--min-workers", "2", "--max-workers", "2", "--enable-updates"),
]


@dataclass(frozen=True)
class Served:
    server: TorchServe
    graph: Path  # nodes.csv and edges.csv the store was built from


@pytest.fixture(scope="module")
def served(serve: Serve, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """``local`` (the store in the archive) and ``remote`` (the same store loaded into the
    cluster; the same weights), each on its own state directory, in one TorchServe."""
    if redis_server_binary() is None:
        pytest.fail(MISSING)
    root = tmp_path_factory.mktemp("remote_updates")
    cluster = LocalCluster(root / "cluster").start()
    try:
        graph = write_small_graph(root / "graph")
        store, model_store = root / "store", root / "model_store"
        run_python("-m", "graph_assets", "build", "--graph", str(graph), "--out", str(store))
        load = ["--store", str(store), "--url", cluster.url, "--prefix", PREFIX]
        run_python("-m", "graph_assets", "load-redis", *load, "--block-size", "8")
        build_mar("--store", str(store), "--name", "local", "--epochs", "5", *paths(root, "a"))
        with zipfile.ZipFile(model_store / "local.mar") as archive:
            weights = Path(archive.extract("model.pt", root / "local"))
        remote = ["--graph-location", f"{cluster.url}/{PREFIX}", "--weights", str(weights)]
        build_mar("--store", str(store), "--name", "remote", *remote, *paths(root, "b"))
        env = {"GNNSERVE_UPDATE_SECRET": SECRET}
        models = "local=local.mar,remote=remote.mar"
        with serve(model_store, models, name="remote_updates", env=env) as server:
            yield Served(server, graph)
    finally:
        cluster.stop()


def paths(root: Path, state: str) -> list[str]:
    return ["--update-state-dir", str(root / state), "--export-path", str(root / "model_store")]


def run_python(*args: str) -> None:
    subprocess.run([sys.executable, *args], check=True, cwd=ROOT, timeout=300)


def build_mar(*options: str) -> None:
    subprocess.run(
        [str(ROOT / "build_mar.sh"), *COMMON, *options],
        check=True,
        env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
        timeout=600,
    )


def post(server: TorchServe, model: str, body: dict[str, Any]) -> requests.Response:
    headers = {**server.auth("inference"), "X-Gnnserve-Update-Key": SECRET}
    return requests.post(
        f"{server.inference_url}/predictions/{model}", json=body, headers=headers, timeout=60
    )


class Stream:
    """A seeded stream of update requests over the graph as it changes: what exists is tracked
    so most operations apply, and one that does not is refused alike by both archives."""

    def __init__(self, graph: Path, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes = list(pd.read_csv(graph / "nodes.csv")["id"])
        edges = pd.read_csv(graph / "edges.csv")
        self.edges = list(zip(edges["src"], edges["dst"], strict=True))
        self.added = 0

    def pick(self) -> str:
        return self.nodes[int(self.rng.integers(len(self.nodes)))]

    def features(self) -> list[float]:
        return [round(float(v), 4) for v in self.rng.normal(size=8)]

    def operation(self) -> dict[str, Any]:
        kind = self.rng.choice(
            ["add_node", "add_edge", "remove_edge", "set_features", "remove_node"],
            p=[0.2, 0.35, 0.2, 0.15, 0.1],
        )
        if kind == "add_node":
            node = f"new_{self.added}"
            self.added += 1
            self.nodes.append(node)
            return {"type": "add_node", "id": node, "x": self.features()}
        if kind == "add_edge":
            src, dst = self.pick(), self.pick()
            self.edges.append((src, dst))
            return {"type": "add_edge", "src": src, "dst": dst}
        if kind == "remove_edge" and self.edges:
            src, dst = self.edges.pop(int(self.rng.integers(len(self.edges))))
            return {"type": "remove_edge", "src": src, "dst": dst}
        if kind == "remove_node":
            node = self.pick()
            self.nodes.remove(node)
            self.edges = [e for e in self.edges if node not in e]
            return {"type": "remove_node", "id": node}
        return {"type": "set_features", "id": self.pick(), "x": self.features()}

    def request(self) -> dict[str, Any]:
        count = int(self.rng.integers(1, 4))
        return {"op": "update", "operations": [self.operation() for _ in range(count)]}


def same_prediction(local: requests.Response, remote: requests.Response) -> None:
    assert local.status_code == remote.status_code, (local.text, remote.text)
    if local.status_code != 200:
        assert local.json()["type"] == remote.json()["type"]
        return
    a, b = local.json(), remote.json()
    assert a["predicted_class"] == b["predicted_class"], (a, b)
    assert a["graph_version"] == b["graph_version"], (a, b)
    assert np.allclose(a["probabilities"], b["probabilities"], rtol=0, atol=TOLERANCE), (a, b)


def test_an_update_stream_answers_alike_from_the_cluster_and_the_local_store(
    served: Served,
) -> None:
    server, stream = served.server, Stream(served.graph, SEED)
    applied = 0
    for _ in range(UPDATES):
        body = stream.request()
        local, remote = post(server, "local", body), post(server, "remote", body)
        assert local.status_code == remote.status_code, (body, local.text, remote.text)
        assert local.status_code in (200, 404, 409), local.text
        if local.status_code == 200:
            applied += 1
            assert local.json()["graph_version"] == remote.json()["graph_version"]
        touched = {
            n for op in body["operations"] for n in (op.get("id"), op.get("src"), op.get("dst"))
        }
        for node in sorted(n for n in touched if n is not None):
            request = {"node_id": node}
            same_prediction(post(server, "local", request), post(server, "remote", request))
    assert applied >= UPDATES // 2, f"only {applied} of {UPDATES} update requests applied"
    print(f"\n{applied} of {UPDATES} update requests applied alike, the rest refused alike")

    # Every node of the graph as it is now, each asked of both workers of both archives
    # (four threads, each node twice), answers alike.
    every = sorted(stream.nodes)

    def both(node: str) -> tuple[requests.Response, requests.Response]:
        return post(server, "local", {"node_id": node}), post(server, "remote", {"node_id": node})

    with ThreadPoolExecutor(4) as pool:
        pairs = list(pool.map(both, every + every))
    for local, remote in pairs:
        assert local.status_code == 200, local.text
        same_prediction(local, remote)
    for model in ("local", "remote"):
        line = rf"-{model}_\S* MODEL_LOG - gnn batches:"
        server.wait_for_log(rf"(W-\d+){line}[\s\S]*(?!\1)(W-\d+){line}")
