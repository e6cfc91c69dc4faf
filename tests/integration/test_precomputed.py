"""Precomputed archives through a real TorchServe (2 workers, batching on, sampled fanouts):
after a random stream of live updates every node's answer equals PyG's full-graph forward on
the updated graph, on both workers; two replicas on one Redis log hold the same rows."""

from __future__ import annotations

import contextlib
import io
import json
import random
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import torch

from graph_assets import open_store
from graph_assets.live.redis_log import RedisLogConfig
from handler.live.live_graph import LiveGraph, UpdateRequest
from model import build_model
from tests.live_reference import materialized_embeddings, materialized_forward, random_update
from tests.servers.torchserve import TorchServe, model_worker_pids

from .archives import SHARED_UPDATE_SECRET, build_archive, write_small_graph

pytestmark = pytest.mark.integration
SECRET = SHARED_UPDATE_SECRET  # the shared server's workers hold it; the replicas get it too
UPDATES = 120


def precomputed_archive(root: Path, arch: str, name: str, *task: str) -> Path:
    """NAME.mar; a name of its own, as the shared server serves a ``gnn`` and a ``link``."""
    return build_archive(
        root / "model_store",
        write_small_graph(root / "graph"),
        *task,
        *("--name", name),
        *("--arch", arch, "--epochs", "3", "--fanouts", "2,2", "--precompute"),
        *("--batch-size", "4", "--max-batch-delay", "5", "--min-workers", "2"),
        *("--max-workers", "2", "--enable-updates", "--update-state-dir", str(root / "state")),
    )


@contextlib.contextmanager
def reference_graph(
    model_store: Path, work: Path, name: str = "gnn", **log
) -> Iterator[tuple[LiveGraph, object]]:
    """The archive's graph and weights in this process; updates go to its own log unless it
    follows the servers' (``redis_log``)."""
    with zipfile.ZipFile(model_store / f"{name}.mar") as archive:
        archive.extractall(work, [n for n in archive.namelist() if n.startswith("graph/")])
        model = build_model(json.loads(archive.read("model_config.json")))
        model.load_state_dict(torch.load(io.BytesIO(archive.read("model.pt")), weights_only=True))
    log_path = None if log else work / "reference.log"
    live = LiveGraph(open_store(work / "graph"), log_path, **log)
    try:
        yield live, model.eval()
    finally:
        live.close()


def update(server: TorchServe, operations: list[dict], model: str = "gnn") -> requests.Response:
    headers = {**server.auth("inference"), "X-Gnnserve-Update-Key": SECRET}
    return requests.post(
        f"{server.inference_url}/predictions/{model}",
        json={"op": "update", "operations": operations},
        headers=headers,
        timeout=60,
    )


def served(server: TorchServe, ids: list, model: str = "gnn") -> torch.Tensor:
    """Every node's probabilities, 8 nodes a request."""
    rows = []
    for start in range(0, len(ids), 8):
        answer = requests.post(
            f"{server.inference_url}/predictions/{model}",
            json={"node_ids": ids[start : start + 8]},
            headers=server.auth("inference"),
            timeout=60,
        )
        assert answer.status_code == 200, answer.text
        rows += [p["probabilities"] for p in answer.json()["predictions"]]
    return torch.tensor(rows)


@pytest.mark.parametrize("arch", ["gcn", "sage", "gat", "gin"])
def test_exact_after_a_random_update_stream_on_two_workers(register, tmp_path, arch):
    name = f"precomputed_{arch}"
    model_store = precomputed_archive(tmp_path, arch, name)
    with (
        register(model_store, [name]) as server,
        reference_graph(model_store, tmp_path / "reference", name) as (live, model),
    ):
        assert len(model_worker_pids(server, name, ready=True)) == 2  # the archive's workers
        rng, counter = random.Random(23), [0]
        operations = 0
        for _ in range(UPDATES):
            batch = [
                op for _ in range(rng.randint(1, 3)) for op in random_update(rng, live, counter)
            ]
            answer = update(server, batch, name)
            if answer.status_code != 200:  # two ops of one batch may conflict: same on both
                assert answer.status_code in (404, 409), answer.text
                continue
            live.update(UpdateRequest(batch))
            operations += len(batch)
        assert operations >= 200
        ids, expected = materialized_forward(live, model)
        for _ in range(2):  # batches land on either worker: both are held to the reference
            table = served(server, ids, name)
            assert float((table - expected).abs().max()) <= 1e-5
        described = requests.get(
            f"{server.management_url}/models/{name}?customized=true",
            headers=server.auth("management"),
            timeout=30,
        ).json()
        custom = described[0]["customizedMetadata"]  # TorchServe parses our JSON
        assert custom["precomputed"]["layers"] == 2


def test_two_replicas_on_one_redis_log_hold_identical_rows(serve, tmp_path, redis_server):
    model_store = precomputed_archive(tmp_path, "gcn", "gnn")
    env = {"GNNSERVE_UPDATE_SECRET": SECRET, "GNNSERVE_UPDATE_LOG_URL": redis_server.url}
    with contextlib.ExitStack() as stack:
        replicas = [
            stack.enter_context(serve(model_store, "gnn=gnn.mar", name=f"pre-{i}", env=env))
            for i in range(2)
        ]
        config = RedisLogConfig(redis_server.url)
        live, model = stack.enter_context(
            reference_graph(model_store, tmp_path / "reference", redis_log=config)
        )
        rng, counter = random.Random(5), [0]
        last = 0
        for _ in range(60):
            live.sync()
            answer = update(rng.choice(replicas), random_update(rng, live, counter))
            assert answer.status_code == 200, answer.text
            last = answer.json()["seq"]
        assert live.catch_up(last, timeout_s=10)
        ids, expected = materialized_forward(live, model)
        first, second = (served(replica, ids) for replica in replicas)
        assert float((first - second).abs().max()) <= 1e-6
        assert float((first - expected).abs().max()) <= 1e-5


def test_a_live_link_archive_scores_and_ranks_the_updated_graph(register, tmp_path):
    model_store = precomputed_archive(tmp_path, "sage", "precomputed_link", "--task", "link")
    with (
        register(model_store, ["precomputed_link"]) as server,
        reference_graph(model_store, tmp_path / "reference", "precomputed_link") as (live, model),
    ):
        rng, counter = random.Random(9), [0]
        for _ in range(60):
            batch = random_update(rng, live, counter)
            answer = update(server, batch, "precomputed_link")
            assert answer.status_code == 200, answer.text
            live.update(UpdateRequest(batch))
        ids, z, edges = materialized_embeddings(live, model)
        url = f"{server.inference_url}/predictions/precomputed_link"
        headers = server.auth("inference")
        pairs = [[ids[i], ids[(5 * i + 1) % len(ids)]] for i in range(30)]
        scored = requests.post(url, json={"pairs": pairs}, headers=headers, timeout=60)
        assert scored.status_code == 200, scored.text
        with torch.no_grad():
            expected = torch.sigmoid(
                model.score(z[list(range(30))], z[[(5 * i + 1) % len(ids) for i in range(30)]])
            )
        got = torch.tensor([p["score"] for p in scored.json()["predictions"]])
        assert float((got - expected).abs().max()) <= 1e-5
        src = len(ids) - 1  # the most recent live node: possibly one an update added
        skip = {a for a, b in edges if b == src} | {b for a, b in edges if a == src} | {src}
        with torch.no_grad():
            logits = model.score_against(z[src], z)
        ranked = [i for i in torch.argsort(logits, descending=True).tolist() if i not in skip]
        top = requests.post(url, json={"src": ids[src], "top_k": 5}, headers=headers, timeout=60)
        assert top.status_code == 200, top.text
        assert [r["dst"] for r in top.json()["recommendations"]] == [ids[i] for i in ranked[:5]]
