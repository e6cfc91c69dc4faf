"""write_store / StoreBuilder: CSC layout, kept and dropped edges, meta, and all-or-nothing
replacement (edge features: test_graph_assets_edge_features.py)."""

import json
import os
import stat
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import graph_assets.stored.writer as writer
from graph_assets import RawGraph, StoreBuilder, StoreError, open_store, write_store
from graph_assets.schema import EdgeType
from graph_assets.stored.store import combined_checksum, file_digests, index_dtype, store_files
from graph_assets.stored.writer import NodeTypeInput, RelationInput

EDGES = EdgeType("node", "to", "node")


def raw_graph(
    ids: list[int] | list[str],
    edges: list[tuple[int, int]],
    labels: list[int] | None = None,
    class_names: list[str] | None = None,
) -> RawGraph:
    """A RawGraph over ``ids`` with edges given as positions in ``ids``; feature i is [i, -i]."""
    if ids and isinstance(ids[0], str):
        id_array = np.array([str(i).encode("utf-8") for i in ids])
    else:
        id_array = np.array(ids, dtype=np.int64)
    n = len(ids)
    return RawGraph(
        ids=id_array,
        src=np.array([s for s, _ in edges], dtype=np.int64),
        dst=np.array([d for _, d in edges], dtype=np.int64),
        features=np.stack([np.arange(n), -np.arange(n)], axis=1).astype(np.float32),
        labels=np.array(labels if labels is not None else [-1] * n, dtype=np.int64),
        class_names=class_names,
        feature_names=["a", "b"],
    )


def entries(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_csc_layout_keeps_self_loops_and_parallel_edges(tmp_path: Path) -> None:
    # ids already sorted, so positions are internal indices.
    edges = [(2, 0), (1, 0), (1, 0), (3, 3), (0, 2), (2, 1), (0, 0)]
    meta = write_store(raw_graph([10, 20, 30, 40], edges), tmp_path / "s")
    store = open_store(tmp_path / "s")
    assert store.indptr.tolist() == [0, 4, 5, 6, 7]
    assert store.indices.tolist() == [0, 1, 1, 2, 2, 0, 3]  # by dst, ascending src within
    assert store.in_degree.tolist() == [4, 1, 1, 1]
    assert store.out_degree.tolist() == [2, 2, 2, 1]
    assert meta["stats"] == {
        "input_edges": 7,
        "self_loops_dropped": 0,
        "duplicate_edges_dropped": 0,
        "self_loops_kept": 2,
        "duplicate_edges_kept": 1,
        "undirected": False,
    }
    assert meta["num_edges"] == 7


def test_csc_layout_with_both_drop_flags(tmp_path: Path) -> None:
    edges = [(2, 0), (1, 0), (1, 0), (3, 3), (0, 2), (2, 1), (0, 0)]
    meta = write_store(
        raw_graph([10, 20, 30, 40], edges),
        tmp_path / "s",
        drop_self_loops=True,
        drop_duplicate_edges=True,
    )
    store = open_store(tmp_path / "s")
    assert store.indptr.dtype == np.int32 and store.indices.dtype == np.int32
    assert store.indptr.tolist() == [0, 2, 3, 4, 4]
    assert store.indices.tolist() == [1, 2, 2, 0]  # grouped by dst, ascending src within
    assert store.in_degree.tolist() == [2, 1, 1, 0]
    assert store.out_degree.tolist() == [1, 1, 2, 0]
    assert meta["stats"] == {
        "input_edges": 7,
        "self_loops_dropped": 2,
        "duplicate_edges_dropped": 1,
        "self_loops_kept": 0,
        "duplicate_edges_kept": 0,
        "undirected": False,
    }
    assert meta["num_edges"] == 4


def test_nodes_are_renumbered_in_sorted_id_order(tmp_path: Path) -> None:
    raw = raw_graph([30, -5, 10], [(0, 1), (2, 0)], labels=[2, -1, 0])
    write_store(raw, tmp_path / "s")
    store = open_store(tmp_path / "s")
    assert store.ids.tolist() == [-5, 10, 30]
    # Feature row i of the raw graph is [i, -i]: raw positions 1, 2, 0 in sorted order.
    assert store.features[:, 0].tolist() == [1, 2, 0]
    assert store.labels.tolist() == [-1, 0, 2]
    pairs = {tuple(store.external_ids(e)) for e in store.edge_index().T}
    assert pairs == {(30, -5), (10, 30)}


def test_string_ids_sort_as_utf8_bytes(tmp_path: Path) -> None:
    write_store(raw_graph(["b", "é", "a", "Z", "ab"], []), tmp_path / "s")
    store = open_store(tmp_path / "s")
    assert store.ids.dtype == np.dtype("S2")
    assert store.external_ids(np.arange(5)) == ["Z", "a", "ab", "b", "é"]
    assert store.id_kind == "str" and store.meta["node_types"][0]["id_kind"] == "str"


def test_meta_describes_every_file(tmp_path: Path) -> None:
    meta = write_store(raw_graph([1, 2], [(0, 1)], [0, 1], ["x", "y"]), tmp_path / "s")
    assert json.loads((tmp_path / "s" / "meta.json").read_text()) == meta
    assert meta["format_version"] == 3
    assert (meta["num_nodes"], meta["num_edges"]) == (2, 1)
    assert meta["node_types"] == [
        {"name": "node", "num_nodes": 2, "feature_dim": 2, "id_kind": "int"}
    ]
    assert meta["edge_types"] == [
        {"src": "node", "relation": "to", "dst": "node", "num_edges": 1, "edge_feature_names": []}
    ]
    assert (meta["num_classes"], meta["class_names"]) == (2, ["x", "y"])
    assert sorted(meta["files"]) == sorted(store_files(meta))
    for name, entry in meta["files"].items():
        path = tmp_path / "s" / name
        array = np.load(path, allow_pickle=False)
        assert (entry["dtype"], entry["shape"]) == (array.dtype.str, list(array.shape))
        digests = file_digests(path)
        assert (entry["bytes"], entry["sha256"], entry["blake3"]) == (
            path.stat().st_size,
            digests["sha256"],
            digests["blake3"],
        )
    digests = {name: entry["sha256"] for name, entry in meta["files"].items()}
    assert meta["checksum"] == combined_checksum(digests)


def test_index_dtype_widens_only_past_int32() -> None:
    assert index_dtype(2**31 - 1) == np.int32
    assert index_dtype(2**31) == np.int64


def test_store_is_readable_by_others(tmp_path: Path) -> None:
    write_store(raw_graph([1], []), tmp_path / "s")
    assert stat.S_IMODE((tmp_path / "s").stat().st_mode) == 0o755


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    data=st.data(),
    n=st.integers(min_value=1, max_value=12),
)
def test_random_edge_lists_round_trip_with_both_drop_flags(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject, n: int
) -> None:
    ids = data.draw(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=n, max_size=n, unique=True))
    edges = data.draw(
        st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=40)
    )
    out = tmp_path_factory.mktemp("rt") / "store"
    meta = write_store(raw_graph(ids, edges), out, drop_self_loops=True, drop_duplicate_edges=True)
    store = open_store(out)

    expected = {(ids[s], ids[d]) for s, d in edges if s != d}
    stored = [tuple(store.external_ids(e)) for e in store.edge_index().T]
    assert len(stored) == len(set(stored)) == store.num_edges
    assert set(stored) == expected
    self_loops = sum(s == d for s, d in edges)
    assert meta["stats"]["self_loops_dropped"] == self_loops
    assert meta["stats"]["duplicate_edges_dropped"] == len(edges) - self_loops - len(expected)
    in_degree: Counter[int | str] = Counter(d for _, d in expected)
    out_degree: Counter[int | str] = Counter(s for s, _ in expected)
    external = store.external_ids(np.arange(store.num_nodes))
    assert store.in_degree.tolist() == [in_degree[i] for i in external]
    assert store.out_degree.tolist() == [out_degree[i] for i in external]
    assert store.lookup(ids).tolist() == [external.index(i) for i in ids]


# --- all or nothing -------------------------------------------------------------------------


def test_replaces_a_previous_store(tmp_path: Path) -> None:
    write_store(raw_graph([1, 2], [(0, 1)]), tmp_path / "s")
    write_store(raw_graph([1, 2, 3], [(2, 0)]), tmp_path / "s")
    assert open_store(tmp_path / "s").ids.tolist() == [1, 2, 3]
    assert entries(tmp_path) == ["s"]


def test_replaces_without_atomic_exchange_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(writer, "_exchange", lambda a, b: False)
    write_store(raw_graph([1, 2], [(0, 1)]), tmp_path / "s")
    write_store(raw_graph([7], []), tmp_path / "s")
    assert open_store(tmp_path / "s").ids.tolist() == [7]
    assert entries(tmp_path) == ["s"]


def test_accepts_an_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "s").mkdir()
    write_store(raw_graph([1], []), tmp_path / "s")
    assert open_store(tmp_path / "s").num_nodes == 1


def test_refuses_to_replace_what_is_not_a_store(tmp_path: Path) -> None:
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "notes.txt").write_text("keep me")
    with pytest.raises(StoreError, match=r"exists and is not a graph store.*refusing to replace"):
        write_store(raw_graph([1], []), tmp_path / "s")
    assert (tmp_path / "s" / "notes.txt").read_text() == "keep me"
    (tmp_path / "f").write_text("a file")
    with pytest.raises(StoreError, match="is not a graph store"):
        write_store(raw_graph([1], []), tmp_path / "f")
    assert entries(tmp_path) == ["f", "s"]


def test_failed_build_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise MemoryError("simulated")

    monkeypatch.setattr(writer, "_csc", fail)
    with pytest.raises(MemoryError):
        write_store(raw_graph([1, 2], [(0, 1)]), tmp_path / "out" / "s")
    assert entries(tmp_path / "out") == []


def test_failed_rebuild_keeps_the_previous_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = write_store(raw_graph([1, 2], [(0, 1)]), tmp_path / "s")

    def fail(path: Path) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(writer, "_file_meta", fail)
    with pytest.raises(OSError, match="disk full"):
        write_store(raw_graph([5, 6], []), tmp_path / "s")
    assert entries(tmp_path) == ["s"]
    assert open_store(tmp_path / "s").checksum == before["checksum"]


def test_builder_checks_its_inputs_and_cleans_up(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="strictly ascending"):
        StoreBuilder(tmp_path / "s", [NodeTypeInput("node", np.array([2, 1]), 2)])
    with StoreBuilder(tmp_path / "s", [NodeTypeInput("node", np.array([1, 2]), 2)]) as builder:
        with pytest.raises(ValueError, match="finite"):
            builder.add_features(np.array([[np.nan, 0]]))
        with pytest.raises(ValueError, match=r"must be \[n, 2\]"):
            builder.add_features(np.zeros((1, 3)))
        builder.add_features(np.zeros((1, 2)))
        with pytest.raises(ValueError, match="got 1 feature rows for 2 nodes"):
            builder.commit(
                [RelationInput(EDGES, np.array([0]), np.array([1]))],
                np.array([-1, -1]),
                num_classes=0,
                class_names=None,
                undirected=False,
            )
    assert entries(tmp_path) == []


def test_builder_refuses_a_featureless_target_and_no_relations(tmp_path: Path) -> None:
    with pytest.raises(ValueError) as refused:
        StoreBuilder(tmp_path / "s", [NodeTypeInput("user", np.array([1, 2]), 0)])
    assert str(refused.value) == (
        "the target type user needs at least one feature column, got feature_dim 0"
    )
    with StoreBuilder(tmp_path / "s", [NodeTypeInput("node", np.array([1, 2]), 1)]) as builder:
        builder.add_features(np.zeros((2, 1)))
        with pytest.raises(ValueError) as refused:
            builder.commit(
                [], np.array([-1, -1]), num_classes=0, class_names=None, undirected=False
            )
    assert str(refused.value) == "a store needs at least one relation (edge type), got none"
    assert entries(tmp_path) == []


def test_builder_writes_features_block_by_block(tmp_path: Path) -> None:
    features = np.random.default_rng(0).standard_normal((10, 3)).astype(np.float32)
    with StoreBuilder(tmp_path / "s", [NodeTypeInput("node", np.arange(10), 3)]) as builder:
        for start in range(0, 10, 4):
            builder.add_features(features[start : start + 4])
        builder.commit(
            [RelationInput(EDGES, np.array([0, 1]), np.array([1, 2]))],
            np.full(10, -1),
            num_classes=0,
            class_names=None,
            undirected=True,
        )
    store = open_store(tmp_path / "s")
    np.testing.assert_array_equal(store.features, features)
    assert store.meta["stats"]["undirected"] is True
    assert not any(name.endswith(".tmp") for name in os.listdir(tmp_path))
