"""Node archives served from a graph in a real Redis Cluster (3 primaries, 3 replicas) through
build_mar.sh and TorchServe answer exactly as the same archives built on the local store, for
a one-type graph and the typed fraud graph (the user's HeteroConv reading edge features); the
build refuses a prefix holding another graph and an unreachable Redis in one line."""

from __future__ import annotations

import json
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
import torch
import yaml
from torch_geometric.nn.models import GraphSAGE

from graph_assets import open_store
from graph_assets.input.synthetic_typed import fraud_graph, write_fraud_graph_csv
from graph_assets.remote import load_store
from graph_assets.remote.connect import connect
from tests.servers.ports import free_ports
from tests.servers.redis_cluster import LocalCluster
from tests.servers.torchserve import Register, TorchServe
from tests.unit.archive_build import user_models

from .archives import build_mar, python_m, write_small_graph

pytestmark = pytest.mark.integration
SAGE = {"in_channels": 8, "hidden_channels": 16, "num_layers": 2, "out_channels": 3}
HETERO_CONV = {"devices": 60, "hidden": 8, "classes": 2, "edge_dim": 2}
COMMON = ["--fanouts", "3,2", "--batch-size", "4", "--max-batch-delay", "50", "--device", "cpu"]


@pytest.fixture(scope="module")
def cluster(redis_cluster: LocalCluster) -> LocalCluster:
    """The session's Redis Cluster (tests/conftest.py), empty for this module."""
    return redis_cluster


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, cluster: LocalCluster) -> dict[str, Path]:
    """The one-type and the typed store, each loaded into the cluster, and for each the same
    model (the same weights) built twice: on the local store, and from the cluster."""
    root = tmp_path_factory.mktemp("remote_graph")
    stores = {"small": root / "small_store", "fraud": root / "fraud_store"}
    python_m("graph_assets", "build", "--graph", str(write_small_graph(root / "small")),
             "--out", str(stores["small"]))  # fmt: skip
    fraud = write_fraud_graph_csv(fraud_graph(150, 25, 60, 500, seed=4), root / "fraud")
    python_m("graph_assets", "build", "--graph", str(fraud), "--undirected",
             "--out", str(stores["fraud"]))  # fmt: skip
    client = connect(cluster.url, 5000)
    try:
        for prefix, path in stores.items():
            assert load_store(open_store(path), client, prefix, shown_url=cluster.url).complete
    finally:
        client.close()
    torch.manual_seed(0)
    torch.save(GraphSAGE(**SAGE).state_dict(), root / "sage.pt")
    torch.save(user_models.FraudHeteroConv(**HETERO_CONV).state_dict(), root / "own.pt")
    models = {
        "small": ["--model-class", "torch_geometric.nn.models.GraphSAGE",
                  "--model-args", json.dumps(SAGE), "--weights", str(root / "sage.pt")],
        "fraud": ["--model-class", "FraudHeteroConv", "--model-file", user_models.__file__,
                  "--model-args", json.dumps(HETERO_CONV), "--weights", str(root / "own.pt"),
                  "--embedding-method", "head"],
    }  # fmt: skip
    model_store = root / "model_store"
    for graph, model in models.items():
        for name, where in (
            (f"{graph}_local", []),
            (f"{graph}_remote", [f"{cluster.url}/{graph}"]),
        ):
            location = ["--graph-location", *where] if where else []
            result = build_mar("--store", str(stores[graph]), "--name", name, "--export-path",
                               str(model_store), *location, *model, *COMMON)  # fmt: skip
            assert result.returncode == 0, result.stderr
    return {"model_store": model_store, **stores}


@pytest.fixture(scope="module")
def server(register: Register, built: dict[str, Path]) -> Iterator[TorchServe]:
    names = ["small_local", "small_remote", "fraud_local", "fraud_remote"]
    with register(built["model_store"], names) as running:
        yield running


def answers(server: TorchServe, model: str, bodies: list[dict]) -> list[dict]:
    out = []
    for body in bodies:
        reply = requests.post(
            f"{server.inference_url}/predictions/{model}",
            json=body,
            headers=server.auth("inference"),
            timeout=60,
        )
        assert reply.status_code == 200, reply.text
        out += reply.json().get("predictions", [reply.json()])
    return out


@pytest.mark.parametrize(("graph", "target"), [("small", None), ("fraud", "user")])
def test_served_from_the_cluster_equals_served_locally(server, built, graph, target) -> None:
    store = open_store(built[graph])
    count = store.schema.target_type.num_nodes
    ids = store.external_ids(np.arange(count))
    bodies = [{"node_ids": ids[start : start + 16]} for start in range(0, count, 16)]
    bodies += [{"node_ids": ids[:5], "return_embedding": True}]
    local = answers(server, f"{graph}_local", bodies)
    remote = answers(server, f"{graph}_remote", bodies)
    assert len(local) == len(remote) == count + 5
    for mine, theirs in zip(local, remote, strict=True):
        assert theirs["node_id"] == mine["node_id"]
        assert theirs["predicted_class"] == mine["predicted_class"]
        gap = np.abs(np.array(theirs["probabilities"]) - np.array(mine["probabilities"])).max()
        assert gap <= 1e-6
        if "embedding" in mine:
            gap = np.abs(np.array(theirs["embedding"]) - np.array(mine["embedding"])).max()
            assert gap <= 1e-6


def test_the_archive_records_the_url_and_checksum_not_the_graph(built, cluster) -> None:
    archive = zipfile.ZipFile(built["model_store"] / "small_remote.mar")
    assert not [name for name in archive.namelist() if name.startswith("graph/")]
    gnn = yaml.safe_load(archive.read("model-config.yaml"))["gnn"]
    assert gnn["graph_location"] == f"{cluster.url}/small"
    assert gnn["graph_checksum"] == open_store(built["small"]).checksum
    assert gnn["remote_cache_mb"] == 256 and gnn["remote_timeout_ms"] == 1000


def test_a_graph_that_is_not_there_is_refused_at_build(built, cluster, tmp_path) -> None:
    (port,) = free_ports(1)
    weights = str(built["model_store"].parent / "sage.pt")
    cases = [
        (f"{cluster.url}/fraud", "expected"),  # another graph under that prefix
        (f"redis://127.0.0.1:{port}/small", "cannot be used"),  # nothing listens there
    ]
    for location, words in cases:
        result = build_mar(
            "--store", str(built["small"]), "--graph-location", location, "--export-path",
            str(tmp_path / "ms"), "--model-class", "torch_geometric.nn.models.GraphSAGE",
            "--model-args", json.dumps(SAGE), "--weights", weights,
            *COMMON,
        )  # fmt: skip
        assert result.returncode == 2 and words in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert not (tmp_path / "ms").exists() or not list((tmp_path / "ms").iterdir())
