"""open_store / GraphStore: round trip, lookups, and refusal of every kind of bad store."""

import json
from pathlib import Path

import numpy as np
import pytest

from graph_assets import GraphStore, RawGraph, StoreError, open_store, write_store


def build(path: Path, ids: list[int] | list[str], edges: list[tuple[int, int]]) -> GraphStore:
    """A store over ``ids`` (edges as positions in ``ids``), labels i % 3, features [i, 2i]."""
    if isinstance(ids[0], str):
        id_array = np.array([str(i).encode("utf-8") for i in ids])
    else:
        id_array = np.array(ids, dtype=np.int64)
    n = len(ids)
    raw = RawGraph(
        ids=id_array,
        src=np.array([s for s, _ in edges], dtype=np.int64),
        dst=np.array([d for _, d in edges], dtype=np.int64),
        features=np.stack([np.arange(n), 2 * np.arange(n)], axis=1).astype(np.float32),
        labels=np.arange(n, dtype=np.int64) % 3,
        class_names=["a", "b", "c"],
        feature_names=["x", "y"],
    )
    write_store(raw, path)
    return open_store(path)


@pytest.fixture
def int_store(tmp_path: Path) -> GraphStore:
    # Sorted order: -7, 3, 42, 100 (positions 3, 1, 0, 2).
    return build(tmp_path / "int", [42, 3, 100, -7], [(0, 1), (1, 2), (3, 0), (2, 0)])


@pytest.fixture
def str_store(tmp_path: Path) -> GraphStore:
    return build(tmp_path / "str", ["acct_9", "7", "bob"], [(0, 1), (2, 1)])


def test_round_trip(int_store: GraphStore) -> None:
    assert (int_store.num_nodes, int_store.num_edges, int_store.feature_dim) == (4, 4, 2)
    assert (int_store.num_classes, int_store.class_names) == (3, ["a", "b", "c"])
    assert int_store.id_kind == "int"
    assert int_store.ids.tolist() == [-7, 3, 42, 100]
    # Raw position p has features [p, 2p] and label p % 3.
    assert int_store.features.tolist() == [[3, 6], [1, 2], [0, 0], [2, 4]]
    assert int_store.labels.tolist() == [0, 1, 0, 2]
    edge_index = int_store.edge_index()
    assert edge_index.dtype == np.int64 and edge_index.shape == (2, 4)
    pairs = {tuple(int_store.external_ids(e)) for e in edge_index.T}
    assert pairs == {(42, 3), (3, 100), (-7, 42), (100, 42)}
    assert int_store.in_degree.tolist() == [0, 1, 2, 1]
    assert int_store.out_degree.tolist() == [1, 1, 1, 1]
    assert len(int_store.checksum) == 64


def test_arrays_are_read_only_memory_maps(int_store: GraphStore) -> None:
    for array in (int_store.indptr, int_store.indices, int_store.features, int_store.ids):
        assert isinstance(array, np.memmap)
        assert not array.flags.writeable


def test_lookup_on_an_int_store(int_store: GraphStore) -> None:
    queries: list = [
        42,
        "42",
        -7,
        "-7",
        np.int64(100),
        5,
        "042",
        "-0",
        " 42",
        "x",
        True,
        False,
        2**70,
        1.0,
        None,
    ]
    expected = [2, 2, 0, 0, 3, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1]
    result = int_store.lookup(queries)
    assert result.dtype == np.int64
    assert result.tolist() == expected
    assert int_store.lookup([]).tolist() == []


def test_lookup_on_a_str_store(str_store: GraphStore) -> None:
    # Sorted: "7", "acct_9", "bob"; the ids array is S6.
    queries: list = [
        "acct_9",
        7,
        "7",
        "bob",
        "acct_99",
        "acct_9x",
        "",
        "a\x00",
        "\ud800",
        True,
        1.5,
    ]
    assert str_store.lookup(queries).tolist() == [1, 0, 0, 2, -1, -1, -1, -1, -1, -1, -1]


def test_external_ids_keep_the_input_type(int_store: GraphStore, str_store: GraphStore) -> None:
    assert int_store.external_ids(np.array([2, 0])) == [42, -7]
    assert all(type(i) is int for i in int_store.external_ids(np.arange(4)))
    assert str_store.external_ids(np.array([0, 1])) == ["7", "acct_9"]
    with pytest.raises(ValueError, match=r"internal indices must be in \[0, 4\)"):
        int_store.external_ids(np.array([-1]))


# --- refusals -------------------------------------------------------------------------------


def edit_meta(path: Path, **changes: object) -> None:
    meta = json.loads((path / "meta.json").read_text())
    for key, value in changes.items():
        target = meta
        *parents, last = key.split("__")
        for parent in parents:
            target = target[parent]
        target[last] = value
    (path / "meta.json").write_text(json.dumps(meta))


def rewrite_array(path: Path, name: str, array: np.ndarray) -> None:
    """Replace an array with one of the same dtype and shape (same byte size)."""
    old = np.load(path / name)
    assert array.dtype == old.dtype and array.shape == old.shape
    np.save(path / name, array)


@pytest.fixture
def store_path(int_store: GraphStore) -> Path:
    return int_store.path


def refusal(path: Path, verify_checksum: bool = True) -> str:
    with pytest.raises(StoreError) as info:
        open_store(path, verify_checksum=verify_checksum)
    return str(info.value)


def test_flipped_byte_fails_the_checksum(store_path: Path) -> None:
    features = store_path / "features.0.npy"
    data = bytearray(features.read_bytes())
    data[-1] ^= 0x01
    features.write_bytes(bytes(data))
    message = refusal(store_path)
    assert (
        "features.0.npy has blake3" in message and "the file is corrupt or was changed" in message
    )
    assert "python -m graph_assets build" in message
    open_store(store_path, verify_checksum=False)  # only the checksum catches a changed value


def test_a_store_recorded_without_blake3_is_checked_by_sha256(store_path: Path) -> None:
    """Stores written before meta.json recorded BLAKE3 digests open as before."""
    meta_path = store_path / "meta.json"
    meta = json.loads(meta_path.read_text())
    for entry in meta["files"].values():
        del entry["blake3"]
    meta_path.write_text(json.dumps(meta))
    open_store(store_path)
    features = store_path / "features.0.npy"
    data = bytearray(features.read_bytes())
    data[-1] ^= 0x01
    features.write_bytes(bytes(data))
    assert "features.0.npy has sha256" in refusal(store_path)


def test_truncated_file(store_path: Path) -> None:
    indices = store_path / "indices.npy"
    indices.write_bytes(indices.read_bytes()[:-4])
    assert "indices.npy is" in refusal(store_path, verify_checksum=False)
    assert "meta.json says" in refusal(store_path, verify_checksum=False)


def test_missing_file(store_path: Path) -> None:
    (store_path / "labels.npy").unlink()
    assert "labels.npy is missing" in refusal(store_path)


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        (
            {"files__features.0.npy__dtype": "<f8"},
            "features.0.npy holds <f4 [4, 2] (dtype, shape), meta.json says <f8 [4, 2]",
        ),
        (
            {"files__labels.npy__shape": [5]},
            "labels.npy holds <i8 [4] (dtype, shape), meta.json says <i8 [5]",
        ),
        (
            {"node_types": [{"name": "node", "num_nodes": 4, "feature_dim": 3, "id_kind": "int"}]},
            "features.0.npy holds <f4 [4, 2], format version 3 needs <f4 [4, 3]",
        ),
        ({"format_version": 0}, "format_version is 0, this gnnserve reads versions 1, 2, 3"),
        ({"format_version": True}, "format_version is True, this gnnserve reads versions 1"),
        (
            {"node_types": [{"name": "node", "num_nodes": 4, "feature_dim": 2, "id_kind": "u"}]},
            "id_kind must be 'int' or 'str', found 'u'",
        ),
        ({"target_node_type": "user"}, "the target node type 'user' is not one of ['node']"),
        ({"num_nodes": 0}, "num_nodes must be an integer >= 1, found 0"),
        ({"class_names": ["a"]}, "class_names must be null or 3 strings"),
        ({"files__ids.0.npy": None}, "files['ids.0.npy'] must hold dtype, shape, bytes and sha256"),
    ],
)
def test_meta_that_does_not_match(store_path: Path, changes: dict, expected: str) -> None:
    edit_meta(store_path, **changes)
    assert expected in refusal(store_path, verify_checksum=False)


def test_not_a_store(tmp_path: Path) -> None:
    assert "is not a graph store: expected meta.json there" in refusal(tmp_path)
    (tmp_path / "meta.json").write_text("{nope")
    assert "cannot read it as JSON" in refusal(tmp_path)


def test_file_with_another_dtype_than_the_format(store_path: Path) -> None:
    np.save(store_path / "labels.npy", np.zeros(4, dtype=np.int32))
    size = (store_path / "labels.npy").stat().st_size
    meta = json.loads((store_path / "meta.json").read_text())
    meta["files"]["labels.npy"].update(dtype="<i4", bytes=size)
    (store_path / "meta.json").write_text(json.dumps(meta))
    assert "labels.npy holds <i4 [4], format version 3 needs <i8 [4]" in refusal(
        store_path, verify_checksum=False
    )


@pytest.mark.parametrize(
    ("name", "values", "expected"),
    [
        (
            "indptr.npy",
            [0, 2, 1, 3, 4],
            "indptr must never decrease, found indptr[1]=2 > indptr[2]=1",
        ),
        ("indptr.npy", [1, 1, 2, 3, 4], "indptr must start at 0 and end at num_edges=4"),
        ("indptr.npy", [0, 0, 1, 3, 3], "indptr must start at 0 and end at num_edges=4"),
        ("indices.npy", [2, 9, 1, 2], "source indices must be in [0, 4), found values from 1 to 9"),
        ("labels.npy", [0, 1, 3, 2], "labels must be -1 (unlabelled) or in [0, 3)"),
        ("ids.0.npy", [-7, 42, 3, 100], "ids must be sorted ascending without duplicates"),
        ("in_degree.npy", [1, 0, 2, 1], "in_degree disagrees with indptr"),
        ("out_degree.npy", [2, 0, 1, 1], "out_degree disagrees with the edges"),
    ],
)
def test_structure_is_checked(
    store_path: Path, name: str, values: list[int], expected: str
) -> None:
    old = np.load(store_path / name)
    rewrite_array(store_path, name, np.array(values, dtype=old.dtype))
    message = refusal(store_path, verify_checksum=False)
    assert name in message and expected in message


def test_out_degrees_leave_self_loops_out_and_count_parallel_edges(tmp_path):
    """ChebConv's degrees: each node's out-edges, self-loops not counted, parallel ones each."""
    edges = [(0, 1), (0, 1), (0, 0), (1, 2), (2, 2), (3, 0)]
    store = build(tmp_path / "s", [10, 20, 30, 40], edges)
    assert store.out_degree.tolist() == [3, 1, 1, 1]  # every stored edge
    assert store.out_degree_rows(np.array([0, 1, 2, 3, 0])).tolist() == [2, 1, 0, 1, 2]
    assert store.degree_rows(np.arange(4)).tolist() == [1, 2, 1, 0]  # in-degrees, as before
    assert store.largest_out_degree() == 2
