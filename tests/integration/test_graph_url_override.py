"""An archive built against one Redis (a "staging" single Redis, stopped before serving) and
pointed by ``GNNSERVE_GRAPH_URL`` at another (a "production" 3+3 Redis Cluster holding the same
graph under another name) answers through TorchServe exactly as the same model built on the
local store; on that server an archive of another graph, and an archive whose graph is not in
Redis, are refused at start with one line each (the recorded checksum is still checked)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
import torch
from torch_geometric.nn.models import GraphSAGE

from graph_assets import generate_synthetic, open_store
from graph_assets.remote import load_store
from graph_assets.remote.connect import connect
from handler.graph.graph_source import GRAPH_URL_VARIABLE
from tests.servers.redis_cluster import LocalCluster
from tests.servers.redis_server import RedisServer
from tests.servers.torchserve import Register, Serve, TorchServe, model_worker_pids

from .archives import write_small_graph
from .test_remote_graph import COMMON, SAGE, answers, build_mar, python_m

pytestmark = pytest.mark.integration


def load(url: str, store: Path, prefix: str) -> None:
    client = connect(url, 5000)
    try:
        assert load_store(open_store(store), client, prefix, shown_url=url).complete
    finally:
        client.close()


@pytest.fixture(scope="module")
def production(redis_cluster: LocalCluster) -> LocalCluster:
    """The session's Redis Cluster (tests/conftest.py), empty for this module; the staging
    Redis is this module's own: it is stopped once the archives are built."""
    return redis_cluster


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, production: LocalCluster) -> dict[str, Path]:
    """small_local (the graph in the archive), small_remote and other_remote (built against
    the staging Redis, stopped once they are built); production holds small as ``prod``."""
    root = tmp_path_factory.mktemp("graph_url")
    small, other = root / "small_store", root / "other_store"
    python_m("graph_assets", "build", "--graph", str(write_small_graph(root / "small")),
             "--out", str(small))  # fmt: skip
    generate_synthetic(90, 400, other, feature_dim=8, num_classes=3, seed=5)
    staging = RedisServer(root / "staging").start()
    staging_url = f"redis://127.0.0.1:{staging.port}"
    torch.manual_seed(0)
    torch.save(GraphSAGE(**SAGE).state_dict(), root / "sage.pt")
    model = ["--model-class", "torch_geometric.nn.models.GraphSAGE",
             "--model-args", json.dumps(SAGE), "--weights", str(root / "sage.pt")]  # fmt: skip
    model_store = root / "model_store"
    try:
        load(staging_url, small, "small")
        load(staging_url, other, "other")
        for name, store, location in (
            ("small_local", small, []),
            ("small_remote", small, ["--graph-location", f"{staging_url}/small"]),
            ("other_remote", other, ["--graph-location", f"{staging_url}/other"]),
        ):
            result = build_mar("--store", str(store), "--name", name, "--export-path",
                               str(model_store), *location, *model, *COMMON)  # fmt: skip
            assert result.returncode == 0, result.stderr
    finally:
        staging.stop()
    load(production.url, small, "prod")
    return {"model_store": model_store, "small": small}


@pytest.fixture(scope="module")
def servers(
    serve: Serve, register: Register, built: dict[str, Path], production: LocalCluster
) -> Iterator[dict[str, TorchServe]]:
    """``local`` on the shared server; ``remote`` on a server of its own, whose environment
    (which its workers inherit) names the production cluster."""
    env = {GRAPH_URL_VARIABLE: f"{production.url}/prod"}
    store = built["model_store"]
    with (
        register(store, ["small_local"]) as local,
        serve(store, "small_remote=small_remote.mar", name="remote", env=env) as remote,
    ):
        yield {"local": local, "remote": remote}


def test_the_archive_serves_from_the_cluster_the_environment_names(
    servers: dict[str, TorchServe], built: dict[str, Path]
) -> None:
    store = open_store(built["small"])
    ids = store.external_ids(np.arange(store.num_nodes))
    bodies = [{"node_ids": ids[start : start + 16]} for start in range(0, len(ids), 16)]
    local = answers(servers["local"], "small_local", bodies)
    remote = answers(servers["remote"], "small_remote", bodies)
    assert len(local) == len(remote) == store.num_nodes
    for mine, theirs in zip(local, remote, strict=True):
        assert theirs["node_id"] == mine["node_id"]
        assert theirs["predicted_class"] == mine["predicted_class"]
        gap = np.abs(np.array(theirs["probabilities"]) - np.array(mine["probabilities"])).max()
        assert gap <= 1e-6


@pytest.mark.parametrize(
    ("archive", "problem"),
    [
        ("other_remote", f"{GRAPH_URL_VARIABLE}: redis://127.0.0.1:"),
        ("small_local", f"{GRAPH_URL_VARIABLE} is set but this archive's graph is in the archive"),
    ],
)
def test_another_graph_or_one_not_in_redis_is_refused_at_start(
    servers: dict[str, TorchServe], archive: str, problem: str
) -> None:
    server = servers["remote"]
    name = f"refused_{archive}"
    response = requests.post(
        f"{server.management_url}/models",
        params={"url": f"{archive}.mar", "model_name": name, "synchronous": "true"},
        headers=server.auth("management"),
        timeout=120,
    )
    assert response.status_code == 500, response.text
    log = server.wait_for_log(rf"-{name}_1\.0-.*gnn worker refuses to start: ")
    lines = [
        line.split("gnn worker refuses to start: ")[-1]
        for line in log.splitlines()
        if f"-{name}_1.0-" in line and "gnn worker refuses to start: " in line
    ]
    assert lines and all(line.startswith(problem) for line in lines), lines
    if archive == "other_remote":
        assert all("expected" in line for line in lines), lines
    print(f"\n[{GRAPH_URL_VARIABLE}] {archive}: {lines[0]}")
    assert not model_worker_pids(server, name)
