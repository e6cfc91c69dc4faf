"""Precomputed archives of a graph of several node types (handler.graph.precomputed): a seeded
random stream of typed updates (nodes and edges of several relations added and removed,
features and edge features set) taken by two workers on one log (a file, or a Redis stream),
then every live user's stored answer equals the model's forward on the whole updated graph, on
both workers and on a worker started after the updates, for every recipe and a user's
HeteroConv model; embeddings too; an update marks the user rows it reaches over every
relation, and only those."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from graph_assets import GraphStore
from graph_assets.live.redis_log import RedisLogConfig
from handler.live.live_graph import LiveGraph, UpdateRequest
from handler.tasks.node.engine import NodeClassificationEngine
from handler.tasks.node.extras import NodeExtrasEngine
from tests.precomputed_engines import node_worker
from tests.precomputed_engines import served as served_nodes
from tests.typed_graphs import fraud_store, hetero_conv_model, node_recipe
from tests.typed_live_reference import materialized_typed, random_typed_update

UPDATES = 60


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> GraphStore:
    return fraud_store(tmp_path_factory.mktemp("typed_precomputed") / "store", 80, 15, 30, 250, 6)


def model_of(store: GraphStore, name: str) -> torch.nn.Module:
    return hetero_conv_model(store) if name == "own" else node_recipe(store, name, hidden=8)


def worker(
    store: GraphStore, model: torch.nn.Module, rows: Path, log: Path | RedisLogConfig
) -> tuple[NodeClassificationEngine, LiveGraph]:
    """A worker of the typed archive whose rows live in ``rows``, following ``log``."""
    engine, live = node_worker(store, model, rows, log, fanouts=(2, 1))
    assert live is not None
    return engine, live


def served(engine: NodeClassificationEngine, ids: list, steps: int) -> torch.Tensor:
    """The users' probabilities, 20 a request, at the graph version after ``steps`` updates."""
    return served_nodes(engine, ids, "user", steps, batch=20)


@pytest.mark.parametrize("name", ["sage", "gat", "gcn", "gin", "rgcn", "hgt", "own"])
def test_exact_after_typed_updates_on_two_workers(store, tmp_path, name):
    model = model_of(store, name)
    log = tmp_path / "updates.log"
    first, live = worker(store, model, tmp_path / "rows", log)
    second, second_live = worker(store, model, tmp_path / "rows", log)
    rng, counter = random.Random(17), [0]
    for step in range(UPDATES):
        taker = live if step % 2 else second_live
        taker.update(UpdateRequest(random_typed_update(rng, taker, counter)))
        if step % 20 == 19:  # reads between updates refresh the rows they need, not all
            live.sync()
            ids, _ = materialized_typed(live)
            served(first, rng.sample(ids, 10), step + 1)
    live.sync()
    ids, inputs = materialized_typed(live)
    with torch.no_grad():
        expected = torch.softmax(model(inputs), dim=-1)
    late, _ = worker(store, model, tmp_path / "rows", log)  # replays the whole log at start
    for engine in (first, second, late):
        assert float((served(engine, ids, UPDATES) - expected).abs().max()) <= 1e-5
    rows = first.ego.precomputed
    assert rows is not None and rows.stats.rows > 0 and rows.stats.reads_refreshed > 0
    if name == "own":  # the embedding of the submodule it names, from the updated graph
        with torch.no_grad():
            _, embedding = model.forward_with_embedding(inputs)
        picked = ids[::8]
        (answer,) = NodeExtrasEngine(first.ego, "1.0").handle(
            [{"body": {"node_ids": picked, "return_embedding": True}}]
        )
        assert answer.status == 200, answer.body
        got = torch.tensor([p["embedding"] for p in answer.body["predictions"]])
        want = embedding[[ids.index(i) for i in picked]]
        assert float((got - want).abs().max()) <= 1e-5


def test_exact_after_typed_updates_on_a_redis_stream(store, tmp_path, redis_server):
    model = model_of(store, "gcn")
    config = RedisLogConfig(redis_server.url, timeout_s=0.5)
    first, live = worker(store, model, tmp_path / "rows", config)
    second, second_live = worker(store, model, tmp_path / "rows", config)
    rng, counter = random.Random(19), [0]
    for step in range(UPDATES):
        taker = live if step % 2 else second_live
        taker.update(UpdateRequest(random_typed_update(rng, taker, counter)))
    live.sync()
    ids, inputs = materialized_typed(live)
    with torch.no_grad():
        expected = torch.softmax(model(inputs), dim=-1)
    for engine in (first, second):
        assert float((served(engine, ids, UPDATES) - expected).abs().max()) <= 1e-5


def test_an_update_marks_the_user_rows_it_reaches_over_every_relation(store, tmp_path):
    """A merchant's features reach, within two hops downstream, the users that pay it (over
    merchant__rev_pays__user) and then merchants and devices only: exactly those users' rows
    are marked, and the next read recomputes them."""
    model = model_of(store, "sage")
    engine, live = worker(store, model, tmp_path / "rows", tmp_path / "updates.log")
    merchant = store.schema.node_type("merchant")
    node = merchant.offset + int(
        np.argmax(np.asarray(store.in_degree[merchant.offset : merchant.stop]))
    )
    payers = np.unique(live.overlay._out_neighbours(node))
    assert len(payers) > 1 and (store.types_of(payers) == 0).all()
    [merchant_id] = store.external_ids(np.array([node]))
    x = [0.5] * merchant.feature_dim
    live.update(
        UpdateRequest(
            [{"type": "set_features", "id": merchant_id, "node_type": "merchant", "x": x}]
        )
    )
    rows = engine.ego.precomputed
    assert rows is not None
    assert rows.pending[0] == set(payers.tolist())
    ids, inputs = materialized_typed(live)
    with torch.no_grad():
        expected = torch.softmax(model(inputs), dim=-1)
    assert float((served(engine, ids, 1) - expected).abs().max()) <= 1e-5
    assert rows.pending_rows == 0 and rows.stats.rows == len(payers)
