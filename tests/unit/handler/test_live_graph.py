"""Live updates: exact answers on the updated graph, shared log across workers, replay."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from handler.live.errors import (
    MalformedUpdate,
    TooManyOperations,
    UpdateKeyRejected,
    UpdatesDisabled,
)
from handler.live.live_graph import LiveGraph, UpdatePolicy, UpdateRequest, parse_update
from handler.sampling.arrays import TorchOps
from handler.sampling.sampler import NeighbourSampler
from tests.live_reference import live_ids, materialized_forward, random_update

from .conftest import (
    FEATURES,
    answer_update,
    live_engine,
    make_engine,
    random_model,
    refused_update,
)


@pytest.mark.parametrize("arch", ["gcn", "gat"])
def test_exact_after_200_random_updates(int_store, tmp_path, arch):
    model = random_model(int_store, arch)
    engine, live = live_engine(int_store, tmp_path / "updates.log", model)
    rng, counter = random.Random(7), [0]
    for _ in range(200):
        live.update(UpdateRequest(random_update(rng, live, counter)))
    assert live.overlay.seq == 200
    ids, expected = materialized_forward(live, model)
    answers = engine.handle(
        [{"body": {"node_ids": ids[i : i + 32]}} for i in range(0, len(ids), 32)]
    )
    served = torch.tensor([p["probabilities"] for a in answers for p in a.body["predictions"]])
    assert float((served - expected).abs().max()) <= 1e-5
    assert answers[0].body["graph_version"] == f"{int_store.checksum[:12]}+200"


def test_another_worker_sees_an_acknowledged_update(int_store, tmp_path):
    model = random_model(int_store, "sage")
    first, first_live = live_engine(int_store, tmp_path / "updates.log", model)
    second, _ = live_engine(int_store, tmp_path / "updates.log", model)
    first_live.update(
        UpdateRequest(
            [
                {"type": "add_node", "id": 999_999, "x": [0.5] * FEATURES},
                {"type": "add_edge", "src": 999_999, "dst": 0},
            ]
        )
    )
    (answer,) = second.handle([{"body": {"node_id": 999_999}}])
    assert answer.status == 200 and answer.body["graph_version"].endswith("+1")
    (hub,) = second.handle([{"body": {"node_id": 0}}])
    (hub_first,) = first.handle([{"body": {"node_id": 0}}])
    assert hub.body["probabilities"] == hub_first.body["probabilities"]


def test_restart_replays_the_log(int_store, tmp_path):
    model = random_model(int_store, "gcn")
    engine, live = live_engine(int_store, tmp_path / "updates.log", model)
    rng, counter = random.Random(3), [0]
    for _ in range(20):
        live.update(UpdateRequest(random_update(rng, live, counter)))
    before = engine.handle([{"body": {"node_ids": live_ids(live)[:50]}}])[0].body
    restarted, restarted_live = live_engine(int_store, tmp_path / "updates.log", model)
    assert restarted_live.version == live.version
    assert restarted.handle([{"body": {"node_ids": live_ids(live)[:50]}}])[0].body == before


def test_sampled_answers_are_deterministic_per_graph_version(int_store, tmp_path):
    model = random_model(int_store, "sage")
    first, live = live_engine(int_store, tmp_path / "updates.log", model, fanouts=(2, 2))
    live.update(
        UpdateRequest(
            [
                {"type": "add_node", "id": 777_777, "x": [1.0] * FEATURES},
                {"type": "add_edge", "src": 777_777, "dst": 0},
            ]
        )
    )
    second, _ = live_engine(int_store, tmp_path / "updates.log", model, fanouts=(2, 2))
    request = [{"body": {"node_ids": [0, 3, 6, 9]}}]
    assert first.handle(request)[0].body == second.handle(request)[0].body


@pytest.mark.parametrize(
    ("operations", "status"),
    [
        ([{"type": "add_edge", "src": 3, "dst": 424242}], 404),
        ([{"type": "add_node", "id": 3, "x": [0.0] * FEATURES}], 409),
        ([{"type": "add_node", "id": 7, "x": [0.0] * 2}], 400),
        ([{"type": "set_features", "id": 3, "x": [float("inf")] * FEATURES}], 400),
        ([{"type": "add_edge", "src": 3, "dst": 6}, {"type": "bogus"}], 400),
    ],
)
def test_invalid_updates_are_refused_and_change_nothing(int_store, tmp_path, operations, status):
    engine, live = live_engine(int_store, tmp_path / "updates.log", random_model(int_store, "sage"))
    before = engine.handle([{"body": {"node_ids": [0, 3, 6]}}])[0].body
    refused = refused_update(live, operations)
    assert refused.status == status and "operation" in refused.message
    assert live.overlay.seq == 0 and (tmp_path / "updates.log").stat().st_size == 0
    assert engine.handle([{"body": {"node_ids": [0, 3, 6]}}])[0].body == before


def test_removed_nodes_answer_404(int_store, tmp_path):
    engine, live = live_engine(int_store, tmp_path / "updates.log", random_model(int_store, "gcn"))
    live.update(UpdateRequest([{"type": "remove_node", "id": 3}]))
    (answer,) = engine.handle([{"body": {"node_id": 3}}])
    assert answer.status == 404 and answer.body["type"] == "NotFound"


def test_update_authorisation():
    policy = UpdatePolicy(secret="s" * 20, max_operations=2)
    body = {"op": "update", "operations": [{"type": "remove_node", "id": 1}]}
    with pytest.raises(UpdatesDisabled):
        parse_update(body, "s" * 20, UpdatePolicy(secret=None, max_operations=2))
    status, answer = answer_update(body, "s" * 20, None, policy)
    assert status == 403 and "./build_mar.sh --enable-updates" in answer["message"]
    for key in (None, "wrong", "s" * 19):
        with pytest.raises(UpdateKeyRejected, match="x-gnnserve-update-key header"):
            parse_update(body, key, policy)
    assert parse_update(body, "s" * 20, policy).operations == body["operations"]
    with pytest.raises(TooManyOperations, match="3 operations in one update; the limit is 2"):
        parse_update({"op": "update", "operations": [{}] * 3}, "s" * 20, policy)
    for shape in ({"op": "update"}, {"op": "update", "operations": []}):
        with pytest.raises(MalformedUpdate, match='non-empty "operations" list'):
            parse_update(shape, "s" * 20, policy)
    with pytest.raises(MalformedUpdate, match=r"unknown field\(s\) \['node_id'\]"):
        parse_update({**body, "node_id": 3}, "s" * 20, policy)


def test_compaction_folds_base_and_log_into_an_equivalent_store(int_store, tmp_path):
    from graph_assets import open_store
    from graph_assets.compact import compact, replay

    model = random_model(int_store, "gcn")
    engine, live = live_engine(int_store, tmp_path / "updates.log", model)
    rng, counter = random.Random(11), [0]
    for _ in range(60):
        live.update(UpdateRequest(random_update(rng, live, counter)))
    meta = compact(replay(int_store.path, tmp_path / "updates.log"), tmp_path / "compacted")
    compacted = open_store(tmp_path / "compacted")
    assert meta["checksum"] != int_store.checksum
    ids = live_ids(live)
    assert sorted(map(str, compacted.external_ids(np.arange(compacted.num_nodes)))) == sorted(
        map(str, ids)
    )
    fresh = make_engine(compacted, model=model, fanouts=[-1, -1])
    request = [{"body": {"node_ids": ids[i : i + 32]}} for i in range(0, len(ids), 32)]
    served_live = [
        p["probabilities"] for a in engine.handle(request) for p in a.body["predictions"]
    ]
    served_new = [p["probabilities"] for a in fresh.handle(request) for p in a.body["predictions"]]
    assert np.allclose(served_live, served_new, atol=1e-5)


def test_numpy_and_torch_sample_the_updated_graph_alike(int_store, tmp_path):
    """The overlay path (changed in-lists, new nodes) draws the same subgraph with numpy, as CPU
    workers do, and with torch, as GPU workers do."""
    model = random_model(int_store, "sage")
    engine, live = live_engine(int_store, tmp_path / "updates.log", model, fanouts=(2, 3))
    rng, counter = random.Random(3), [0]
    for _ in range(60):
        live.update(UpdateRequest(random_update(rng, live, counter)))
    on_numpy = engine.sampler
    on_torch = NeighbourSampler(
        torch.from_numpy(np.asarray(int_store.indptr, dtype=np.int64)),
        torch.from_numpy(np.asarray(int_store.indices, dtype=np.int64)),
        [2, 3],
        0,
        int(int_store.checksum[:15], 16),
        10**9,
        10**9,
        overlay=live.overlay,
        ops=TorchOps(torch.device("cpu")),
    )
    seeds = torch.from_numpy(np.unique(live.overlay.lookup(live_ids(live)[:40])))
    first, second = on_numpy.sample(seeds), on_torch.sample(seeds)
    assert torch.equal(first.node, second.node)
    assert torch.equal(first.edge_index, second.edge_index)
    assert torch.equal(first.edge, second.edge)  # live edges' IDs too
    assert int(first.edge.max()) >= int_store.num_edges  # some sampled edge was added
    assert first.level_sizes == second.level_sizes


def test_sampling_through_the_overlay_draws_what_the_materialized_graph_draws(int_store, tmp_path):
    """Frontiers with and without changed nodes (the overlay's split path and its one-pass fast
    path) sample exactly what a sampler with no overlay draws on the updated graph's CSC."""
    live = LiveGraph(int_store, tmp_path / "updates.log")
    rng = random.Random(11)
    nodes = int_store.num_nodes
    for _ in range(40):
        dst = rng.randrange(nodes)
        sources = live.overlay.in_list(dst).tolist()
        kind = "remove_edge" if sources and rng.random() < 0.3 else "add_edge"
        if kind == "remove_edge":
            src = rng.choice(sources)
        else:
            src = rng.choice([n for n in range(nodes) if n != dst and n not in sources])
        src_id, dst_id = live.overlay.external_ids(np.array([src, dst]))
        ids = {"src": src_id, "dst": dst_id}
        live.update(UpdateRequest([{"type": kind, **ids}]))
    lists = [live.overlay.in_list(n) for n in range(nodes)]
    indptr = np.zeros(nodes + 1, dtype=np.int64)
    np.cumsum([len(items) for items in lists], out=indptr[1:])
    key = int(int_store.checksum[:15], 16)

    def sampler(indptr, indices, overlay):
        return NeighbourSampler(
            torch.from_numpy(indptr),
            torch.from_numpy(indices),
            [2, 3],
            0,
            key,
            10**9,
            10**9,
            overlay=overlay,
        )

    through_overlay = sampler(
        np.asarray(int_store.indptr, dtype=np.int64),
        np.asarray(int_store.indices, dtype=np.int64),
        live.overlay,
    )
    materialized = sampler(indptr, np.concatenate(lists).astype(np.int64), None)
    dirty = np.flatnonzero(live.overlay.dirty_mask(np.arange(nodes)))
    clean = np.setdiff1d(np.arange(nodes), dirty)
    for seeds in (clean[:5], dirty[:5], np.arange(nodes)):
        seeds = torch.from_numpy(np.unique(seeds))
        first, second = through_overlay.sample(seeds), materialized.sample(seeds)
        assert torch.equal(first.node, second.node)
        # The same edges; a mixed frontier lists its changed nodes' edges after the others.
        assert edge_set(first.edge_index) == edge_set(second.edge_index)


def edge_set(edge_index: torch.Tensor) -> set[tuple[int, int]]:
    return set(map(tuple, edge_index.t().tolist()))
