"""Live updates carry edge features: a user's model that reads them (PyG's GAT with
``edge_dim``), packaged by archive_build.own_model, answers exactly on the updated graph kept
as given (self-loops, parallel edges, ``set_edge_features``), from the file log and from Redis,
after a restart and after compaction; cold start takes the new node's ``edge_attr``."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from torch_geometric.nn.models import GAT

from archive_build import own_model
from graph_assets import GraphStore, open_store
from graph_assets.compact import compact, replay
from graph_assets.live.redis_log import RedisLogConfig
from handler.live.live_graph import LiveGraph, UpdateRequest
from handler.tasks.node.task import node_router
from model.export import load_model
from tests.edge_graph import CLASSES, EDGE_DIM, FEATURES, edge_feature_store
from tests.live_reference import live_ids, materialized_forward, materialized_graph, random_update

from .conftest import live_engine, make_engine, refused_update

ARGS = {
    "in_channels": FEATURES,
    "hidden_channels": 16,
    "num_layers": 2,
    "out_channels": CLASSES,
    "edge_dim": EDGE_DIM,
}


@pytest.fixture(scope="module")
def graph(tmp_path_factory: pytest.TempPathFactory) -> tuple[GraphStore, Path]:
    """The edge-feature graph and a GAT with ``edge_dim`` packaged for it."""
    root = tmp_path_factory.mktemp("live_edge_features")
    store = edge_feature_store(root)
    torch.manual_seed(0)
    torch.save(GAT(**ARGS).state_dict(), root / "weights.pt")
    argv = [
        "--store", str(store.path), "--model-class", "torch_geometric.nn.models.GAT",
        "--model-args", json.dumps(ARGS), "--weights", str(root / "weights.pt"),
        "--out", str(root / "model"),
    ]  # fmt: skip
    assert own_model.main(argv) == 0
    return store, root / "model"


def gat(model_dir: Path) -> torch.nn.Module:
    model, _ = load_model(model_dir)
    assert model.serving_needs.edge_input.value == "edge_attr"
    return model


def apply_random_updates(live: LiveGraph, count: int, seed: int) -> Counter:
    """``count`` random updates through ``live``; how many of each kind, self-loops and
    parallel edges counted apart."""
    rng, counter, kinds = random.Random(seed), [0], Counter()
    for _ in range(count):
        (operation,) = random_update(rng, live, counter)
        kinds[_kind(live, operation)] += 1
        live.update(UpdateRequest([operation]))
    return kinds


def _kind(live: LiveGraph, operation: dict) -> str:
    if operation["type"] != "add_edge":
        return operation["type"]
    if operation["src"] == operation["dst"]:
        return "self-loop"
    src, dst = live.overlay.lookup([operation["src"], operation["dst"]]).tolist()
    return "parallel edge" if src in live.overlay.in_list(dst).tolist() else "add_edge"


def served(engine, ids: list) -> torch.Tensor:
    answers = engine.handle(
        [{"body": {"node_ids": ids[i : i + 32]}} for i in range(0, len(ids), 32)]
    )
    assert all(a.status == 200 for a in answers), [a.body for a in answers if a.status != 200]
    return torch.tensor([p["probabilities"] for a in answers for p in a.body["predictions"]])


def test_answers_equal_the_full_graph_forward_after_random_updates(graph, tmp_path):
    store, model_dir = graph
    model = gat(model_dir)
    engine, live = live_engine(store, tmp_path / "updates.log", model)
    kinds = apply_random_updates(live, 150, seed=5)
    for kind in ("self-loop", "parallel edge", "set_edge_features", "remove_edge", "remove_node"):
        assert kinds[kind] > 0, kinds
    assert live.overlay.added_edges > 0 and live.overlay.changed_edge_rows
    ids, expected = materialized_forward(live, model)
    assert float((served(engine, ids) - expected).abs().max()) <= 1e-5
    # A restart replays the log, attr and set_edge_features included, to the same answers.
    restarted, restarted_live = live_engine(store, tmp_path / "updates.log", model)
    assert restarted_live.version == live.version
    assert torch.equal(served(restarted, ids), served(engine, ids))
    # Compaction keeps every edge's features: a store built from it answers alike.
    compact(replay(store.path, tmp_path / "updates.log"), tmp_path / "compacted")
    compacted = open_store(tmp_path / "compacted")
    assert compacted.num_edges == sum(len(live.overlay.in_list(n)) for n in live_node_indices(live))
    fresh = make_engine(compacted, model=model, fanouts=[-1, -1])
    assert float((served(fresh, ids) - expected).abs().max()) <= 1e-5


def live_node_indices(live: LiveGraph) -> list[int]:
    return live.overlay.lookup(live_ids(live)).tolist()


def test_sampled_answers_read_the_features_of_the_edges_they_sample(graph, tmp_path):
    """With fanouts below the degrees the sampler's edge IDs pick each sampled edge's row:
    a set_edge_features on a hub's in-edges changes its sampled answer, deterministically."""
    store, model_dir = graph
    model = gat(model_dir)
    engine, live = live_engine(store, tmp_path / "updates.log", model, fanouts=(3, 3))
    hub = int(live.overlay.lookup(["acct_0"])[0])
    sources = live.overlay.external_ids(live.overlay.in_list(hub))
    before = engine.handle([{"body": {"node_id": "acct_0"}}])[0].body["probabilities"]
    operations = [
        {"type": "set_edge_features", "src": source, "dst": "acct_0", "attr": [500.0, -900.0]}
        for source in sorted(set(sources))
    ]
    live.update(UpdateRequest(operations))
    after = engine.handle([{"body": {"node_id": "acct_0"}}])[0].body["probabilities"]
    assert after != before
    other, _ = live_engine(store, tmp_path / "updates.log", model, fanouts=(3, 3))
    assert other.handle([{"body": {"node_id": "acct_0"}}])[0].body["probabilities"] == after


def test_replicas_on_redis_replay_edge_features(graph, redis_server, tmp_path):
    store, model_dir = graph
    model = gat(model_dir)
    config = RedisLogConfig(redis_server.url, timeout_s=0.5)
    lives = [LiveGraph(store, None, redis_log=config) for _ in range(2)]
    rng, counter = random.Random(9), [0]
    for _ in range(80):
        writer = rng.choice(lives)
        writer.sync()
        writer.update(UpdateRequest(random_update(rng, writer, counter)))
    late = LiveGraph(store, None, redis_log=config)  # replays the whole stream at start
    for live in lives:
        live.sync()
    assert {live.version for live in [*lives, late]} == {late.version}
    ids, expected = materialized_forward(late, model)
    for live in [*lives, late]:
        engine = make_engine(store, model=model, live=live, fanouts=[-1, -1])
        assert float((served(engine, ids) - expected).abs().max()) <= 1e-5
    compact(replay(store.path, config), tmp_path / "compacted")
    fresh = make_engine(open_store(tmp_path / "compacted"), model=model, fanouts=[-1, -1])
    assert float((served(fresh, ids) - expected).abs().max()) <= 1e-5


def with_new_node(live: LiveGraph, x_new, neighbours: list, rows, direction: str):
    """The updated graph plus node v (last row) with edges to and from ``neighbours``, each
    pair's edges carrying its row: what cold start must equal."""
    ids, x, edge_index, edge_attr = materialized_graph(live)
    v = len(ids)
    position = {node_id: i for i, node_id in enumerate(ids)}
    column = torch.tensor([position[n] for n in neighbours], dtype=torch.long)
    given = torch.tensor(rows, dtype=torch.float32).reshape(-1, EDGE_DIM)
    parts, attrs = [edge_index], [edge_attr]
    if direction in ("in", "both"):
        parts.append(torch.stack([column, torch.full_like(column, v)]))
        attrs.append(given)
    if direction in ("out", "both"):
        parts.append(torch.stack([torch.full_like(column, v), column]))
        attrs.append(given)
    x = torch.cat([x, torch.tensor([x_new], dtype=torch.float32)])
    return x, torch.cat(parts, dim=1), torch.cat(attrs)


@pytest.mark.parametrize("direction", ["in", "out", "both"])
def test_cold_start_with_edge_attr_equals_the_forward_with_the_node_added(
    graph, tmp_path, direction
):
    store, model_dir = graph
    model = gat(model_dir)
    engine, live = live_engine(store, tmp_path / "updates.log", model)
    apply_random_updates(live, 40, seed=2)
    ids = live_ids(live)
    rng = np.random.default_rng(4)
    neighbours = [ids[0], ids[3], ids[len(ids) // 2], ids[-1]]  # the hub, a new node maybe
    rows = rng.normal(size=(len(neighbours), EDGE_DIM)).round(3).tolist()
    x_new = rng.normal(size=FEATURES).tolist()
    body = {
        "new_node": {
            "x": x_new,
            "neighbors": neighbours,
            "direction": direction,
            "edge_attr": rows,
        },
        "return_embedding": True,
    }
    (answer,) = node_router(engine, "1.0").handle([{"body": body}])
    assert answer.status == 200, answer.body
    x, edge_index, edge_attr = with_new_node(live, x_new, neighbours, rows, direction)
    with torch.no_grad():
        logits, hidden = model.forward_with_embedding(x, edge_index, None, edge_attr)
    expected = torch.softmax(logits[-1], -1)
    assert float((torch.tensor(answer.body["probabilities"]) - expected).abs().max()) <= 1e-5
    assert float((torch.tensor(answer.body["embedding"]) - hidden[-1]).abs().max()) <= 1e-5
    assert answer.body["graph_version"] == live.version


@pytest.mark.parametrize(
    ("operation", "status", "words"),
    [
        ({"type": "add_edge", "src": "acct_1", "dst": "acct_2"}, 400, "needs attr"),
        (
            {"type": "add_edge", "src": "acct_1", "dst": "acct_2", "attr": [1.0]},
            400,
            "attr must be a list of 2 numbers, got 1",
        ),
        (
            {"type": "set_edge_features", "src": "acct_1", "dst": "acct_2", "attr": [1, 2, 3]},
            400,
            "attr must be a list of 2 numbers, got 3",
        ),
        (
            {"type": "add_edge", "src": "acct_1", "dst": "acct_1", "attr": [1, float("nan")]},
            400,
            "attr holds NaN",
        ),
        (
            {"type": "set_edge_features", "src": "acct_89", "dst": "acct_88", "attr": [1, 2]},
            404,
            "does not exist",
        ),
        ({"type": "set_edge_features", "src": "acct_1", "dst": "acct_2"}, 400, "needs attr"),
    ],
)
def test_bad_edge_features_in_updates_are_refused(graph, tmp_path, operation, status, words):
    store, model_dir = graph
    _, live = live_engine(store, tmp_path / "updates.log", gat(model_dir))
    refused = refused_update(live, [operation])
    assert refused.status == status and words in refused.message, refused
    assert live.overlay.seq == 0 and (tmp_path / "updates.log").stat().st_size == 0


@pytest.mark.parametrize(
    ("new_node", "words"),
    [
        ({"neighbors": ["acct_1", "acct_2"]}, "reads edge features: send new_node.edge_attr"),
        (
            {"neighbors": ["acct_1", "acct_2"], "edge_attr": [[1.0, 2.0]]},
            "one row per entry of new_node.neighbors (2); got 1",
        ),
        (
            {"neighbors": ["acct_1", "acct_2"], "edge_attr": [[1.0, 2.0], [1.0]]},
            "new_node.edge_attr[1] must hold 2 features per edge",
        ),
        (
            {"neighbors": ["acct_1", "acct_1"], "edge_attr": [[1.0, 2.0], [3.0, 4.0]]},
            "lists 'acct_1' more than once",
        ),
        (
            {"neighbors": ["acct_1"], "edge_attr": [[1.0, float("inf")]]},
            "new_node.edge_attr holds a NaN, an infinity",
        ),
    ],
)
def test_bad_cold_start_edge_attr_is_400(graph, new_node, words):
    store, model_dir = graph
    router = node_router(make_engine(store, model=gat(model_dir)), "1.0")
    body = {"new_node": {"x": [0.0] * FEATURES, **new_node}}
    good, bad = router.handle([{"body": {"node_id": "acct_1"}}, {"body": body}])
    assert good.status == 200
    assert bad.status == 400 and words in bad.body["message"], bad.body


def test_a_graph_without_edge_features_refuses_them(int_store, tmp_path):
    engine, live = live_engine(int_store, tmp_path / "updates.log", None)
    for operation, words in (
        ({"type": "add_edge", "src": 3, "dst": 6, "attr": [1.0]}, "no edge features"),
        ({"type": "set_edge_features", "src": 3, "dst": 6, "attr": [1.0]}, "no edge features"),
    ):
        refused = refused_update(live, [operation])
        assert refused.status == 400 and words in refused.message
    body = {"new_node": {"x": [0.0] * 6, "neighbors": [3], "edge_attr": [[1.0]]}}
    (answer,) = node_router(engine, "1.0").handle([{"body": body}])
    assert answer.status == 400 and "no edge features" in answer.body["message"]
