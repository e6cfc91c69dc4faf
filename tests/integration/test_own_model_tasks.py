"""A user's own link and graph models through build_mar.sh and TorchServe: a GAE-style link model
that reads edge features answers pair scores and top-k equal to decode(encode(whole graph)),
and explains pairs; built with --precompute, it stays exact through live updates on two
workers; a graph model answers inline graphs batched together as it answers each alone, equal
to the module's own forward, with its embedding."""

from __future__ import annotations

import functools
import json
import random
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import requests
import torch

from graph_assets import open_store
from graph_assets.input.graph_dataset import generate_graph_dataset
from handler.live.live_graph import LiveGraph, UpdateRequest
from tests.edge_graph import EDGE_DIM, FEATURES, write_edge_feature_csv
from tests.live_reference import materialized_graph, random_update
from tests.servers.torchserve import Register, TorchServe, largest_batches
from tests.unit.archive_build import user_models

from .archives import ROOT, SHARED_UPDATE_SECRET, concurrently

pytestmark = pytest.mark.integration
LINK_ARGS = {"in_channels": FEATURES, "hidden": 16, "edge_dim": EDGE_DIM}
GRAPH_ARGS = {"in_channels": 8, "hidden": 16, "classes": 4}
SECRET = SHARED_UPDATE_SECRET  # the shared server's workers hold it


def build(*options: str) -> None:
    result = subprocess.run(
        [str(ROOT / "build_mar.sh"), *options],
        capture_output=True,
        text=True,
        env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "verified " in result.stdout, result.stdout


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """pairs.mar (EdgeGatLink: 3 hops, edge features, full fanouts), live_pairs.mar (the same
    with --precompute, sampled fanouts, live updates and two workers) and shapes.mar (GinGraph
    on synthetic graphs, batches of 8), all from the user's model file."""
    root = tmp_path_factory.mktemp("own_tasks")
    torch.manual_seed(0)
    torch.save(user_models.EdgeGatLink(**LINK_ARGS).state_dict(), root / "pairs.pt")
    torch.save(user_models.GinGraph(**GRAPH_ARGS).state_dict(), root / "shapes.pt")
    common = ("--model-file", user_models.__file__, "--export-path", str(root / "store"))
    link = (
        "--task", "link", "--graph", str(write_edge_feature_csv(root / "graph")),
        "--model-class", "EdgeGatLink", "--model-args", json.dumps(LINK_ARGS),
        "--weights", str(root / "pairs.pt"), *common,
    )  # fmt: skip
    concurrently(
        functools.partial(build, *link, "--name", "pairs", "--fanouts", "-1,-1,-1"),
        functools.partial(
            build, *link, "--name", "live_pairs", "--fanouts", "2,2,2", "--precompute",
            "--enable-updates", "--update-state-dir", str(root / "state"),
            "--min-workers", "2", "--max-workers", "2",
        ),
        functools.partial(
            build, "--task", "graph", "--synthetic-graphs", "80", "--name", "shapes",
            "--model-class", "GinGraph", "--model-args", json.dumps(GRAPH_ARGS),
            "--weights", str(root / "shapes.pt"), "--batch-size", "8", "--max-batch-delay", "200",
            "--metrics-interval", "0", *common,
        ),
    )  # fmt: skip
    return root


@pytest.fixture(scope="module")
def server(register: Register, built: Path) -> Iterator[TorchServe]:
    with register(built / "store", ["pairs", "live_pairs", "shapes"]) as started:
        yield started


def unpacked(built: Path, name: str) -> tuple[Path, torch.nn.Module]:
    """The archive's files and the user's module with the archive's weights, in eval mode."""
    work = built / f"unpacked_{name}"
    if not work.exists():
        zipfile.ZipFile(built / "store" / f"{name}.mar").extractall(work)
    config = json.loads((work / "model_config.json").read_text())
    module = getattr(user_models, config["model_class"])(**config["model_args"])
    module.load_state_dict(torch.load(work / "model.pt", weights_only=True))
    return work, module.eval()


def post(server: TorchServe, path: str, body: object) -> requests.Response:
    return requests.post(
        f"{server.inference_url}/{path}", json=body, headers=server.auth("inference"), timeout=60
    )


@pytest.fixture(scope="module")
def whole_graph(built: Path) -> tuple[list[str], torch.Tensor, torch.nn.Module]:
    """The link archive's node IDs, encode on its whole graph, and the module."""
    work, module = unpacked(built, "pairs")
    store = open_store(work / "graph")
    with torch.no_grad():
        z = module.encode(
            torch.from_numpy(np.array(store.features)),
            torch.from_numpy(store.edge_index()),
            torch.from_numpy(np.array(store.edge_features)),
        )
    return store.external_ids(np.arange(store.num_nodes)), z, module


def test_pair_scores_equal_decode_of_the_whole_graphs_encode(server, whole_graph):
    ids, z, module = whole_graph
    rng = np.random.default_rng(4)
    pairs = rng.integers(0, len(ids), size=(40, 2))
    pairs[0] = (0, 1)  # node 0 is the graph's hub
    response = post(server, "predictions/pairs", {"pairs": [[ids[a], ids[b]] for a, b in pairs]})
    assert response.status_code == 200, response.text
    got = torch.tensor([p["score"] for p in response.json()["predictions"]])
    with torch.no_grad():
        expected = torch.sigmoid(module.decode(z, torch.from_numpy(pairs.T.copy())))
    assert float((got - expected).abs().max()) <= 1e-5


def test_top_k_equals_the_best_decode_scores_over_every_node(server, whole_graph):
    ids, z, module = whole_graph
    response = post(
        server, "predictions/pairs", {"src": ids[7], "top_k": 5, "exclude_neighbors": False}
    )
    assert response.status_code == 200, response.text
    found = response.json()["recommendations"]
    every = torch.stack([torch.full((len(ids),), 7), torch.arange(len(ids))])
    with torch.no_grad():
        scores = torch.sigmoid(module.decode(z, every))
    scores[7] = -1  # a node is never recommended to itself
    best = torch.topk(scores, 5)
    assert [r["dst"] for r in found] == [ids[i] for i in best.indices.tolist()]
    got = torch.tensor([r["score"] for r in found])
    assert float((got - best.values).abs().max()) <= 1e-5


def test_a_precomputed_link_model_is_exact_after_live_updates(server, built, tmp_path):
    """Updates with edge features through the server and into a reference graph; then pair
    scores and top-k equal decode(encode(updated graph)), on either worker."""
    work, module = unpacked(built, "live_pairs")
    live = LiveGraph(open_store(work / "graph"), tmp_path / "reference.log")
    headers = {**server.auth("inference"), "X-Gnnserve-Update-Key": SECRET}
    rng, counter = random.Random(11), [0]
    try:
        for _ in range(30):
            operations = random_update(rng, live, counter)
            answer = requests.post(
                f"{server.inference_url}/predictions/live_pairs",
                json={"op": "update", "operations": operations},
                headers=headers,
                timeout=60,
            )
            assert answer.status_code == 200, answer.text
            live.update(UpdateRequest(operations))
        ids, x, edge_index, edge_attr = materialized_graph(live)
    finally:
        live.close()
    with torch.no_grad():
        z = module.encode(x, edge_index, edge_attr)
        pairs = torch.tensor([[i, (5 * i + 2) % len(ids)] for i in range(30)]).T
        expected = torch.sigmoid(module.decode(z, pairs))
        every = torch.stack([torch.full((len(ids),), 3), torch.arange(len(ids))])
        scores = torch.sigmoid(module.decode(z, every))
    scores[3] = -1  # never recommended to itself
    best = torch.topk(scores, 5)
    body = {"pairs": [[ids[a], ids[b]] for a, b in pairs.T.tolist()]}
    for _ in range(4):  # batches land on either worker
        response = post(server, "predictions/live_pairs", body)
        assert response.status_code == 200, response.text
        assert response.json()["graph_version"].endswith("+30")
        got = torch.tensor([p["score"] for p in response.json()["predictions"]])
        assert float((got - expected).abs().max()) <= 1e-5
        top = post(
            server,
            "predictions/live_pairs",
            {"src": ids[3], "top_k": 5, "exclude_neighbors": False},
        ).json()["recommendations"]
        assert [r["dst"] for r in top] == [ids[i] for i in best.indices.tolist()]


def test_pairs_are_explained_and_describe_shows_the_decoder_and_its_verification(server):
    explained = post(server, "explanations/pairs", {"src": "acct_0", "dst": "acct_3"})
    assert explained.status_code == 200, explained.text
    assert explained.json()["explanation"]["edges"]
    described = requests.get(
        f"{server.management_url}/models/pairs?customized=true",
        headers=server.auth("management"),
        timeout=30,
    ).json()[0]["customizedMetadata"]
    details = described if isinstance(described, dict) else json.loads(described)
    assert details["link"]["decoder"] == "EdgeGatLink.decode"
    assert details["model"]["model_class"] == "EdgeGatLink"
    verification = details["verification"]
    assert verification["task"] == "link" and verification["passed"]
    assert verification["pairs"] == 288 and verification["worst_abs_diff"] <= 1e-5


def test_batched_inline_graphs_equal_each_alone_and_the_modules_forward(server, built):
    _, module = unpacked(built, "shapes")
    log = server.home / "logs" / "model_log.log"
    seen = len(log.read_text())  # the shared server's log holds other modules' batches too
    dataset = generate_graph_dataset(16, seed=5)
    graphs = [dataset.graph(g) for g in range(dataset.num_graphs)]
    bodies = [
        {"graph": {"x": x.tolist(), "edge_index": e.tolist()}, "return_embedding": True}
        for x, e in graphs
    ]
    with ThreadPoolExecutor(max_workers=16) as pool:
        batched = list(pool.map(lambda body: post(server, "predictions/shapes", body), bodies))
    for (x, edge_index), response in zip(graphs, batched, strict=True):
        assert response.status_code == 200, response.text
        answer = response.json()
        x_t = torch.from_numpy(np.array(x))
        e_t = torch.from_numpy(edge_index.astype(np.int64))  # served as sent
        one = torch.zeros(len(x), dtype=torch.long)
        with torch.no_grad():
            probabilities = torch.softmax(module(x_t, e_t, one), dim=-1)[0]
            embedding = module.head1(module.embed(x_t, e_t, one)).relu()[0]
        assert torch.allclose(torch.tensor(answer["probabilities"]), probabilities, atol=1e-5)
        assert torch.allclose(torch.tensor(answer["embedding"]), embedding, atol=1e-5, rtol=1e-5)
        assert answer["predicted_label"] in ("cycle", "star", "wheel", "ladder")
    alone = post(server, "predictions/shapes", bodies[3]).json()
    assert np.allclose(alone["probabilities"], batched[3].json()["probabilities"], atol=1e-6)
    # TorchServe did batch them (one batch log line per batch: --metrics-interval 0).
    deadline = time.monotonic() + 10
    while max(largest_batches(log.read_text()[seen:]), default=0) <= 1:
        assert time.monotonic() < deadline, "no batch of more than one graph was logged"
        time.sleep(0.1)
