"""Live updates of a graph of several node types: typed operations (node_type, edge_type)
taken by two workers on one log (a file, or a Redis stream), then every live user's answer
equals the recipe's full-graph forward on the updated graph, on both workers; bad types are
refused naming the graph's."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from graph_assets import GraphStore
from graph_assets.live.redis_log import RedisLogConfig
from handler.live.live_graph import LiveGraph, UpdateRequest
from handler.settings import ServingSettings
from handler.tasks.node.engine import NodeClassificationEngine
from tests.typed_graphs import fraud_store, node_recipe
from tests.typed_live_reference import materialized_typed, random_typed_update

from .conftest import refused_update

UPDATES = 60


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> GraphStore:
    return fraud_store(tmp_path_factory.mktemp("typed_live") / "store", 80, 15, 30, 250, 6)


def recipe(store: GraphStore, arch: str) -> torch.nn.Module:
    return node_recipe(store, arch, hidden=8)


def workers(
    store: GraphStore, model: torch.nn.Module, lives: list[LiveGraph], fanouts: list[int]
) -> list[NodeClassificationEngine]:
    settings = ServingSettings.from_yaml_section({"fanouts": fanouts})
    return [
        NodeClassificationEngine.create(store, model, settings, torch.device("cpu"), "1.0", live)
        for live in lives
    ]


def check_exact(engines, lives, model, steps: int) -> None:
    lives[0].sync()
    ids, inputs = materialized_typed(lives[0])
    with torch.no_grad():
        expected = torch.softmax(model(inputs), dim=-1)
    for engine in engines:
        served = []
        for start in range(0, len(ids), 20):
            (answer,) = engine.handle([{"body": {"node_ids": ids[start : start + 20]}}])
            assert answer.status == 200, answer.body
            assert answer.body["graph_version"].endswith(f"+{steps}")
            served += [p["probabilities"] for p in answer.body["predictions"]]
        assert float((torch.tensor(served) - expected).abs().max()) <= 1e-5


def take_updates(lives: list[LiveGraph], seed: int) -> int:
    rng, counter, steps = random.Random(seed), [0], 0
    for step in range(UPDATES):
        taker = lives[step % 2]
        taker.update(UpdateRequest(random_typed_update(rng, taker, counter)))
        steps += 1
    return steps


@pytest.mark.parametrize("arch", ["sage", "gat", "gcn", "rgcn"])
def test_exact_after_typed_updates_on_two_workers(store, tmp_path, arch):
    model = recipe(store, arch)
    lives = [LiveGraph(store, tmp_path / "updates.log") for _ in range(2)]
    engines = workers(store, model, lives, [-1, -1])
    steps = take_updates(lives, seed=11)
    check_exact(engines, lives, model, steps)
    late = LiveGraph(store, tmp_path / "updates.log")  # replays the whole log at start
    check_exact(workers(store, model, [late], [-1, -1]), [late], model, steps)


def test_exact_after_typed_updates_on_a_redis_stream(store, redis_server):
    model = recipe(store, "sage")
    config = RedisLogConfig(redis_server.url, timeout_s=0.5)
    lives = [LiveGraph(store, None, redis_log=config) for _ in range(2)]
    engines = workers(store, model, lives, [-1, -1])
    steps = take_updates(lives, seed=12)
    check_exact(engines, lives, model, steps)


@pytest.mark.parametrize(
    ("operation", "status", "words"),
    [
        ({"type": "add_node", "id": "x", "x": [], "node_type": "device"}, 400, "no features"),
        ({"type": "add_node", "id": 9, "x": [0.0] * 4, "node_type": "shop"}, 400, "merchant"),
        ({"type": "add_edge", "src": "u1", "dst": 1001}, 400, "several relations"),
        (
            {"type": "add_edge", "src": "u1", "dst": 999, "edge_type": "user__uses__device"},
            404,
            "device 999 (dst) is not in the graph",
        ),
        (
            {"type": "add_node", "id": 7, "x": [0.0] * 4, "label": 1, "node_type": "merchant"},
            400,
            "only user nodes have labels",
        ),
    ],
)
def test_bad_typed_operations_are_refused(store, tmp_path, operation, status, words):
    live = LiveGraph(store, tmp_path / "updates.log")
    refused = refused_update(live, [operation])
    assert refused.status == status and words in refused.message, refused


def test_a_new_merchant_is_served_through_its_relations(store, tmp_path):
    """A merchant added by an update, paid by a user: that user's answer reads it."""
    model = recipe(store, "sage")
    live = LiveGraph(store, tmp_path / "updates.log")
    [engine] = workers(store, model, [live], [-1, -1])
    live.update(
        UpdateRequest(
            [
                {"type": "add_node", "id": 777, "x": [3.0, 0, 0, 1], "node_type": "merchant"},
                {
                    "type": "add_edge", "src": 777, "dst": "u2",
                    "edge_type": "merchant__rev_pays__user", "attr": [250.0, 3.0],
                },
            ]
        )
    )  # fmt: skip
    ids, inputs = materialized_typed(live)
    with torch.no_grad():
        expected = torch.softmax(model(inputs), dim=-1)[ids.index("u2")]
    (answer,) = engine.handle([{"body": {"node_id": "u2", "node_type": "user"}}])
    assert answer.status == 200, answer.body
    assert float((torch.tensor(answer.body["probabilities"]) - expected).abs().max()) <= 1e-5
    assert Path(tmp_path / "updates.log").stat().st_size > 0


def test_sampled_answers_after_updates_agree_on_every_worker(store, tmp_path):
    """Changed in-lists are sampled per relation too, with the same draws on every worker."""
    model = recipe(store, "sage")
    lives = [LiveGraph(store, tmp_path / "updates.log") for _ in range(2)]
    engines = workers(store, model, lives, [2, 1])
    take_updates(lives, seed=13)
    for live in lives:
        live.sync()
    ids, _ = materialized_typed(lives[0])
    bodies = [{"body": {"node_ids": ids[start : start + 20]}} for start in range(0, len(ids), 20)]
    first, second = ([r.body for r in engine.handle(bodies)] for engine in engines)
    assert first == second


def test_removing_a_node_removes_its_edges_of_every_relation(store, tmp_path):
    """A device's edges into users (device__rev_uses__user) go with it, wherever they sit in
    the users' in-lists (grouped by relation, not ascending over all of them)."""
    model = recipe(store, "sage")
    live = LiveGraph(store, tmp_path / "updates.log")
    [engine] = workers(store, model, [live], [-1, -1])
    device = int(store.schema.node_type("device").offset)
    [device_id] = store.external_ids(np.array([device]))
    users = live.overlay._out_neighbours(device)
    assert len(users), "the test needs a device that some user uses"
    live.update(UpdateRequest([{"type": "remove_node", "id": device_id, "node_type": "device"}]))
    assert all(device not in live.overlay.in_list(int(user)).tolist() for user in users)
    check_exact([engine], [live], model, 1)
