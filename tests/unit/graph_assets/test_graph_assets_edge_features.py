"""Edge features and the graph kept as given: edge columns read and checked, stored in CSC order
(an edge's ID is its CSC position), self-loops and parallel edges kept unless dropped, version 1
stores still open, compaction carries the features through."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graph_assets import (
    GraphInputError,
    GraphStore,
    RawGraph,
    StoreError,
    open_store,
    read_graph_dir,
    share_store,
    write_store,
)
from graph_assets.__main__ import main
from graph_assets.compact import compact, replay
from graph_assets.live.operations import decode_operations
from graph_assets.live.overlay import GraphOverlay
from graph_assets.live.update_log import UpdateLog
from graph_assets.stored.store import META_FILE, edge_features_file
from graph_assets.stored.writer import _stable_sort
from tests.store_versions import as_version_1, as_version_2


def apply(overlay: GraphOverlay, operations: list, seq: int) -> None:
    """The operations as the live graph applies them: decoded, then applied."""
    overlay.apply(decode_operations(operations, overlay.base), seq)


EDGE_FEATURES_FILE = edge_features_file(0)
Triple = tuple[int | str, int | str, tuple[float, ...]]

NODES = "id,f\n1,0\n2,1\n3,2\n4,3\n"
# Row 1 and 2 are parallel edges 1 -> 2 with different features, row 3 a self-loop.
EDGES = "src,dst,weight,kind\n1,2,0.5,1\n1,2,2.5,2\n3,3,7,0\n2,3,1,1\n4,2,-1,0\n"
INPUT_TRIPLES: list[Triple] = [
    (1, 2, (0.5, 1.0)),
    (1, 2, (2.5, 2.0)),
    (3, 3, (7.0, 0.0)),
    (2, 3, (1.0, 1.0)),
    (4, 2, (-1.0, 0.0)),
]


def write_graph(directory: Path, nodes: str = NODES, edges: str = EDGES) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "nodes.csv").write_text(nodes, encoding="utf-8")
    (directory / "edges.csv").write_text(edges, encoding="utf-8")
    return directory


def triples(store: GraphStore) -> list[Triple]:
    """Every stored edge as (src ID, dst ID, features), in CSC order: an edge's features are
    the row at its CSC position."""
    src, dst = store.edge_index()
    rows = store.edge_feature_rows(np.arange(store.num_edges))
    return [
        (s, d, tuple(float(v) for v in row))
        for s, d, row in zip(
            store.external_ids(src), store.external_ids(dst), rows.tolist(), strict=True
        )
    ]


def built(tmp_path: Path, edges: str = EDGES, **drops: bool) -> GraphStore:
    graph = write_graph(tmp_path / "graph", edges=edges)
    write_store(read_graph_dir(graph), tmp_path / "store", **drops)
    return open_store(tmp_path / "store")


# --- reading edge feature columns -----------------------------------------------------------


def test_every_column_after_src_and_dst_is_an_edge_feature(tmp_path: Path) -> None:
    raw = read_graph_dir(write_graph(tmp_path))
    assert raw.edge_feature_names == ["weight", "kind"]
    assert raw.edge_features.dtype == np.float32
    np.testing.assert_array_equal(raw.edge_features, [t[2] for t in INPUT_TRIPLES])


def test_edges_without_feature_columns_have_zero_width_features(tmp_path: Path) -> None:
    raw = read_graph_dir(write_graph(tmp_path, edges="src,dst\n1,2\n2,3\n"))
    assert raw.edge_features.shape == (2, 0) and raw.edge_feature_names == []


@pytest.mark.parametrize(
    ("edges", "expected"),
    [
        (
            "src,dst,weight\n1,2,0.5\n2,3,heavy\n",
            "edges.csv row 2: edge feature 'weight' is 'heavy', not a number; every edge "
            "feature must be a finite number",
        ),
        ("src,dst,w\n1,2,NaN\n", "edges.csv row 1: edge feature 'w' is NaN"),
        ("src,dst,w\n1,2,1\n2,3,-inf\n", "edges.csv row 2: edge feature 'w' is -inf"),
        ("src,dst,w\n1,2,1\n2,3,\n", "edges.csv row 2: edge feature 'w' is empty"),
        ("src,dst,w\n1,2,1e39\n", "edge feature 'w' is 1e+39, beyond float32's range"),
        # The earliest bad row is named, whichever column it is in.
        ("src,dst,a,b\n1,2,1,2\n2,3,1,x\n3,4,y,1\n", "edges.csv row 2: edge feature 'b' is 'x'"),
    ],
)
def test_bad_edge_feature_values_are_refused_naming_file_row_and_column(
    tmp_path: Path, edges: str, expected: str
) -> None:
    with pytest.raises(GraphInputError) as info:
        read_graph_dir(write_graph(tmp_path, edges=edges))
    assert expected in str(info.value)


def test_parquet_edge_features_are_read_and_checked(tmp_path: Path) -> None:
    pq.write_table(pa.table({"id": [1, 2, 3], "f": [0.0, 1.0, 2.0]}), tmp_path / "nodes.parquet")
    edges = pa.table({"src": [1, 1, 2], "dst": [2, 2, 3], "w": pa.array([1, 2, 3], pa.int32())})
    pq.write_table(edges, tmp_path / "edges.parquet")
    write_store(read_graph_dir(tmp_path), tmp_path / "store")
    store = open_store(tmp_path / "store")
    assert store.edge_feature_names == ["w"]
    assert Counter(triples(store)) == Counter([(1, 2, (1.0,)), (1, 2, (2.0,)), (2, 3, (3.0,))])

    bad = pa.table({"src": [1, 2], "dst": [2, 3], "w": [1.0, float("inf")]})
    pq.write_table(bad, tmp_path / "edges.parquet")
    with pytest.raises(GraphInputError, match=r"edges.parquet row 2: edge feature 'w' is inf"):
        read_graph_dir(tmp_path)
    text = pa.table({"src": [1, 2], "dst": [2, 3], "w": ["1", "two"]})
    pq.write_table(text, tmp_path / "edges.parquet")
    with pytest.raises(GraphInputError, match=r"row 2: edge feature 'w' is 'two', not a number"):
        read_graph_dir(tmp_path)


def test_raw_graph_refuses_edge_features_that_do_not_fit_its_edges() -> None:
    with pytest.raises(ValueError, match=r"edge_features must be float32 \[1, 1\]"):
        RawGraph(
            ids=np.array([1, 2]),
            src=np.array([0]),
            dst=np.array([1]),
            features=np.zeros((2, 1), np.float32),
            labels=np.array([-1, -1]),
            class_names=None,
            feature_names=["f"],
            edge_features=np.zeros((2, 1), np.float32),
            edge_feature_names=["w"],
        )


# --- the graph as given ---------------------------------------------------------------------


def test_edge_features_round_trip_in_csc_order(tmp_path: Path) -> None:
    store = built(tmp_path)
    assert (store.edge_feature_dim, store.edge_feature_names) == (2, ["weight", "kind"])
    assert store.edge_feature_dim == 2
    assert store.meta["edge_types"][0]["edge_feature_names"] == ["weight", "kind"]
    assert store.meta["format_version"] == 3
    assert isinstance(store.edge_features, np.memmap) and not store.edge_features.flags.writeable
    assert Counter(triples(store)) == Counter(INPUT_TRIPLES)
    # Grouped by destination (IDs 2, 3), ascending source, parallel edges in input order.
    assert triples(store) == [INPUT_TRIPLES[i] for i in (0, 1, 4, 3, 2)]


def test_parallel_edges_keep_their_own_features_and_self_loops_are_kept(tmp_path: Path) -> None:
    store = built(tmp_path)
    node = store.lookup([2])[0]
    start, end = int(store.indptr[node]), int(store.indptr[node + 1])
    assert store.external_ids(store.indices[start:end]) == [1, 1, 4]
    np.testing.assert_array_equal(
        store.edge_feature_rows(np.arange(start, end)), [[0.5, 1], [2.5, 2], [-1, 0]]
    )
    three = store.lookup([3])[0]
    assert int(three) in store.indices[store.indptr[three] : store.indptr[three + 1]].tolist()
    # Degrees count every stored edge: the parallel edge and the self-loop included; the
    # degree GCN normalises by (degree_rows) leaves self-loops out.
    nodes = store.lookup([1, 2, 3, 4])
    assert store.in_degree[nodes].tolist() == [0, 3, 2, 0]
    assert store.degree_rows(nodes).tolist() == [0, 3, 1, 0]
    assert store.out_degree[store.lookup([1, 3])].tolist() == [2, 1]
    assert store.meta["stats"] == {
        "input_edges": 5,
        "self_loops_dropped": 0,
        "duplicate_edges_dropped": 0,
        "self_loops_kept": 1,
        "duplicate_edges_kept": 1,
        "undirected": False,
    }


def test_the_drop_flags_restore_the_old_build(tmp_path: Path) -> None:
    store = built(tmp_path, drop_self_loops=True, drop_duplicate_edges=True)
    # Of the parallel edges the first in input order stays, with its features.
    assert Counter(triples(store)) == Counter([INPUT_TRIPLES[i] for i in (0, 3, 4)])
    assert store.degree_rows(store.lookup([1, 2, 3, 4])).tolist() == [0, 2, 1, 0]
    stats = store.meta["stats"]
    assert (stats["self_loops_dropped"], stats["duplicate_edges_dropped"]) == (1, 1)
    assert (stats["self_loops_kept"], stats["duplicate_edges_kept"]) == (0, 0)
    assert store.num_edges == stats["input_edges"] - 2

    only_loops = built(tmp_path / "loops", drop_self_loops=True)
    assert Counter(triples(only_loops)) == Counter([INPUT_TRIPLES[i] for i in (0, 1, 3, 4)])
    only_repeats = built(tmp_path / "repeats", drop_duplicate_edges=True)
    assert Counter(triples(only_repeats)) == Counter([INPUT_TRIPLES[i] for i in (0, 2, 3, 4)])


def test_a_repeated_self_loop_is_both_a_self_loop_and_a_duplicate(tmp_path: Path) -> None:
    edges = "src,dst,w\n3,3,1\n3,3,2\n"
    kept = built(tmp_path / "kept", edges=edges).meta["stats"]
    assert (kept["self_loops_kept"], kept["duplicate_edges_kept"]) == (2, 1)
    store = built(tmp_path / "first", edges=edges, drop_duplicate_edges=True)
    assert triples(store) == [(3, 3, (1.0,))]
    assert store.meta["stats"]["self_loops_kept"] == 1
    # Dropped as self-loops, they are not counted again as duplicates.
    dropped = built(tmp_path / "none", edges=edges, drop_self_loops=True).meta["stats"]
    assert (dropped["self_loops_dropped"], dropped["duplicate_edges_dropped"]) == (2, 0)


def test_undirected_adds_reverses_with_their_features_but_not_a_second_self_loop(
    tmp_path: Path,
) -> None:
    raw = read_graph_dir(write_graph(tmp_path / "graph"), undirected=True)
    write_store(raw, tmp_path / "store")
    store = open_store(tmp_path / "store")
    reverses = [(d, s, f) for s, d, f in INPUT_TRIPLES if s != d]
    assert Counter(triples(store)) == Counter(INPUT_TRIPLES + reverses)
    assert store.meta["stats"]["input_edges"] == 9 and store.meta["stats"]["self_loops_kept"] == 1


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data(), n=st.integers(min_value=1, max_value=8))
def test_random_edge_lists_keep_every_edge_with_its_features(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject, n: int
) -> None:
    ids = data.draw(st.lists(st.integers(-50, 50), min_size=n, max_size=n, unique=True))
    edges = data.draw(
        st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=30)
    )
    dim = data.draw(st.integers(0, 3))
    drop_self_loops, drop_duplicate_edges = data.draw(st.booleans()), data.draw(st.booleans())
    values = np.arange(len(edges) * dim, dtype=np.float32).reshape(len(edges), dim)
    raw = RawGraph(
        ids=np.array(ids, dtype=np.int64),
        src=np.array([s for s, _ in edges], dtype=np.int64),
        dst=np.array([d for _, d in edges], dtype=np.int64),
        features=np.zeros((n, 1), np.float32),
        labels=np.full(n, -1),
        class_names=None,
        feature_names=["f"],
        edge_features=values,
        edge_feature_names=[f"e{j}" for j in range(dim)],
    )
    out = tmp_path_factory.mktemp("edges") / "store"
    meta = write_store(
        raw, out, drop_self_loops=drop_self_loops, drop_duplicate_edges=drop_duplicate_edges
    )
    store = open_store(out)

    expected: list[Triple] = []
    seen: set[tuple[int, int]] = set()
    for k, (s, d) in enumerate(edges):
        if (drop_self_loops and s == d) or (drop_duplicate_edges and (s, d) in seen):
            continue
        seen.add((s, d))
        expected.append((ids[s], ids[d], tuple(float(v) for v in values[k])))
    stored = triples(store)
    assert Counter(stored) == Counter(expected)
    # CSC order: by destination, then source, ties in input order (a stable sort).
    assert stored == sorted(expected, key=lambda t: (t[1], t[0]))
    assert store.num_edges == meta["num_edges"] == len(expected)
    stats = meta["stats"]
    assert stats["input_edges"] - stats["self_loops_dropped"] - stats[
        "duplicate_edges_dropped"
    ] == (store.num_edges)
    external = store.external_ids(np.arange(store.num_nodes))
    in_degree = Counter(d for _, d, _ in expected)
    out_degree = Counter(s for s, _, _ in expected)
    assert store.in_degree.tolist() == [in_degree[i] for i in external]
    assert store.out_degree.tolist() == [out_degree[i] for i in external]


# --- reading edge features from the store ---------------------------------------------------


def test_edge_feature_rows_checks_its_ids(tmp_path: Path) -> None:
    store = built(tmp_path)
    assert store.edge_feature_rows(np.array([], dtype=np.int64)).shape == (0, 2)
    assert store.edge_feature_rows(np.array([])).shape == (0, 2)
    rows = store.edge_feature_rows(np.array([4, 0, 4]))
    assert rows.dtype == np.float32 and rows.shape == (3, 2) and rows.flags.writeable
    with pytest.raises(ValueError, match=r"CSC positions in \[0, 5\), got values from -1 to 0"):
        store.edge_feature_rows(np.array([-1, 0]))
    with pytest.raises(ValueError, match=r"got values from 5 to 5"):
        store.edge_feature_rows(np.array([5]))
    with pytest.raises(ValueError, match="1-D integer array, got dtype float64"):
        store.edge_feature_rows(np.array([1.0]))


def test_a_graph_without_edge_features_answers_zero_width_rows(tmp_path: Path) -> None:
    store = built(tmp_path, edges="src,dst\n1,2\n2,3\n")
    assert store.edge_feature_dim == 0 and store.edge_feature_names == []
    assert store.meta["files"][EDGE_FEATURES_FILE]["shape"] == [2, 0]
    assert store.edge_feature_rows(np.array([1, 0, 1])).shape == (3, 0)


def test_the_overlay_answers_base_and_added_edges_features(tmp_path: Path) -> None:
    store = built(tmp_path)
    overlay = GraphOverlay(store)
    apply(overlay, [{"type": "add_edge", "src": 4, "dst": 3, "attr": [8, 9.5]}], 1)
    assert overlay.edge_feature_dim == 2 and overlay.num_edge_ids == store.num_edges + 1
    np.testing.assert_array_equal(
        overlay.edge_feature_rows(np.array([2, 0])), store.edge_feature_rows(np.array([2, 0]))
    )
    three = int(overlay.lookup([3])[0])
    ids = overlay.in_list_edge_ids(three)
    assert ids.tolist() == [3, 4, store.num_edges]  # 2 -> 3, 3 -> 3 (stored), 4 -> 3 (added)
    assert overlay.edge_feature_rows(ids).tolist() == [[1, 1], [7, 0], [8, 9.5]]
    with pytest.raises(ValueError, match=r"in \[0, 6\), got values from 0 to 6"):
        overlay.edge_feature_rows(np.array([0, 6]))


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"edge_feature_dim": 3}, "edge_feature_names must be 3 distinct strings"),
        ({"edge_feature_dim": -1}, "edge_feature_dim must be an integer >= 0, found -1"),
        ({"edge_feature_names": ["w", "w"]}, "edge_feature_names must be 2 distinct strings"),
        ({"format_version": 4}, "format_version is 4, this gnnserve reads versions 1, 2, 3"),
        ({"format_version": 1}, "a format version 1 store has no edge features"),
    ],
)
def test_edge_feature_meta_is_checked(tmp_path: Path, changes: dict, expected: str) -> None:
    """A version 2 store's edge feature keys (version 3 records them per relation)."""
    store = built(tmp_path)
    as_version_2(store.path)
    meta = json.loads((store.path / META_FILE).read_text())
    meta.update(changes)
    (store.path / META_FILE).write_text(json.dumps(meta))
    with pytest.raises(StoreError, match=expected):
        open_store(store.path, verify_checksum=False)


def test_edge_features_are_in_the_size_shape_and_checksum_checks(tmp_path: Path) -> None:
    store = built(tmp_path)
    file = store.path / EDGE_FEATURES_FILE
    data = bytearray(file.read_bytes())
    data[-1] ^= 0x01
    file.write_bytes(bytes(data))
    with pytest.raises(StoreError, match=r"edge_features\.0\.npy has blake3"):
        open_store(store.path)
    np.save(file, np.zeros((5, 3), np.float32))
    meta = json.loads((store.path / META_FILE).read_text())
    meta["files"][EDGE_FEATURES_FILE].update(shape=[5, 3], bytes=file.stat().st_size)
    (store.path / META_FILE).write_text(json.dumps(meta))
    with pytest.raises(
        StoreError, match=r"holds <f4 \[5, 3\], format version 3 needs <f4 \[5, 2\]"
    ):
        open_store(store.path, verify_checksum=False)
    file.unlink()
    with pytest.raises(StoreError, match=r"edge_features\.0\.npy is missing"):
        open_store(store.path, verify_checksum=False)


# --- version 1 stores -----------------------------------------------------------------------


def test_a_format_version_1_store_still_opens_without_edge_features(tmp_path: Path) -> None:
    store = built(tmp_path, edges="src,dst\n1,2\n2,3\n3,1\n", drop_self_loops=True)
    checksum_v2 = store.checksum
    path = as_version_1(store.path)
    old = open_store(path)
    assert old.meta["format_version"] == 1 and old.checksum != checksum_v2
    assert (old.edge_feature_dim, old.edge_feature_names) == (0, [])
    assert old.edge_features.shape == (3, 0)
    assert old.edge_feature_rows(np.array([2, 0])).shape == (2, 0)
    assert old.degree_rows(old.lookup([1, 2, 3])).tolist() == [1, 1, 1]
    shared = open_store(share_store(path, tmp_path / "cache"))
    assert shared.checksum == old.checksum
    assert not (shared.path / "edge_features.npy").exists()


# --- compaction -----------------------------------------------------------------------------


def write_log(path: Path, requests: list[list[dict]]) -> Path:
    log = UpdateLog.open(path)
    for seq, operations in enumerate(requests, start=1):
        with log.exclusive():
            _, end = log.read_from(0, locked=True)
            log.append(operations, seq, at=end)
    log.close()
    return path


def test_compaction_carries_base_and_added_edges_features(tmp_path: Path) -> None:
    edges = EDGES + "2,4,3,3\n3,4,4,4\n"
    store = built(tmp_path, edges=edges)
    log = write_log(
        tmp_path / "updates.log",
        [
            [{"type": "add_edge", "src": 1, "dst": 3, "attr": [5, 6]}],
            [{"type": "remove_edge", "src": 2, "dst": 4}],
            [{"type": "add_edge", "src": 2, "dst": 4, "attr": [0.25, 1]}],  # removed, added again
            [{"type": "set_features", "id": 4, "x": [9.0]}],
            [{"type": "remove_edge", "src": 1, "dst": 2}],  # the newer parallel edge goes
            [{"type": "remove_edge", "src": 3, "dst": 3}],  # a stored self-loop can go
            [{"type": "add_edge", "src": 4, "dst": 4, "attr": [-2, 3]}],  # a self-loop added
            [{"type": "set_edge_features", "src": 2, "dst": 3, "attr": [1.5, 1.5]}],  # stored
            [{"type": "add_edge", "src": 1, "dst": 3, "attr": [7, 8]}],  # a parallel edge added
        ],
    )
    compact(replay(store.path, log), tmp_path / "compacted")
    compacted = open_store(tmp_path / "compacted")
    assert compacted.edge_feature_names == ["weight", "kind"]
    expected = [
        (1, 2, (0.5, 1.0)),
        (2, 3, (1.5, 1.5)),
        (4, 2, (-1.0, 0.0)),
        (3, 4, (4.0, 4.0)),
        (1, 3, (5.0, 6.0)),
        (1, 3, (7.0, 8.0)),
        (2, 4, (0.25, 1.0)),
        (4, 4, (-2.0, 3.0)),
    ]
    assert Counter(triples(compacted)) == Counter(expected)
    assert compacted.meta["stats"]["self_loops_kept"] == 1
    # Parallel edges keep their order: a remove_edge after compaction takes the same edge.
    assert [t for t in triples(compacted) if t[:2] == (1, 3)] == expected[4:6]


def test_compaction_keeps_parallel_edges_of_a_node_whose_in_edges_changed(tmp_path: Path) -> None:
    store = built(tmp_path)
    log = write_log(
        tmp_path / "updates.log",
        [
            [{"type": "add_edge", "src": 3, "dst": 2, "attr": [3, 3]}],
            [{"type": "remove_node", "id": 4}],
        ],
    )
    compact(replay(store.path, log), tmp_path / "compacted")
    compacted = open_store(tmp_path / "compacted")
    expected = [t for t in INPUT_TRIPLES if 4 not in (t[0], t[1])] + [(3, 2, (3.0, 3.0))]
    assert Counter(triples(compacted)) == Counter(expected)
    assert triples(compacted)[:3] == [(1, 2, (0.5, 1.0)), (1, 2, (2.5, 2.0)), (3, 2, (3.0, 3.0))]


def test_the_build_cli_says_what_it_kept_or_dropped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    graph = write_graph(tmp_path / "graph")
    assert main(["build", "--graph", str(graph), "--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert (
        "  kept 1 self-loops and 1 parallel edges "
        "(--drop-self-loops / --drop-duplicate-edges drop them)\n" in out
    )
    assert "edges 5 (of 5), features 1, edge features 2" in out
    args = ["build", "--graph", str(graph), "--out", str(tmp_path / "b"), "--drop-self-loops"]
    assert main(args) == 0
    assert (
        "  kept 1 parallel edges (--drop-duplicate-edges drops them), dropped 1 self-loops "
        "(--drop-self-loops)\n" in capsys.readouterr().out
    )
    assert main([*args, "--drop-duplicate-edges"]) == 0
    out = capsys.readouterr().out
    assert "  dropped 1 self-loops and 1 duplicate edges (--drop-self-loops / " in out
    assert open_store(tmp_path / "b").num_edges == 3


@pytest.mark.parametrize("limit", [50, 2**62])  # packed pairs, and the argsort beyond 64 bits
def test_the_writers_stable_sort_keeps_ties_in_input_order(limit: int) -> None:
    keys = np.random.default_rng(0).integers(0, 50, 1000)
    ordered, order = _stable_sort(keys.copy(), limit)
    np.testing.assert_array_equal(order, np.argsort(keys, kind="stable"))
    np.testing.assert_array_equal(ordered, np.sort(keys))
    assert ordered.dtype == order.dtype == np.int64
