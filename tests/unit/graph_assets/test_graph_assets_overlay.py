"""The overlay against a plain Python model of the updated graph."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from graph_assets import RawGraph, generate_synthetic, open_store, write_store
from graph_assets.overlay import GraphOverlay, Rejection, UpdateRejected

FEATURES = 4

# The status each kind of rejection gets (handler/protocol/error_table.py; test_error_table.py
# checks it).
KIND = {
    400: Rejection.INVALID,
    404: Rejection.MISSING,
    409: Rejection.CONFLICT,
    413: Rejection.LIMIT,
}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory):
    path: Path = tmp_path_factory.mktemp("overlay") / "store"
    generate_synthetic(40, 160, path, feature_dim=FEATURES, num_classes=3)
    return open_store(path)


class Reference:
    """The updated graph as sets and dicts."""

    def __init__(self, store) -> None:
        ids = store.external_ids(np.arange(store.num_nodes))
        edge_index = store.edge_index()
        self.nodes = {i: np.array(store.features[n]) for n, i in enumerate(ids)}
        self.edges = {(ids[s], ids[d]) for s, d in edge_index.T.tolist()}
        self.removed: set = set()

    def copy(self) -> Reference:
        other = Reference.__new__(Reference)
        other.nodes, other.edges, other.removed = (
            dict(self.nodes),
            set(self.edges),
            set(self.removed),
        )
        return other

    def in_neighbours(self, node) -> set:
        return {s for s, d in self.edges if d == node}


def random_operation(rng: random.Random, reference: Reference, next_id: list[int]) -> dict:
    nodes = sorted(reference.nodes)
    kind = rng.choice(
        ["add_node", "add_edge", "add_edge", "remove_edge", "set_features", "remove_node"]
    )
    x = [rng.uniform(-1, 1) for _ in range(FEATURES)]
    if kind == "add_node":
        next_id[0] += 1
        return {"type": kind, "id": next_id[0], "x": x}
    if kind == "set_features":
        return {"type": kind, "id": rng.choice(nodes), "x": x}
    if kind == "remove_node":
        return {"type": kind, "id": rng.choice(nodes)}
    if kind == "remove_edge" and reference.edges:
        src, dst = rng.choice(sorted(reference.edges))
        return {"type": kind, "src": src, "dst": dst}
    src, dst = rng.sample(nodes, 2)
    return {"type": "add_edge", "src": src, "dst": dst}


def apply_reference(reference: Reference, operation: dict) -> None:
    """Applies one operation, raising ValueError where the overlay must refuse it."""
    kind = operation["type"]
    if kind == "add_node":
        if operation["id"] in reference.nodes or operation["id"] in reference.removed:
            raise ValueError("exists")
        reference.nodes[operation["id"]] = np.array(operation["x"], dtype=np.float32)
        return
    for field in ("id", "src", "dst"):
        if field in operation and operation[field] not in reference.nodes:
            raise ValueError("unknown node")
    if kind == "set_features":
        reference.nodes[operation["id"]] = np.array(operation["x"], dtype=np.float32)
    elif kind == "remove_node":
        node = operation["id"]
        del reference.nodes[node]
        reference.removed.add(node)
        reference.edges = {(s, d) for s, d in reference.edges if node not in (s, d)}
    elif kind == "add_edge":
        edge = (operation["src"], operation["dst"])
        if edge in reference.edges or edge[0] == edge[1]:
            raise ValueError("exists or self-loop")
        reference.edges.add(edge)
    else:
        edge = (operation["src"], operation["dst"])
        if edge not in reference.edges:
            raise ValueError("missing edge")
        reference.edges.discard(edge)


def check_equal(overlay: GraphOverlay, reference: Reference) -> None:
    for node_id, features in reference.nodes.items():
        node = int(overlay.lookup([node_id])[0])
        assert node >= 0
        in_ids = set(overlay.external_ids(overlay.in_list(node)))
        assert in_ids == reference.in_neighbours(node_id), node_id
        assert overlay.degree_rows(np.array([node]))[0] == len(in_ids)
        assert np.allclose(overlay.feature_rows(np.array([node]))[0], features)


@pytest.mark.parametrize("seed", range(5))
def test_random_updates_match_a_plain_model(store, seed):
    rng = random.Random(seed)
    overlay = GraphOverlay(store)
    reference = Reference(store)
    next_id = [1000]
    for seq in range(1, 61):
        batch = [random_operation(rng, reference, next_id) for _ in range(rng.randint(1, 4))]
        staged = reference.copy()
        try:
            for operation in batch:
                apply_reference(staged, operation)
            valid = True
        except ValueError:
            valid = False
        try:
            overlay.apply(batch, seq)
            applied = True
        except UpdateRejected:
            applied = False
        assert applied == valid, batch
        if applied:
            reference = staged
        check_equal(overlay, reference)


def test_invalid_request_changes_nothing_and_names_the_item(store):
    overlay = GraphOverlay(store)
    overlay.apply([{"type": "add_node", "id": 500, "x": [0.0] * FEATURES}], 1)
    before = {n: overlay.in_list(n).tolist() for n in range(store.num_nodes + 1)}
    cases = [
        (
            [
                {"type": "add_edge", "src": 500, "dst": 1},
                {"type": "add_edge", "src": 77777, "dst": 1},
            ],
            404,
            1,
        ),
        (
            [
                {"type": "add_node", "id": 501, "x": [0.0] * FEATURES},
                {"type": "add_node", "id": 501, "x": [0.0] * FEATURES},
            ],
            409,
            1,
        ),
        ([{"type": "add_node", "id": 502, "x": [0.0] * (FEATURES + 1)}], 400, 0),
        ([{"type": "set_features", "id": 1, "x": [float("nan")] * FEATURES}], 400, 0),
        ([{"type": "add_edge", "src": 3, "dst": 3}], 400, 0),
        ([{"type": "remove_node", "id": 500}, {"type": "nonsense"}], 400, 1),
        ([{"type": "add_node", "id": 0, "x": [0.0] * FEATURES}], 409, 0),
        # An unknown field is refused, whatever it holds (infinity cannot even be logged).
        (
            [
                {"type": "add_edge", "src": 500, "dst": 2},
                {"type": "remove_node", "id": 4, "label": float("inf")},
            ],
            400,
            1,
        ),
        ([{"type": "add_edge", "src": 500, "dst": 2, "weight": 1}], 400, 0),
    ]
    for operations, status, index in cases:
        with pytest.raises(UpdateRejected) as rejected:
            overlay.apply(operations, 2)
        assert rejected.value.kind is KIND[status] and rejected.value.index == index
        assert f"operation {index}" in str(rejected.value)
        assert overlay.seq == 1
        assert {n: overlay.in_list(n).tolist() for n in range(store.num_nodes + 1)} == before
        assert overlay.lookup([500, 501, 502]).tolist()[1:] == [-1, -1]


def test_removed_nodes_are_gone_and_their_ids_not_reused(store):
    overlay = GraphOverlay(store)
    overlay.apply([{"type": "remove_node", "id": 5}], 1)
    assert overlay.lookup([5]).tolist() == [-1]
    assert all(5 not in overlay.in_list(n).tolist() for n in range(store.num_nodes))
    with pytest.raises(UpdateRejected, match="was removed"):
        overlay.apply([{"type": "add_node", "id": 5, "x": [0.0] * FEATURES}], 2)


def test_a_huge_id_is_refused_and_quoted_in_short(store):
    overlay = GraphOverlay(store)
    huge = 10**400
    for operation, status in (
        ({"type": "set_features", "id": huge, "x": [0.0] * FEATURES}, 404),
        ({"type": "add_edge", "src": huge, "dst": 1}, 404),
        ({"type": "add_node", "id": huge, "x": [0.0] * FEATURES}, 400),
    ):
        with pytest.raises(UpdateRejected) as rejected:
            overlay.apply([operation], 1)
        assert rejected.value.kind is KIND[status]
        assert len(str(rejected.value)) < 150 and "(401 characters)" in str(rejected.value)


def test_a_base_with_self_loops_and_parallel_edges(tmp_path):
    """Stored self-loops can be removed (not added); remove_edge takes every parallel copy."""
    raw = RawGraph(
        ids=np.array([1, 2, 3]),
        src=np.array([0, 0, 2, 1]),
        dst=np.array([1, 1, 2, 2]),
        features=np.zeros((3, FEATURES), np.float32),
        labels=np.full(3, -1),
        class_names=None,
        feature_names=[f"f{i}" for i in range(FEATURES)],
    )
    write_store(raw, tmp_path / "store")
    overlay = GraphOverlay(open_store(tmp_path / "store"))
    two, three = overlay.lookup([2, 3]).tolist()
    assert overlay.degree_rows(np.array([two, three])).tolist() == [2, 2]
    for operation, kind in (
        ({"type": "add_edge", "src": 1, "dst": 2}, Rejection.CONFLICT),
        ({"type": "add_edge", "src": 1, "dst": 1}, Rejection.INVALID),
    ):
        with pytest.raises(UpdateRejected) as info:
            overlay.apply([operation], 1)
        assert info.value.kind == kind
    overlay.apply([{"type": "remove_edge", "src": 3, "dst": 3}], 1)
    assert overlay.external_ids(overlay.in_list(three)) == [2]
    overlay.apply([{"type": "remove_edge", "src": 1, "dst": 2}], 2)
    assert overlay.in_list(two).tolist() == []
    overlay.apply([{"type": "add_edge", "src": 1, "dst": 2}], 3)
    assert overlay.degree_rows(np.array([two, three])).tolist() == [1, 1]
