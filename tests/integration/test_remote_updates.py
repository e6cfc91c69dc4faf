"""Live updates on a graph in a Redis Cluster, through TorchServe: a node archive served from a
real 3+3 cluster (``--graph-location redis://...``) and the same archive (same weights) served
from the local store, each with two workers and its own update log, take the same seeded
random stream of updates (nodes and edges added and removed, node and edge features set) and
answer every prediction identically (probabilities within 1e-6, same classes, same graph
version), on both workers; on a one-type graph and on a typed graph with edge features. The
stream is drawn from a reference live graph over the local store (tests/live_reference.py)."""

from __future__ import annotations

import random
import zipfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

from graph_assets import open_store
from graph_assets.input.synthetic_typed import fraud_graph, write_fraud_graph_csv
from handler.live.live_graph import LiveGraph, UpdateRequest
from tests.live_reference import live_ids, random_update
from tests.servers.redis_cluster import LocalCluster
from tests.servers.torchserve import Register, TorchServe
from tests.typed_live_reference import live_nodes, random_typed_update

from .archives import SHARED_UPDATE_SECRET, built, python_m, write_small_graph

pytestmark = pytest.mark.integration
SECRET = SHARED_UPDATE_SECRET  # the shared server's workers hold it
PREFIX, SEED, UPDATES, TOLERANCE = "live", 11, 30, 1e-6
COMMON = [
    *("--fanouts", "-1,-1", "--device", "cpu", "--batch-size", "1", "--enable-updates"),
    *("--min-workers", "2", "--max-workers", "2"),
]
# Each graph: how its store is built, and the model trained on it.
GRAPHS = {
    "one_type": ([], ["--arch", "gcn"]),
    "typed": (["--undirected"], ["--arch", "gat", "--hidden-dim", "16", "--heads", "2"]),
}
Update = Callable[[random.Random, LiveGraph, list[int]], list[dict[str, Any]]]


@dataclass(frozen=True)
class Served:
    server: TorchServe
    reference: LiveGraph  # the local store with the stream applied: what the stream draws on
    typed: bool


@pytest.fixture(scope="module", params=sorted(GRAPHS))
def served(
    request: pytest.FixtureRequest,
    register: Register,
    tmp_path_factory: pytest.TempPathFactory,
    redis_cluster: LocalCluster,
) -> Iterator[Served]:
    """``local`` (the store in the archive) and ``remote`` (the same store loaded into the
    session's cluster under a prefix of its own; the same weights), each on its own state
    directory, on the shared TorchServe."""
    name = request.param
    prefix = f"{PREFIX}-{name}"  # both graphs share the module's cluster
    build_options, model = GRAPHS[name]
    root = tmp_path_factory.mktemp(f"remote_updates_{name}")
    if name == "typed":
        graph = write_fraud_graph_csv(fraud_graph(150, 25, 60, 500, seed=4), root / "graph")
    else:
        graph = write_small_graph(root / "graph")
    store, model_store = root / "store", root / "model_store"
    build = ["--graph", str(graph), "--out", str(store), *build_options]
    python_m("graph_assets", "build", *build)
    reference = LiveGraph(open_store(store), root / "reference.log")
    try:
        load = ["--store", str(store), "--url", redis_cluster.url, "--prefix", prefix]
        python_m("graph_assets", "load-redis", *load, "--block-size", "8")
        local = ["--name", "local", "--epochs", "2", *model, *paths(root, "a")]
        built(*COMMON, "--store", str(store), *local)
        with zipfile.ZipFile(model_store / "local.mar") as archive:
            weights = Path(archive.extract("model.pt", root / "local"))
        remote = ["--graph-location", f"{redis_cluster.url}/{prefix}", "--weights", str(weights)]
        named = ["--store", str(store), "--name", "remote"]
        built(*COMMON, *named, *remote, *model, *paths(root, "b"))
        with register(model_store, ["local", "remote"]) as server:
            yield Served(server, reference, typed=name == "typed")
    finally:
        reference.close()


def paths(root: Path, state: str) -> list[str]:
    return ["--update-state-dir", str(root / state), "--export-path", str(root / "model_store")]


def post(server: TorchServe, model: str, body: dict[str, Any]) -> requests.Response:
    headers = {**server.auth("inference"), "X-Gnnserve-Update-Key": SECRET}
    return requests.post(
        f"{server.inference_url}/predictions/{model}", json=body, headers=headers, timeout=60
    )


def targets(served: Served) -> list[Any]:
    """The IDs of the target type's live nodes, as the reference has them."""
    live = served.reference
    if served.typed:
        return list(live.overlay.external_ids(live_nodes(live, 0)))
    return live_ids(live)


def check_alike(served: Served, nodes: list[Any]) -> None:
    """Each of ``nodes`` asked of both archives twice from four threads (so both workers of
    each answer): the same class, probabilities within TOLERANCE, the same graph version."""

    def both(node: Any) -> tuple[requests.Response, requests.Response]:
        body = {"node_id": node}
        return post(served.server, "local", body), post(served.server, "remote", body)

    with ThreadPoolExecutor(4) as pool:
        pairs = list(pool.map(both, nodes + nodes))
    for local, remote in pairs:
        assert local.status_code == 200 and remote.status_code == 200, (local.text, remote.text)
        a, b = local.json(), remote.json()
        assert a["predicted_class"] == b["predicted_class"], (a, b)
        assert a["graph_version"] == b["graph_version"], (a, b)
        gap = np.abs(np.subtract(a["probabilities"], b["probabilities"])).max()
        assert gap <= TOLERANCE, (a, b)


def test_an_update_stream_answers_alike_from_the_cluster_and_the_local_store(
    served: Served,
) -> None:
    draw: Update = random_typed_update if served.typed else random_update
    rng, counter = random.Random(SEED), [0]
    for step in range(1, UPDATES + 1):
        operations = draw(rng, served.reference, counter)
        served.reference.update(UpdateRequest(operations))
        body = {"op": "update", "operations": operations}
        local, remote = post(served.server, "local", body), post(served.server, "remote", body)
        assert local.status_code == remote.status_code == 200, (body, local.text, remote.text)
        assert local.json()["graph_version"] == remote.json()["graph_version"]
        if step % 10 == 0:
            check_alike(served, targets(served))
    for model in ("local", "remote"):
        line = rf"-{model}_\S* MODEL_LOG - gnn batches:"
        served.server.wait_for_log(rf"(W-\d+){line}[\s\S]*(?!\1)(W-\d+){line}")
