"""Precomputed archives served from a graph in a Redis Cluster, through build_mar.sh and
TorchServe: a node archive (gcn) and a link archive (sage, live updates) built with
``--precompute --graph-location redis://...`` (the build loads the rows beside the graph) and
the same archives (same weights) built over the local store, each with two workers and its
own update log, take the same seeded random stream of updates and answer alike (predictions
and pair scores within 1e-6, the same classes, the same top-k, the same graph version)."""

from __future__ import annotations

import random
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

from graph_assets import open_store
from handler.live.live_graph import LiveGraph, UpdateRequest
from tests.live_reference import live_ids, random_update
from tests.servers.redis_cluster import LocalCluster
from tests.servers.torchserve import Register, TorchServe

from .archives import SHARED_UPDATE_SECRET, built, python_m, write_small_graph

pytestmark = pytest.mark.integration
SECRET = SHARED_UPDATE_SECRET  # the shared server's workers hold it
PREFIX, SEED, UPDATES, TOLERANCE = "rows", 5, 20, 1e-6
COMMON = [
    *("--fanouts", "2,2", "--device", "cpu", "--batch-size", "1", "--enable-updates"),
    *("--min-workers", "2", "--max-workers", "2", "--precompute", "--epochs", "3"),
]
TASKS = {"node": ["--arch", "gcn"], "link": ["--task", "link", "--arch", "sage"]}


@dataclass(frozen=True)
class Served:
    server: TorchServe
    reference: LiveGraph  # the local store with the stream applied: what the stream draws on


@pytest.fixture(scope="module")
def served(
    register: Register, tmp_path_factory: pytest.TempPathFactory, redis_cluster: LocalCluster
) -> Iterator[Served]:
    """``<task>_local`` (the store in the archive) and ``<task>_remote`` (the store loaded into
    the session's cluster, the rows loaded beside it by the build; the same weights), on the
    shared TorchServe."""
    root = tmp_path_factory.mktemp("remote_precompute")
    graph, store, model_store = write_small_graph(root / "graph"), root / "store", root / "mars"
    python_m("graph_assets", "build", "--graph", str(graph), "--out", str(store))
    reference = LiveGraph(open_store(store), root / "reference.log")
    try:
        load = ["--store", str(store), "--url", redis_cluster.url, "--prefix", PREFIX]
        python_m("graph_assets", "load-redis", *load, "--block-size", "8")
        models = []
        for task, options in TASKS.items():
            local = f"{task}_local"
            built(*COMMON, "--store", str(store), "--name", local, *options, *paths(root, local))
            with zipfile.ZipFile(model_store / f"{local}.mar") as archive:
                weights = Path(archive.extract("model.pt", root / local))
            remote = f"{task}_remote"
            where = ["--graph-location", f"{redis_cluster.url}/{PREFIX}", "--weights", str(weights)]
            named = ["--store", str(store), "--name", remote]
            built(*COMMON, *named, *where, *options, *paths(root, remote))
            with zipfile.ZipFile(model_store / f"{remote}.mar") as archive:
                names = archive.namelist()
            assert "precomputed/meta.json" in names
            assert not any(name.endswith(".npy") for name in names if "precomputed/" in name)
            models += [local, remote]
        with register(model_store, models) as server:
            yield Served(server, reference)
    finally:
        reference.close()


def paths(root: Path, state: str) -> list[str]:
    return ["--update-state-dir", str(root / state), "--export-path", str(root / "mars")]


def post(server: TorchServe, model: str, body: dict[str, Any]) -> requests.Response:
    headers = {**server.auth("inference"), "X-Gnnserve-Update-Key": SECRET}
    return requests.post(
        f"{server.inference_url}/predictions/{model}", json=body, headers=headers, timeout=60
    )


def both(served: Served, task: str, body: dict[str, Any]) -> tuple[dict, dict]:
    local, remote = (post(served.server, f"{task}_{where}", body) for where in ("local", "remote"))
    assert local.status_code == remote.status_code == 200, (body, local.text, remote.text)
    a, b = local.json(), remote.json()
    assert a.get("graph_version") == b.get("graph_version"), (a, b)
    return a, b


def check_alike(served: Served) -> None:
    """Every live node's prediction, some pair scores and top-k lists, asked twice of both
    archives of each task (so both workers answer)."""
    ids = live_ids(served.reference)
    for _ in range(2):
        a, b = both(served, "node", {"node_ids": ids})
        for mine, theirs in zip(a["predictions"], b["predictions"], strict=True):
            assert mine["predicted_class"] == theirs["predicted_class"], (mine, theirs)
            gap = np.abs(np.subtract(mine["probabilities"], theirs["probabilities"])).max()
            assert gap <= TOLERANCE, (mine, theirs)
        pairs = [[ids[i], ids[(7 * i + 3) % len(ids)]] for i in range(0, len(ids), 3)]
        a, b = both(served, "link", {"pairs": pairs})
        scores = [[p["score"] for p in answer["predictions"]] for answer in (a, b)]
        assert np.abs(np.subtract(*scores)).max() <= TOLERANCE
        for src in ids[:: max(1, len(ids) // 8)]:
            a, b = both(served, "link", {"src": src, "top_k": 10})
            assert [r["dst"] for r in a["recommendations"]] == [
                r["dst"] for r in b["recommendations"]
            ]


def test_an_update_stream_answers_alike_from_rows_in_the_cluster_and_the_local_store(
    served: Served,
) -> None:
    check_alike(served)
    rng, counter = random.Random(SEED), [0]
    for step in range(1, UPDATES + 1):
        operations = random_update(rng, served.reference, counter)
        served.reference.update(UpdateRequest(operations))
        body = {"op": "update", "operations": operations}
        for task in TASKS:
            both(served, task, body)
        if step % 10 == 0:
            check_alike(served)
