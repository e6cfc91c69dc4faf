"""read_graph_dir: accepted inputs, and every rejection naming file, row and problem."""

import pickle
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graph_assets import GraphInputError, read_graph_dir
from graph_assets.input.reader import MAX_CLASSES

NODES = "id,f1,f2\n1,0.5,1\n2,1.5,2\n3,2.5,3\n"
EDGES = "src,dst\n1,2\n2,3\n"


def write_graph(directory: Path, nodes: str | None = NODES, edges: str | None = EDGES) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    if nodes is not None:
        (directory / "nodes.csv").write_text(nodes, encoding="utf-8")
    if edges is not None:
        (directory / "edges.csv").write_text(edges, encoding="utf-8")
    return directory


def read_error(directory: Path, nodes: str | None = NODES, edges: str | None = EDGES) -> str:
    with pytest.raises(GraphInputError) as info:
        read_graph_dir(write_graph(directory, nodes, edges))
    return str(info.value)


# --- accepted input -------------------------------------------------------------------------


def test_int_ids_features_and_edges(tmp_path: Path) -> None:
    raw = read_graph_dir(
        write_graph(tmp_path, "id,a,b\n10,1,2.5\n3,3,4\n7,5,6\n", "src,dst\n10,3\n7,10\n")
    )
    assert raw.id_kind == "int"
    assert raw.ids.dtype == np.int64
    assert raw.ids.tolist() == [10, 3, 7]
    assert raw.src.dtype == raw.dst.dtype == np.int64
    assert list(zip(raw.src.tolist(), raw.dst.tolist(), strict=True)) == [(0, 1), (2, 0)]
    assert raw.features.dtype == np.float32
    np.testing.assert_array_equal(raw.features, [[1, 2.5], [3, 4], [5, 6]])
    assert raw.feature_names == ["a", "b"]
    assert raw.labels.tolist() == [-1, -1, -1]
    assert raw.num_classes == 0
    assert raw.class_names is None


def test_string_ids_are_utf8_and_edges_match_them(tmp_path: Path) -> None:
    nodes = "id,f\nacct_9,1\né,2\n1,3\nNA,4\n"
    raw = read_graph_dir(write_graph(tmp_path, nodes, "src,dst\nacct_9,é\n1,NA\n"))
    assert raw.id_kind == "str"
    assert raw.ids.dtype.kind == "S"
    assert [i.decode("utf-8") for i in raw.ids] == ["acct_9", "é", "1", "NA"]
    assert list(zip(raw.src.tolist(), raw.dst.tolist(), strict=True)) == [(0, 1), (2, 3)]


def test_ids_beyond_int64_are_strings(tmp_path: Path) -> None:
    big = str(2**63)
    raw = read_graph_dir(write_graph(tmp_path, f"id,f\n{big},1\n5,2\n", f"src,dst\n5,{big}\n"))
    assert raw.id_kind == "str"
    assert raw.ids.tolist() == [big.encode(), b"5"]
    assert (raw.src.tolist(), raw.dst.tolist()) == ([1], [0])


def test_only_canonical_integers_make_int_ids(tmp_path: Path) -> None:
    # "007" and "7" are two different IDs (think zip codes), so the graph has string IDs.
    raw = read_graph_dir(
        write_graph(tmp_path / "a", "id,f\n007,1\n7,2\n-0,3\n", "src,dst\n7,007\n")
    )
    assert raw.ids.tolist() == [b"007", b"7", b"-0"]
    assert (raw.src.tolist(), raw.dst.tolist()) == ([1], [0])
    # On an int graph an endpoint is read the same way: "07" names no node.
    message = read_error(tmp_path / "b", "id,f\n7,1\n-3,2\n", "src,dst\n7,-3\n07,7\n")
    assert message.startswith("edges.csv row 2: src '07' is not a node id in nodes.csv")


def test_integer_labels_are_class_indices(tmp_path: Path) -> None:
    raw = read_graph_dir(write_graph(tmp_path / "a", "id,f,label\n1,0,2\n2,0,\n3,0,0\n", EDGES))
    assert raw.labels.tolist() == [2, -1, 0]
    assert raw.num_classes == 3
    assert raw.class_names is None
    # Zero-padded codes are names, read as written.
    raw = read_graph_dir(write_graph(tmp_path / "b", "id,f,label\n1,0,02\n2,0,1\n3,0,\n", EDGES))
    assert (raw.class_names, raw.labels.tolist()) == (["02", "1"], [0, 1, -1])


def test_label_names_become_sorted_classes(tmp_path: Path) -> None:
    raw = read_graph_dir(write_graph(tmp_path, "id,f,label\n1,0,fraud\n2,0,\n3,0,legit\n4,0,NA\n"))
    assert raw.class_names == ["NA", "fraud", "legit"]
    assert raw.labels.tolist() == [1, -1, 2, 0]
    assert raw.num_classes == 3


def test_undirected_adds_reverse_edges(tmp_path: Path) -> None:
    raw = read_graph_dir(write_graph(tmp_path), undirected=True)
    pairs = set(zip(raw.ids[raw.src].tolist(), raw.ids[raw.dst].tolist(), strict=True))
    assert pairs == {(1, 2), (2, 3), (2, 1), (3, 2)}
    assert raw.undirected


def test_header_only_edges_is_a_graph_without_edges(tmp_path: Path) -> None:
    raw = read_graph_dir(write_graph(tmp_path, NODES, "src,dst\n"))
    assert raw.src.size == raw.dst.size == 0


def test_parquet_reads_like_csv(tmp_path: Path) -> None:
    nodes = pd.DataFrame({"id": ["a", "b", "c"], "f": [1.0, 2.0, 3.0], "label": ["x", None, "y"]})
    edges = pd.DataFrame({"src": ["a", "b"], "dst": ["b", "c"]})
    write_graph(tmp_path / "csv", nodes.to_csv(index=False), edges.to_csv(index=False))
    (tmp_path / "pq").mkdir()
    nodes.to_parquet(tmp_path / "pq" / "nodes.parquet")
    edges.to_parquet(tmp_path / "pq" / "edges.parquet")
    from_csv, from_parquet = read_graph_dir(tmp_path / "csv"), read_graph_dir(tmp_path / "pq")
    for field in ("ids", "src", "dst", "features", "labels"):
        np.testing.assert_array_equal(getattr(from_csv, field), getattr(from_parquet, field))
    assert from_csv.class_names == from_parquet.class_names == ["x", "y"]


def test_parquet_integer_ids_and_labels(tmp_path: Path) -> None:
    pd.DataFrame({"id": [5, 9], "f": [1, 2], "label": [1, None]}).to_parquet(
        tmp_path / "nodes.parquet"
    )
    pd.DataFrame({"src": [9], "dst": [5]}).to_parquet(tmp_path / "edges.parquet")
    raw = read_graph_dir(tmp_path)
    assert raw.ids.tolist() == [5, 9]
    assert raw.labels.tolist() == [1, -1]
    assert (raw.src.tolist(), raw.dst.tolist()) == ([1], [0])


ID_TEXT = st.text(
    alphabet=st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")), min_size=1, max_size=8
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ids=st.lists(ID_TEXT, min_size=1, max_size=8, unique=True))
def test_any_printable_id_round_trips(
    tmp_path_factory: pytest.TempPathFactory, ids: list[str]
) -> None:
    directory = tmp_path_factory.mktemp("ids")
    table = pa.table({"id": ids, "f": [1.0] * len(ids)})
    pacsv.write_csv(table, directory / "nodes.csv")
    pacsv.write_csv(pa.table({"src": ids[-1:], "dst": ids[:1]}), directory / "edges.csv")
    raw = read_graph_dir(directory)
    if raw.id_kind == "int":
        assert raw.ids.tolist() == [int(i) for i in ids]
    else:
        assert [i.decode("utf-8") for i in raw.ids] == ids
    assert (raw.src.tolist(), raw.dst.tolist()) == ([len(ids) - 1], [0])


# --- rejected input: file, row and problem --------------------------------------------------


def test_the_documented_example_message(tmp_path: Path) -> None:
    rows = [f"{i},1,2,3,{'NaN' if i == 17 else 4}" for i in range(1, 21)]
    message = read_error(tmp_path, "id,f0,f1,f2,f3\n" + "\n".join(rows) + "\n", "src,dst\n")
    assert message == "nodes.csv row 17: feature 'f3' is NaN; every feature must be a finite number"


@pytest.mark.parametrize(
    ("nodes", "expected"),
    [
        ("id,f\n1,2\n,3\n", "nodes.csv row 2: id is empty; every node needs an id"),
        (
            "id,f\n1,2\n2,3\n1,4\n",
            "nodes.csv row 3: duplicate node id 1: rows 1 and 3 both have it",
        ),
        ("id,f\n7,2\n-0,3\n7,4\n", "nodes.csv row 3: duplicate node id '7': rows 1 and 3"),
        ("id,f\na,2\nb,3\na,4\n", "nodes.csv row 3: duplicate node id 'a': rows 1 and 3"),
        ('id,f\na,2\n"b\x00c",3\n', "nodes.csv row 2: id 'b\\x00c' contains a NUL byte"),
        (
            "id,f\n1,2\n2,abc\n",
            "nodes.csv row 2: feature 'f' is 'abc', not a number; every feature",
        ),
        ("id,f\n1,2\n2,\n", "nodes.csv row 2: feature 'f' is empty; every feature must be"),
        ("id,f\n1,inf\n", "nodes.csv row 1: feature 'f' is inf;"),
        ("id,f\n1,2\n2,-Infinity\n", "nodes.csv row 2: feature 'f' is -inf;"),
        ("id,f\n1,NA\n", "nodes.csv row 1: feature 'f' is 'NA', not a number"),
        ("id,f\n1,1e39\n", "nodes.csv row 1: feature 'f' is 1e+39, beyond float32's range"),
        ("id,f\n1,true\n", "nodes.csv row 1: feature 'f' is 'true', not a number"),
        # The earliest bad row wins, whichever column it is in.
        ("id,a,b\n1,1,1\n2,1,x\n3,y,1\n", "nodes.csv row 2: feature 'b' is 'x'"),
        ("id,f,label\n1,2,0\n2,3,-1\n", "nodes.csv row 2: label '-1' is not a class index"),
        (
            f"id,f,label\n1,2,{MAX_CLASSES}\n",
            f"nodes.csv row 1: label '{MAX_CLASSES}' is not a class",
        ),
        ("id,f,label\n1,2,99999999999999999999999\n", "nodes.csv row 1: label '9999"),
        ("id,f\n1,2\n2,3,4\n", "nodes.csv row 2: has 3 fields but the header has 2"),
        ("ident,f\n1,2\n", "nodes.csv: has no 'id' column (found ['ident', 'f'])"),
        (
            "id,label\n1,a\n",
            "nodes.csv: has no feature columns; expected `id`, one or more numeric",
        ),
        ("id,f,f\n1,2,3\n", "nodes.csv: column 'f' appears more than once"),
        ("id,f\n", "nodes.csv: has no rows; a graph needs at least one node"),
        ("", "nodes.csv: cannot read it as CSV (Empty CSV file); expected a header"),
    ],
)
def test_bad_nodes(tmp_path: Path, nodes: str, expected: str) -> None:
    assert read_error(tmp_path, nodes, "src,dst\n").startswith(expected)


@pytest.mark.parametrize(
    ("nodes", "edges", "expected"),
    [
        (
            NODES,
            "src,dst\n1,2\n2,4\n",
            "edges.csv row 2: dst '4' is not a node id in nodes.csv; "
            "every edge endpoint must be listed in nodes.csv",
        ),
        (NODES, "src,dst\n1,2\n2,3\n9,1\n", "edges.csv row 3: src '9' is not a node id"),
        (NODES, "src,dst\n1,2\nx,3\n", "edges.csv row 2: src 'x' is not a node id in nodes.csv"),
        (NODES, "src,dst\n1,\n", "edges.csv row 1: dst is empty; every edge needs both ends"),
        # Out-of-int64 text takes the text-matching path; row 1 must still match.
        (
            NODES,
            "src,dst\n1,2\n99999999999999999999,3\n",
            "edges.csv row 2: src '99999999999999999999' is not a node id",
        ),
        ("id,f\na,1\nb,2\n", "src,dst\na,b\nb,A\n", "edges.csv row 2: dst 'A' is not a node id"),
        (NODES, "from,to\n1,2\n", "edges.csv: has no 'src' column (found ['from', 'to'])"),
        (NODES, "src,to\n1,2\n", "edges.csv: has no 'dst' column"),
    ],
)
def test_bad_edges(tmp_path: Path, nodes: str, edges: str, expected: str) -> None:
    assert read_error(tmp_path, nodes, edges).startswith(expected)


def test_missing_files(tmp_path: Path) -> None:
    assert read_error(tmp_path / "a", nodes=None).startswith(
        f"nodes.csv: not found in {tmp_path / 'a'}; expected nodes.csv or nodes.parquet"
    )
    assert read_error(tmp_path / "b", edges=None).startswith("edges.csv: not found in")
    with pytest.raises(GraphInputError, match="not a directory"):
        read_graph_dir(tmp_path / "absent")


def test_csv_and_parquet_of_one_table_is_ambiguous(tmp_path: Path) -> None:
    write_graph(tmp_path)
    pd.DataFrame({"src": [1], "dst": [2]}).to_parquet(tmp_path / "edges.parquet")
    assert read_error(tmp_path).startswith("edges.csv: both edges.csv and edges.parquet exist in")


def test_parquet_specific_rejections(tmp_path: Path) -> None:
    pd.DataFrame({"src": [1], "dst": [2]}).to_parquet(tmp_path / "edges.parquet")
    pd.DataFrame({"id": [1.0, 2.0], "f": [1, 2]}).to_parquet(tmp_path / "nodes.parquet")
    with pytest.raises(GraphInputError, match=r"^nodes.parquet: column 'id' has type double"):
        read_graph_dir(tmp_path)
    pd.DataFrame({"id": ["1", None], "f": [1, 2]}).to_parquet(tmp_path / "nodes.parquet")
    with pytest.raises(GraphInputError, match=r"^nodes.parquet row 2: id is empty"):
        read_graph_dir(tmp_path)
    pd.DataFrame({"id": [1, 2], "f": [1.0, None]}).to_parquet(tmp_path / "nodes.parquet")
    with pytest.raises(GraphInputError, match=r"^nodes.parquet row 2: feature 'f' is empty"):
        read_graph_dir(tmp_path)
    (tmp_path / "nodes.parquet").write_bytes(b"not parquet")
    with pytest.raises(GraphInputError, match=r"^nodes.parquet: cannot read it as Parquet"):
        read_graph_dir(tmp_path)


def test_error_keeps_its_fields_and_pickles() -> None:
    error = GraphInputError("edges.csv", 4, "src 'x' is not a node id")
    assert (error.file, error.row, error.problem) == ("edges.csv", 4, "src 'x' is not a node id")
    assert isinstance(error, ValueError)
    copy = pickle.loads(pickle.dumps(error))
    assert (str(copy), copy.row) == ("edges.csv row 4: src 'x' is not a node id", 4)
    assert str(GraphInputError("nodes.csv", None, "missing")) == "nodes.csv: missing"
