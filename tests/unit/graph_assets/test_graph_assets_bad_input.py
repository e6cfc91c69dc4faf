"""The malformed-input matrix for Parquet (CSV's is in test_graph_assets_reader.py) and the edge
cases both formats share: every bad file fails with the file, the row and the reason; huge and
unicode IDs build as string IDs."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from graph_assets import GraphInputError, read_graph_dir
from graph_assets.__main__ import main

NODES = pa.table({"id": [1, 2, 3], "f": [0.5, 1.5, 2.5]})
EDGES = pa.table({"src": [1, 2], "dst": [2, 3]})
NO_EDGES = pa.table({"src": pa.array([], pa.int64()), "dst": pa.array([], pa.int64())})


def write(directory: Path, nodes: pa.Table | bytes, edges: pa.Table | bytes) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, table in (("nodes", nodes), ("edges", edges)):
        path = directory / f"{name}.parquet"
        if isinstance(table, bytes):
            path.write_bytes(table)
        else:
            pq.write_table(table, path)
    return directory


@pytest.mark.parametrize(
    ("nodes", "edges", "expected"),
    [
        (
            pa.table({"ident": [1, 2], "f": [1.0, 2.0]}),
            EDGES,
            "nodes.parquet: has no 'id' column (found ['ident', 'f'])",
        ),
        (NODES, pa.table({"from": [1], "dst": [2]}), "edges.parquet: has no 'src' column"),
        (NODES, pa.table({"src": [1], "to": [2]}), "edges.parquet: has no 'dst' column"),
        (pa.table({"id": [1, 2, 3]}), EDGES, "nodes.parquet: has no feature columns"),
        (
            pa.table({"id": [1, 2, 3], "f": pa.array([0.5, float("nan"), 1.0], from_pandas=False)}),
            EDGES,
            "nodes.parquet row 2: feature 'f' is NaN; every feature must be a finite number",
        ),
        (
            pa.table({"id": [1, 2, 3], "f": [0.5, 1.0, float("-inf")]}),
            EDGES,
            "nodes.parquet row 3: feature 'f' is -inf",
        ),
        (
            NODES,
            pa.table({"src": [1, 9], "dst": [2, 3]}),
            "edges.parquet row 2: src 9 is not a node id in nodes.parquet",
        ),
        (
            NODES,
            pa.table({"src": pa.array([1, None], pa.int64()), "dst": [2, 3]}),
            "edges.parquet row 2: src is empty; every edge needs both ends",
        ),
        (
            pa.table({"id": [1, 2, 1], "f": [0.5, 1.5, 2.5]}),
            EDGES,
            "nodes.parquet row 3: duplicate node id 1: rows 1 and 3 both have it",
        ),
        (
            pa.table({"id": pa.array([], pa.int64()), "f": pa.array([], pa.float64())}),
            NO_EDGES,
            "nodes.parquet: has no rows; a graph needs at least one node",
        ),
        (b"", EDGES, "nodes.parquet: cannot read it as Parquet"),
        (NODES, b"", "edges.parquet: cannot read it as Parquet"),
        (NODES, b"PAR1 not really", "edges.parquet: cannot read it as Parquet"),
        (
            pa.table({"id": [1, 2], "f": ["a", "b"]}),
            EDGES,
            "nodes.parquet row 1: feature 'f' is 'a', not a number",
        ),
        (
            pa.table({"id": [1, 2], "f": pa.array([[1.0], [2.0]])}),
            EDGES,
            "nodes.parquet: feature column 'f' has type list<element: double>",
        ),
    ],
    ids=[
        "no-id",
        "no-src",
        "no-dst",
        "no-features",
        "nan",
        "inf",
        "unknown-id",
        "null-endpoint",
        "duplicate-id",
        "no-rows",
        "empty-nodes-file",
        "empty-edges-file",
        "not-parquet",
        "text-feature",
        "nested-feature",
    ],
)
def test_bad_parquet(tmp_path: Path, nodes, edges, expected: str) -> None:
    with pytest.raises(GraphInputError) as info:
        read_graph_dir(write(tmp_path, nodes, edges))
    assert str(info.value).startswith(expected), str(info.value)


def test_parquet_ids_beyond_int64_are_strings(tmp_path: Path) -> None:
    huge = 2**64 - 1
    nodes = pa.table({"id": pa.array([huge, 5], pa.uint64()), "f": [1.0, 2.0]})
    edges = pa.table({"src": pa.array([5], pa.uint64()), "dst": pa.array([huge], pa.uint64())})
    raw = read_graph_dir(write(tmp_path, nodes, edges))
    assert raw.id_kind == "str"
    assert raw.ids.tolist() == [str(huge).encode(), b"5"]
    assert (raw.src.tolist(), raw.dst.tolist()) == ([1], [0])


def test_parquet_unicode_ids_build(tmp_path: Path) -> None:
    ids = ["zoë", "東京", "🚀", "e\u0301"]
    nodes = pa.table({"id": ids, "f": [1.0, 2.0, 3.0, 4.0]})
    edges = pa.table({"src": ["zoë", "🚀"], "dst": ["東京", "e\u0301"]})
    raw = read_graph_dir(write(tmp_path, nodes, edges))
    assert [i.decode("utf-8") for i in raw.ids] == ids
    assert (raw.src.tolist(), raw.dst.tolist()) == ([0, 2], [1, 3])


@pytest.mark.parametrize(
    ("nodes", "edges", "expected"),
    [
        ("id,f\n1,2\n2,3\n", "", "edges.csv: cannot read it as CSV (Empty CSV file)"),
        ("id,f\n1,2\n", "\n\n", "edges.csv: cannot read it as CSV"),
        ("id,f\n1,2\n", "src,src,dst\n1,1,1\n", "edges.csv: column 'src' appears more than once"),
    ],
    ids=["empty-edges-file", "blank-edges-file", "repeated-column"],
)
def test_more_bad_csv(tmp_path: Path, nodes: str, edges: str, expected: str) -> None:
    (tmp_path / "nodes.csv").write_text(nodes, encoding="utf-8")
    (tmp_path / "edges.csv").write_text(edges, encoding="utf-8")
    with pytest.raises(GraphInputError) as info:
        read_graph_dir(tmp_path)
    assert str(info.value).startswith(expected), str(info.value)


def test_csv_ids_below_int64_and_unicode_forms_are_distinct_strings(tmp_path: Path) -> None:
    """IDs compare as exact UTF-8 bytes: NFC "zoë" and NFD "zoë" are two nodes, as written."""
    low = str(-(2**63) - 1)
    nfc, nfd = "zo\u00eb", "zoe\u0308"
    nodes = f"id,f\n{low},1\n{nfc},2\n{nfd},3\n"
    (tmp_path / "nodes.csv").write_text(nodes, encoding="utf-8")
    (tmp_path / "edges.csv").write_text(f"src,dst\n{low},{nfd}\n", encoding="utf-8")
    raw = read_graph_dir(tmp_path)
    assert raw.id_kind == "str"
    assert [i.decode("utf-8") for i in raw.ids] == [low, nfc, nfd]
    assert (raw.src.tolist(), raw.dst.tolist()) == ([0], [2])


def typed_dir(root: Path, files: dict[str, bytes]) -> Path:
    """A graph directory of ``{relative path: content}`` (folders made as needed)."""
    for name, content in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(content)
    return root


USER = b"id,f,label\nu1,0.5,a\nu2,1.5,b\n"
BAD_UTF8 = b"\xff\xfe"


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        (
            {"nodes/user.csv": USER, "edges/.keep": b""},
            "edges/: holds no <src>__<relation>__<dst>.csv or .parquet file; a typed graph "
            "needs at least one relation",
        ),
        (
            {
                "nodes/user.csv": b"id,label\nu1,a\nu2,b\n",
                "edges/user__follows__user.csv": b"src,dst\nu1,u2\n",
            },
            "nodes/user.csv: has no feature columns, and user is the type the archive serves, "
            "which needs at least one: add a numeric column, or serve another type with "
            "--target-node-type",
        ),
        (
            {
                "nodes.csv": b"id,f0,label\n1,0.5,a\n2," + BAD_UTF8 + b",b\n",
                "edges.csv": b"src,dst\n1,2\n",
            },
            "nodes.csv row 2: feature 'f0' is b'\\xff\\xfe', bytes that are not UTF-8 text; "
            "every feature must be a finite number written in UTF-8",
        ),
        (
            {
                "nodes/user.csv": USER,
                "edges/user__pays__user.csv": b"src,dst,amount\nu1,u2,1\nu2,u1,9"
                + BAD_UTF8
                + b"\n",
            },
            "edges/user__pays__user.csv row 2: edge feature 'amount' is b'9\\xff\\xfe', bytes "
            "that are not UTF-8 text; every edge feature must be a finite number written in UTF-8",
        ),
        (
            {
                "nodes.csv": b"id,f0\n1,0.5\n2," + str(10**400).encode() + b"\n",
                "edges.csv": b"src,dst,w\n1,2,1\n",
            },
            "nodes.csv row 2: feature 'f0' is an integer of 401 digits, beyond float32's range "
            "of \u00b13.4e+38 (and int64's); every feature must be a finite number",
        ),
        (
            {"nodes.csv": b"id,f0\n1,0.5\n2,1\n", "edges.csv": b"src,dst,w\n1,2,-1e999\n"},
            "edges.csv row 1: edge feature 'w' is '-1e999', beyond float32's range of "
            "\u00b13.4e+38; every edge feature must be a finite number",
        ),
    ],
    ids=[
        "empty-edges-folder",
        "featureless-target",
        "utf8-one-type",
        "utf8-typed-edges",
        "huge-integer",
        "huge-float-text",
    ],
)  # fmt: skip
def test_build_refuses_in_one_line_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], files: dict[str, bytes], expected: str
) -> None:
    graph = typed_dir(tmp_path / "graph", files)
    out = tmp_path / "store"
    assert main(["build", "--graph", str(graph), "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"error: {expected}\n" and captured.out == ""
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["graph"]


def test_nan_in_a_parquet_float_label_column_is_unlabelled(tmp_path: Path) -> None:
    """pandas writes integer labels with some missing as floats with NaN: NaN is no class."""
    nodes = pa.table({"id": [1, 2, 3], "f": [0.5, 1.5, 2.5], "label": [0.0, float("nan"), 1.0]})
    raw = read_graph_dir(write(tmp_path, nodes, EDGES))
    assert raw.labels.tolist() == [0, -1, 1] and raw.class_names is None
    assert raw.num_classes == 2
