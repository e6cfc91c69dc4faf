"""Embeddings and cold-start nodes: equal to the full-graph forward (on the augmented graph)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from handler.sampling.sampler import boundary_node
from handler.tasks.node.cold_start import ColdStartView, NewEdges, sample_with_new_node
from handler.tasks.node.extras import NodeExtrasEngine
from handler.tasks.node.task import node_router

from .conftest import make_engine, random_model

ARCHS = ["gcn", "sage", "gat", "gin"]


def full_graph(store):
    x = torch.from_numpy(np.array(store.features))
    return x, torch.from_numpy(store.edge_index())


def extras(store, arch, **settings) -> NodeExtrasEngine:
    engine = make_engine(store, arch, model=random_model(store, arch), **settings)
    return NodeExtrasEngine(engine.ego, "1.0")


def bodies(engine, payloads):
    responses = engine.handle([{"body": payload} for payload in payloads])
    return [(r.status, r.body) for r in responses]


@pytest.mark.parametrize("arch", ARCHS)
def test_embedding_requests_equal_the_full_graph_forward(int_store, arch):
    engine = extras(int_store, arch)
    x, edge_index = full_graph(int_store)
    with torch.no_grad():
        logits, hidden = engine.ego.model.forward_with_embedding(x, edge_index)
    ids = int_store.external_ids(np.arange(int_store.num_nodes))
    [(status, body)] = bodies(engine, [{"node_ids": ids, "return_embedding": True}])
    assert status == 200
    served = torch.tensor([p["probabilities"] for p in body["predictions"]])
    embeddings = torch.tensor([p["embedding"] for p in body["predictions"]])
    assert float((served - torch.softmax(logits, -1)).abs().max()) <= 1e-5
    assert float((embeddings - hidden).abs().max()) <= 1e-5
    assert embeddings.shape == (int_store.num_nodes, 16)


def test_embedding_answers_match_plain_predictions_and_echo_ids(str_store):
    node = make_engine(str_store, "sage", fanouts=[3, 2])
    router = node_router(node, "1.0")
    plain, single, without = router.handle(
        [
            {"body": {"node_id": "acct_7"}},
            {"body": {"node_id": "acct_7", "return_embedding": True}},
            {"body": {"node_ids": ["acct_7", "acct_1"], "return_embedding": False}},
        ]
    )
    assert single.body["node_id"] == "acct_7" and len(single.body["embedding"]) == 16
    assert single.body["predicted_label"] == plain.body["predicted_label"]
    assert np.allclose(single.body["probabilities"], plain.body["probabilities"], atol=1e-6)
    assert "embedding" not in without.body["predictions"][0]
    assert without.body["model_version"] == "1.0"


def augmented(store, x_new, neighbours, direction):
    """The stored graph plus node v = N with the given edges: what cold start must equal."""
    x, edge_index = full_graph(store)
    v = store.num_nodes
    parts = [edge_index]
    column = torch.tensor(neighbours, dtype=torch.long)
    if direction in ("in", "both"):
        parts.append(torch.stack([column, torch.full_like(column, v)]))
    if direction in ("out", "both"):
        parts.append(torch.stack([torch.full_like(column, v), column]))
    return torch.cat([x, torch.tensor([x_new])]), torch.cat(parts, dim=1)


@pytest.mark.parametrize("direction", ["in", "out", "both"])
@pytest.mark.parametrize("arch", ARCHS)
def test_cold_start_equals_the_forward_on_the_graph_with_the_node_added(int_store, arch, direction):
    engine = extras(int_store, arch)
    rng = np.random.default_rng(3)
    x_new = rng.normal(size=int_store.feature_dim).tolist()
    # Node 0 is a hub (its degree changes matter for GCN); 77 has no edges at all.
    neighbours = [0, 5, 9, 77, 5]
    ids = int_store.external_ids(np.array(neighbours))
    [(status, body)] = bodies(
        engine,
        [
            {
                "new_node": {"x": x_new, "neighbors": ids, "direction": direction},
                "return_embedding": True,
            }
        ],
    )
    assert status == 200, body
    x, edge_index = augmented(int_store, x_new, sorted(set(neighbours)), direction)
    with torch.no_grad():
        logits, hidden = engine.ego.model.forward_with_embedding(x, edge_index)
    expected = torch.softmax(logits[-1], -1)
    assert float((torch.tensor(body["probabilities"]) - expected).abs().max()) <= 1e-5
    assert float((torch.tensor(body["embedding"]) - hidden[-1]).abs().max()) <= 1e-5
    assert body["new_node"] == {"neighbors": 4}


def test_a_new_node_without_neighbours_is_scored_from_its_features(int_store):
    engine = extras(int_store, "gcn")
    x_new = [0.5] * int_store.feature_dim
    [(status, body)] = bodies(engine, [{"new_node": {"x": x_new}}])
    x, edge_index = augmented(int_store, x_new, [], "both")
    with torch.no_grad():
        expected = torch.softmax(engine.ego.model(x, edge_index)[-1], -1)
    assert status == 200
    assert float((torch.tensor(body["probabilities"]) - expected).abs().max()) <= 1e-5


def test_cold_start_with_sampled_fanouts_is_deterministic_and_batch_independent(int_store):
    engine = extras(int_store, "sage", fanouts=[2, 2])
    request = {"new_node": {"x": [0.1] * int_store.feature_dim, "neighbors": [0, 3, 6, 9]}}
    alone = bodies(engine, [request])[0]
    batched = bodies(engine, [{"node_id": 3, "return_embedding": True}, request, request])
    assert alone == batched[1] == batched[2]


@pytest.mark.parametrize(
    ("payload", "status", "words"),
    [
        ({"new_node": {"x": [1.0, 2.0]}}, 400, "6 features"),
        ({"new_node": {"x": [1.0] * 6, "neighbors": [1]}}, 404, "not in the graph: 1"),
        ({"new_node": {"x": [1.0] * 6, "direction": "up"}}, 400, "direction"),
        ({"new_node": {"x": [1e39] + [0.0] * 5}}, 400, "float32"),
        ({"new_node": {"x": [1.0] * 6, "neighbors": [0] * 9}}, 413, "at most 8"),
        ({"new_node": {"x": [True] * 6}}, 400, "new_node.x"),
        ({"node_id": 3, "node_ids": [3], "return_embedding": True}, 400, "exactly one"),
        ({"node_ids": [], "return_embedding": True}, 400, "empty"),
        ({"node_id": 4, "return_embedding": "yes"}, 400, "return_embedding"),
    ],
)
def test_bad_requests_get_their_own_error(int_store, payload, status, words):
    engine = extras(int_store, "sage", max_ids_per_request=8)
    good, (code, body) = bodies(engine, [{"node_id": 3, "return_embedding": True}, payload])
    assert good[0] == 200
    assert code == status and words in body["message"], body


def test_embeddings_and_cold_start_see_the_live_updates(int_store, tmp_path):
    from handler.live.live_graph import LiveGraph, UpdateRequest

    live = LiveGraph(int_store, tmp_path / "updates.log")
    engine = make_engine(int_store, "gcn", model=random_model(int_store, "gcn"), live=live)
    router = node_router(engine, "1.0")
    x = [0.2] * int_store.feature_dim
    operations = [
        {"type": "add_node", "id": 5000, "x": x},
        {"type": "add_edge", "src": 0, "dst": 5000},
        {"type": "add_edge", "src": 5000, "dst": 3},
    ]
    live.update(UpdateRequest(operations=operations))
    plain, extra, cold = router.handle(
        [
            {"body": {"node_ids": [5000, 3]}},
            {"body": {"node_ids": [5000, 3], "return_embedding": True}},
            {"body": {"new_node": {"x": x, "neighbors": [5000, 3]}}},
        ]
    )
    assert plain.status == extra.status == cold.status == 200, (extra.body, cold.body)
    for before, after in zip(plain.body["predictions"], extra.body["predictions"], strict=True):
        assert np.allclose(before["probabilities"], after["probabilities"], atol=1e-6)
    # every prediction of a live graph says which version it was computed on
    version = live.version
    assert extra.body["graph_version"] == version == plain.body["graph_version"]
    assert all(p["graph_version"] == version for p in extra.body["predictions"])
    assert cold.body["graph_version"] == version
    (single,) = router.handle([{"body": {"node_id": 3, "return_embedding": True}}])
    assert single.body["graph_version"] == version


@pytest.mark.parametrize("direction", ["in", "out", "both"])
def test_a_boundary_hop_gives_the_deepest_rows_their_augmented_in_degrees(int_store, direction):
    """With a boundary, the last hop's edges come from one boundary row (a self-loop from its
    own row), and each deepest row has as many in-edges as its in-degree on the graph with the
    new node (the next index, N) added."""
    engine = extras(int_store, "sage", fanouts=[2])
    samplers = [engine.ego.sampler.with_fanouts([2]), engine.ego.sampler.with_fanouts([-1])]
    keep = {"in": [True], "out": [False], "both": [True, False]}[direction]
    neighbours = np.array([0, 3, 6, 9] * len(keep))
    inward = np.repeat(keep, 4)
    edges = NewEdges(neighbours, np.zeros_like(neighbours), inward, (np.empty(0),) * len(inward))
    view = ColdStartView(int_store, 0, np.zeros(int_store.feature_dim, np.float32), edges)
    sub = sample_with_new_node(samplers, view, 10_000, 10_000, boundary=True)
    # The last level: one boundary row, or none when the deepest hop has no in-edges.
    assert sub.node[sub.num_nodes - sub.level_sizes[-1] :].tolist() in ([boundary_node(0)], [])
    rows = sub.edge_index[1, sub.node[sub.edge_index[0]] == boundary_node(0)]
    _, edge_index = augmented(int_store, [0.0] * int_store.feature_dim, [0, 3, 6, 9], direction)
    for row in torch.unique(rows).tolist():
        in_degree = int((edge_index[1] == int(sub.node[row])).sum())
        assert int((sub.edge_index[1] == row).sum()) == in_degree
