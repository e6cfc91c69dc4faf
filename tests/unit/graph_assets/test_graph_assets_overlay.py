"""The overlay against a plain Python model of the updated graph."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from graph_assets import RawGraph, generate_synthetic, open_store, write_store
from graph_assets.live.operations import Rejection, UpdateRejected, decode_operations
from graph_assets.live.overlay import GraphOverlay, ListenerFailed
from tests.edge_graph import edge_feature_store


def apply(overlay: GraphOverlay, operations: list, seq: int) -> None:
    """The operations as the live graph applies them: decoded, then applied."""
    overlay.apply(decode_operations(operations, overlay.base), seq)


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


@pytest.fixture(scope="module")
def edge_store(tmp_path_factory: pytest.TempPathFactory):
    """Edge features, self-loops and parallel edges in the base (tests/edge_graph.py)."""
    return edge_feature_store(tmp_path_factory.mktemp("overlay_edges"))


class Reference:
    """The updated graph as plain dicts: each ``(src, dst)`` pair's edges as a list of feature
    rows, oldest first (parallel edges, self-loops and all)."""

    def __init__(self, store) -> None:
        ids = store.external_ids(np.arange(store.num_nodes))
        edge_index = store.edge_index()
        rows = np.asarray(store.edge_features)
        self.width, self.feature_dim = store.edge_feature_dim, store.feature_dim
        self.nodes = {i: np.array(store.features[n]) for n, i in enumerate(ids)}
        self.edges: dict[tuple, list[np.ndarray]] = {}
        for position, (s, d) in enumerate(edge_index.T.tolist()):  # CSC order: by edge ID
            self.edges.setdefault((ids[s], ids[d]), []).append(rows[position])
        self.removed: set = set()

    def copy(self) -> Reference:
        other = Reference.__new__(Reference)
        other.width, other.feature_dim = self.width, self.feature_dim
        other.nodes, other.removed = dict(self.nodes), set(self.removed)
        other.edges = {pair: list(rows) for pair, rows in self.edges.items()}
        return other

    def in_neighbours(self, node) -> Counter:
        return Counter({s: len(rows) for (s, d), rows in self.edges.items() if d == node and rows})


def random_operation(rng: random.Random, reference: Reference, next_id: list[int]) -> dict:
    nodes = sorted(reference.nodes)
    kinds = ["add_node", "add_edge", "add_edge", "remove_edge", "set_features", "remove_node"]
    kind = rng.choice(kinds + (["set_edge_features"] if reference.width else []))
    x = [rng.uniform(-1, 1) for _ in range(reference.feature_dim)]
    attr = [rng.uniform(-5, 5) for _ in range(reference.width)]
    if kind == "add_node":
        next_id[0] += 1
        new = next_id[0] if isinstance(nodes[0], int) else f"new_{next_id[0]}"
        return {"type": kind, "id": new, "x": x}
    if kind == "set_features":
        return {"type": kind, "id": rng.choice(nodes), "x": x}
    if kind == "remove_node":
        return {"type": kind, "id": rng.choice(nodes)}
    pairs = sorted((p for p, rows in reference.edges.items() if rows), key=str)
    if kind in ("remove_edge", "set_edge_features") and pairs and rng.random() < 0.9:
        src, dst = rng.choice(pairs)
    elif rng.random() < 0.2 and pairs:  # a parallel edge, or a pair that has none
        src, dst = rng.choice(pairs)
        kind = "add_edge" if rng.random() < 0.5 else kind
    else:
        src = rng.choice(nodes)
        dst = src if rng.random() < 0.1 else rng.choice(nodes)  # self-loops too
    operation = {"type": kind, "src": src, "dst": dst}
    if kind == "set_edge_features" or (kind == "add_edge" and reference.width):
        operation["attr"] = attr
    return operation


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
        reference.edges = {p: rows for p, rows in reference.edges.items() if node not in p}
    elif kind == "add_edge":
        row = np.array(operation.get("attr", []), dtype=np.float32)
        reference.edges.setdefault((operation["src"], operation["dst"]), []).append(row)
    else:
        rows = reference.edges.get((operation["src"], operation["dst"]))
        if not rows:
            raise ValueError("missing edge")
        if kind == "remove_edge":
            rows.pop()  # the one added last
        else:
            rows[:] = [np.array(operation["attr"], dtype=np.float32)] * len(rows)


def check_equal(overlay: GraphOverlay, reference: Reference) -> None:
    check_out_degrees(overlay, reference)
    for node_id, features in reference.nodes.items():
        node = int(overlay.lookup([node_id])[0])
        assert node >= 0
        sources = overlay.in_list(node)
        assert Counter(overlay.external_ids(sources)) == reference.in_neighbours(node_id), node_id
        loops = int(np.count_nonzero(sources == node))  # degree_rows leaves self-loops out
        assert overlay.degree_rows(np.array([node]))[0] == len(sources) - loops
        assert np.allclose(overlay.feature_rows(np.array([node]))[0], features)
        rows = overlay.edge_feature_rows(overlay.in_list_edge_ids(node))
        for source_id, source in zip(overlay.external_ids(sources), sources.tolist(), strict=True):
            expected = reference.edges[(source_id, node_id)]
            assert np.array_equal(rows[sources == source], np.array(expected)), (source_id, node_id)


def check_out_degrees(overlay: GraphOverlay, reference: Reference) -> None:
    """Every node's out-degree (self-loops not counted) and the largest, as a recount of the
    updated graph's edges has them."""
    counted: Counter = Counter()
    for (source, destination), rows in reference.edges.items():
        if source != destination:
            counted[source] += len(rows)
    ids = list(reference.nodes)
    nodes = overlay.lookup(ids)
    assert overlay.out_degree_rows(nodes).tolist() == [counted[i] for i in ids]
    assert overlay.largest_out_degree() == max(counted.values(), default=0)


def run_random_updates(store, seed: int) -> GraphOverlay:
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
            apply(overlay, batch, seq)
            applied = True
        except UpdateRejected:
            applied = False
        assert applied == valid, batch
        if applied:
            reference = staged
        check_equal(overlay, reference)
    return overlay


@pytest.mark.parametrize("seed", range(5))
def test_random_updates_match_a_plain_model(store, seed):
    run_random_updates(store, seed)


@pytest.mark.parametrize("seed", range(3))
def test_random_updates_with_edge_features_match_a_plain_model(edge_store, seed):
    """Self-loops, parallel edges, ``remove_edge`` taking the pair's newest edge, and
    ``set_edge_features`` on base and added edges, against lists of rows per pair."""
    overlay = run_random_updates(edge_store, seed)
    assert overlay.added_edges > 0 and overlay.changed_edge_rows


def test_invalid_request_changes_nothing_and_names_the_item(store):
    overlay = GraphOverlay(store)
    apply(overlay, [{"type": "add_node", "id": 500, "x": [0.0] * FEATURES}], 1)
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
        # This graph has no edge features: attr is refused, and so is set_edge_features.
        ([{"type": "add_edge", "src": 3, "dst": 3, "attr": [1.0]}], 400, 0),
        ([{"type": "add_edge", "src": 3, "dst": 3}, {"type": "set_edge_features"}], 400, 1),
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
            apply(overlay, operations, 2)
        assert rejected.value.kind is KIND[status] and rejected.value.index == index
        assert f"operation {index}" in str(rejected.value)
        assert overlay.seq == 1
        assert {n: overlay.in_list(n).tolist() for n in range(store.num_nodes + 1)} == before
        assert overlay.lookup([500, 501, 502]).tolist()[1:] == [-1, -1]


def test_removed_nodes_are_gone_and_their_ids_not_reused(store):
    overlay = GraphOverlay(store)
    apply(overlay, [{"type": "remove_node", "id": 5}], 1)
    assert overlay.lookup([5]).tolist() == [-1]
    assert all(5 not in overlay.in_list(n).tolist() for n in range(store.num_nodes))
    with pytest.raises(UpdateRejected, match="was removed"):
        apply(overlay, [{"type": "add_node", "id": 5, "x": [0.0] * FEATURES}], 2)


def test_a_huge_id_is_refused_and_quoted_in_short(store):
    overlay = GraphOverlay(store)
    huge = 10**400
    for operation, status in (
        ({"type": "set_features", "id": huge, "x": [0.0] * FEATURES}, 404),
        ({"type": "add_edge", "src": huge, "dst": 1}, 404),
        ({"type": "add_node", "id": huge, "x": [0.0] * FEATURES}, 400),
    ):
        with pytest.raises(UpdateRejected) as rejected:
            apply(overlay, [operation], 1)
        assert rejected.value.kind is KIND[status]
        assert len(str(rejected.value)) < 150 and "(401 characters)" in str(rejected.value)


def test_a_base_with_self_loops_and_parallel_edges(tmp_path):
    """The graph stays as given: self-loops can be added and removed, adding a pair that
    exists adds a parallel edge, and remove_edge takes one edge of the pair, the newest."""
    raw = RawGraph(
        ids=np.array([1, 2, 3]),
        src=np.array([0, 0, 2, 1]),
        dst=np.array([1, 1, 2, 2]),
        features=np.zeros((3, FEATURES), np.float32),
        labels=np.full(3, -1),
        class_names=None,
        feature_names=[f"f{i}" for i in range(FEATURES)],
        edge_features=np.array([[1.0], [2.0], [3.0], [4.0]], np.float32),
        edge_feature_names=["amount"],
    )
    write_store(raw, tmp_path / "store")
    overlay = GraphOverlay(open_store(tmp_path / "store"))
    two, three = overlay.lookup([2, 3]).tolist()
    assert overlay.degree_rows(np.array([two, three])).tolist() == [2, 1]  # 3's self-loop out

    def pair_rows(node: int) -> list[tuple[int, float]]:
        rows = overlay.edge_feature_rows(overlay.in_list_edge_ids(node))[:, 0].tolist()
        return list(zip(overlay.external_ids(overlay.in_list(node)), rows, strict=True))

    apply(overlay, [{"type": "add_edge", "src": 1, "dst": 2, "attr": [5.0]}], 1)
    apply(overlay, [{"type": "add_edge", "src": 1, "dst": 1, "attr": [6.0]}], 2)
    assert pair_rows(two) == [(1, 1.0), (1, 2.0), (1, 5.0)]
    assert overlay.in_list_edge_ids(two).tolist() == [0, 1, 4]  # a new ID after the base's
    assert pair_rows(int(overlay.lookup([1])[0])) == [(1, 6.0)]
    apply(overlay, [{"type": "remove_edge", "src": 1, "dst": 2}], 3)
    assert pair_rows(two) == [(1, 1.0), (1, 2.0)]  # the newest went
    apply(overlay, [{"type": "remove_edge", "src": 1, "dst": 2}], 4)
    assert pair_rows(two) == [(1, 1.0)]  # then the last stored copy
    apply(overlay, [{"type": "set_edge_features", "src": 3, "dst": 3, "attr": [7.0]}], 5)
    assert pair_rows(three) == [(2, 4.0), (3, 7.0)]
    apply(overlay, [{"type": "remove_edge", "src": 3, "dst": 3}], 6)
    assert pair_rows(three) == [(2, 4.0)]
    assert overlay.degree_rows(np.array([two, three])).tolist() == [1, 1]
    for operation, words in (
        ({"type": "add_edge", "src": 1, "dst": 2}, "needs attr, a list of the 1 edge features"),
        ({"type": "add_edge", "src": 1, "dst": 2, "attr": [1.0, 2.0]}, "list of 1 numbers"),
        ({"type": "set_edge_features", "src": 1, "dst": 2, "attr": []}, "list of 1 numbers"),
        ({"type": "add_edge", "src": 1, "dst": 2, "attr": [float("nan")]}, "attr holds NaN"),
        ({"type": "set_edge_features", "src": 3, "dst": 1, "attr": [1.0]}, "does not exist"),
        ({"type": "remove_edge", "src": 3, "dst": 3}, "does not exist"),
    ):
        with pytest.raises(UpdateRejected, match=words) as info:
            apply(overlay, [operation], 7)
        assert info.value.kind is (Rejection.MISSING if "exist" in words else Rejection.INVALID)
    assert overlay.seq == 6


def test_set_edge_features_marks_the_destination_as_changed(tmp_path):
    """Listeners (precomputed rows) see a set_edge_features as a change of the destination's
    in-edges, and so does one that starts after it was applied."""
    overlay = GraphOverlay(edge_feature_store(tmp_path))
    changes: list = []
    overlay.listeners.append(changes.append)
    hub = int(overlay.lookup(["acct_0"])[0])
    (source,) = overlay.external_ids(overlay.in_list(hub)[:1])
    apply(
        overlay, [{"type": "set_edge_features", "src": source, "dst": "acct_0", "attr": [1, 2]}], 1
    )
    assert list(changes[0].in_lists_before) == [hub] and not changes[0].feature_rows
    assert np.array_equal(changes[0].in_lists_before[hub], overlay.in_list(hub))
    assert list(overlay.changes_so_far().in_lists_before) == [hub]


def test_a_listener_that_raises_undoes_nothing_and_the_others_still_hear(store):
    """After the commit a listener's failure is ListenerFailed: the seq moved, the operations
    stay, every later listener got the change, and the next request applies as usual."""
    overlay = GraphOverlay(store)
    heard: list = []

    def failing(change) -> None:
        raise TimeoutError("injected")

    overlay.listeners += [failing, heard.append]
    committed: list[int] = []
    new = {"type": "add_node", "id": 900, "x": [0.5] * FEATURES}
    with pytest.raises(ListenerFailed, match=r"update seq 1 is applied.*TimeoutError: injected"):
        overlay.apply(decode_operations([new], store), 1, commit=lambda: committed.append(1))
    assert committed == [1] and overlay.seq == 1 and int(overlay.lookup([900])[0]) >= 0
    assert len(heard) == 1 and heard[0].feature_rows == {int(overlay.lookup([900])[0])}
    overlay.listeners.remove(failing)
    apply(overlay, [{"type": "add_edge", "src": 900, "dst": 0}], 2)
    assert overlay.seq == 2 and len(heard) == 2 and 900 in overlay.external_ids(overlay.in_list(0))


def test_the_largest_out_degree_follows_its_node_down_and_back(edge_store):
    """Removing the node of the largest out-degree hands the largest to the next one in the
    base's order; a refused request and a new node's edges leave it exact too."""
    overlay = GraphOverlay(edge_store)
    degrees = edge_store.out_degree_rows(np.arange(edge_store.num_nodes))
    top, second = np.sort(degrees)[::-1][:2].tolist()
    index = int(np.argmax(degrees))
    hub = edge_store.external_ids(np.array([index]))[0]
    assert overlay.largest_out_degree() == edge_store.largest_out_degree() == top
    apply(overlay, [{"type": "remove_node", "id": hub}], 1)
    assert overlay.largest_out_degree() == second
    assert overlay.out_degree_rows(np.array([index])).tolist() == [0]
    x = [0.0] * edge_store.feature_dim
    attr = [0.0] * edge_store.edge_feature_dim
    others = [i for i in edge_store.external_ids(np.arange(top + 1)) if i != hub]
    with pytest.raises(UpdateRejected):
        apply(
            overlay,
            [
                {"type": "add_node", "id": "fan", "x": x},
                *({"type": "add_edge", "src": "fan", "dst": d, "attr": attr} for d in others),
                {"type": "add_edge", "src": "fan", "dst": "nobody", "attr": attr},
            ],
            2,
        )
    assert overlay.largest_out_degree() == second
    operations = [{"type": "add_node", "id": "fan", "x": x}]
    operations += [{"type": "add_edge", "src": "fan", "dst": d, "attr": attr} for d in others]
    operations.append({"type": "add_edge", "src": "fan", "dst": "fan", "attr": attr})
    apply(overlay, operations, 2)
    fan = overlay.lookup(["fan"])
    assert overlay.out_degree_rows(fan).tolist() == [len(others)]  # its self-loop not counted
    assert overlay.largest_out_degree() == max(second, len(others))
