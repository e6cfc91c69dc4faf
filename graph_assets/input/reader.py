"""Read a graph directory (nodes and edges, CSV or Parquet) into a validated `RawGraph`.

The input format is documented in docs/graph-format.md. Every check is a vectorised pyarrow/numpy
pass; Python only looks at single values to word the error for the first bad row, which names
the file, the row and the problem (`GraphInputError`).
"""

from __future__ import annotations

import contextlib
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from graph_assets.errors import GraphInputError
from graph_assets.tables import IdKind, RawGraph

# An integer written as str(int) writes it: "42", "-7", "0"; not "042", "+4" or "-0". Only such
# text is read as a number, so an ID like a zip code "02134" keeps its form (and is a string),
# and lookups of "42" on an int graph (GraphStore.lookup) use the same rule.
_INT_TEXT = r"^(0|-?[1-9][0-9]*)$"
_FLOAT32_MAX = float(np.finfo(np.float32).max)
# Schema metadata of a table read from CSV: its path, so that an error can quote a value's text.
_SOURCE = b"gnnserve.source"
# A class index this large is a mistake (an ID in the label column, say), and it would size the
# model's output layer; class names are the way to give sparse or non-index labels.
MAX_CLASSES = 100_000
_NODES_EXPECTED = "a header `id,<numeric feature columns>[,label]` and one row per node"
_EDGES_EXPECTED = (
    "a header `src,dst[,<numeric edge feature columns>]` and one row per directed edge"
)


@dataclass(frozen=True)
class _NodeIds:
    kind: IdKind
    values: pa.ChunkedArray  # int64 or string, unique, no nulls
    file: str


def read_graph_dir(path: Path, undirected: bool = False) -> RawGraph:
    """Read and validate ``path``/nodes.{csv,parquet} and ``path``/edges.{csv,parquet}.

    IDs are integers when every node ID is an integer in canonical form ("42", "-7", not "042")
    that fits int64, else strings; edge endpoints are read the same way (on an int graph, an
    endpoint "042" names no node). Every edges column after ``src`` and ``dst`` is an edge
    feature. With ``undirected`` the reverse of every edge is added, with the edge's features,
    after all given edges; a self-loop is its own reverse and is not added twice. Raises
    `GraphInputError` naming the file, the row and the problem.
    """
    path = Path(path)
    if not path.is_dir():
        raise GraphInputError(
            str(path), None, "not a directory; expected a folder holding nodes.csv and edges.csv"
        )
    nodes_file, edges_file = _find(path, "nodes"), _find(path, "edges")
    nodes = _read_table(nodes_file, ("id", "label"), _NODES_EXPECTED)
    edges = _read_table(edges_file, ("src", "dst"), _EDGES_EXPECTED)
    _require_columns(nodes, ("id",), nodes_file.name, _NODES_EXPECTED)
    _require_columns(edges, ("src", "dst"), edges_file.name, _EDGES_EXPECTED)
    if nodes.num_rows == 0:
        raise GraphInputError(nodes_file.name, None, "has no rows; a graph needs at least one node")
    node_ids = _node_ids(nodes["id"], nodes_file.name)
    feature_names = [c for c in nodes.column_names if c not in ("id", "label")]
    features = _features(nodes, feature_names, nodes_file.name)
    labels, class_names = _labels(nodes, nodes_file.name)
    src, dst = _edges(edges, node_ids, node_ids, edges_file.name)
    edge_feature_names = [c for c in edges.column_names if c not in ("src", "dst")]
    edge_features = _numbers(edges, edge_feature_names, edges_file.name, "edge feature")
    if undirected:
        reverse = np.flatnonzero(src != dst)
        src, dst = np.concatenate([src, dst[reverse]]), np.concatenate([dst, src[reverse]])
        edge_features = np.concatenate([edge_features, edge_features[reverse]])
    return RawGraph(
        ids=_to_numpy_ids(node_ids),
        src=src,
        dst=dst,
        features=features,
        labels=labels,
        class_names=class_names,
        feature_names=feature_names,
        edge_features=edge_features,
        edge_feature_names=edge_feature_names,
        undirected=undirected,
    )


def _find(directory: Path, stem: str) -> Path:
    csv, parquet = directory / f"{stem}.csv", directory / f"{stem}.parquet"
    if csv.exists() and parquet.exists():
        raise GraphInputError(
            csv.name,
            None,
            f"both {csv.name} and {parquet.name} exist in {directory}; keep one of them so "
            "it is clear which to read",
        )
    if csv.exists():
        return csv
    if parquet.exists():
        return parquet
    raise GraphInputError(
        csv.name, None, f"not found in {directory}; expected {csv.name} or {parquet.name}"
    )


def _read_table(file: Path, text_columns: tuple[str, ...], expected: str) -> pa.Table:
    """The file as an Arrow table; ``text_columns`` (IDs, labels) are read as text from CSV."""
    if file.suffix == ".parquet":
        try:
            return pq.read_table(file)
        except (pa.ArrowException, OSError) as exc:
            raise GraphInputError(
                file.name, None, f"cannot read it as Parquet ({exc}); expected {expected}"
            ) from exc
    # IDs and labels stay text ("007", "NA" and "" keep their meaning); in numeric columns
    # only an empty field is null, so a literal NaN reads as NaN and is reported as such.
    convert = pacsv.ConvertOptions(
        column_types=dict.fromkeys(text_columns, pa.string()),
        null_values=[""],
        strings_can_be_null=False,
    )
    try:
        table = pacsv.read_csv(file, convert_options=convert)
    except pa.ArrowInvalid as exc:
        raise _csv_error(file, convert, exc, expected) from exc
    return table.replace_schema_metadata({_SOURCE: str(file)})


def _csv_text(table: pa.Table, name: str, row: int) -> str | None:
    """Column ``name``'s text at ``row`` as the CSV file ``table`` was read from writes it
    (None for Parquet): a number too large for float64 was read as inf, its digits lost."""
    source = (table.schema.metadata or {}).get(_SOURCE)
    if source is None:
        return None
    convert = pacsv.ConvertOptions(
        include_columns=[name], column_types={name: pa.string()}, strings_can_be_null=False
    )
    return str(pacsv.read_csv(source.decode(), convert_options=convert)[name][row].as_py())


def _csv_error(
    file: Path, convert: pacsv.ConvertOptions, exc: pa.ArrowInvalid, expected: str
) -> GraphInputError:
    """Word a CSV parse failure, finding the row of a ragged line if there is one."""
    ragged: list[pacsv.InvalidRow] = []

    def remember(row: pacsv.InvalidRow) -> str:
        ragged.append(row)
        return "error"

    # Threaded parsing does not know line numbers; parse again serially to name the row.
    with contextlib.suppress(pa.ArrowInvalid):
        pacsv.read_csv(
            file,
            read_options=pacsv.ReadOptions(use_threads=False),
            parse_options=pacsv.ParseOptions(invalid_row_handler=remember),
            convert_options=convert,
        )
    if ragged and ragged[0].number is not None:
        row = ragged[0]
        return GraphInputError(
            file.name,
            row.number - 1,  # line 1 is the header
            f"has {row.actual_columns} fields but the header has {row.expected_columns}; "
            "every row needs one value per column",
        )
    return GraphInputError(file.name, None, f"cannot read it as CSV ({exc}); expected {expected}")


def _require_columns(table: pa.Table, names: tuple[str, ...], file: str, expected: str) -> None:
    for name in names:
        if name not in table.column_names:
            raise GraphInputError(
                file,
                None,
                f"has no {name!r} column (found {table.column_names}); expected {expected}",
            )
    duplicated = sorted({c for c in table.column_names if table.column_names.count(c) > 1})
    if duplicated:
        raise GraphInputError(
            file, None, f"column {duplicated[0]!r} appears more than once; names must be unique"
        )


def _plain(column: pa.ChunkedArray, file: str, name: str) -> pa.ChunkedArray:
    """``column`` as int64 or string: decodes dictionaries, rejects types IDs cannot have."""
    if pa.types.is_dictionary(column.type):
        column = pc.cast(column, column.type.value_type)
    if pa.types.is_integer(column.type):
        try:
            return pc.cast(column, pa.int64())
        except pa.ArrowInvalid:  # uint64 beyond int64: these IDs can only be text
            return pc.cast(column, pa.string())
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        return pc.cast(column, pa.string())
    raise GraphInputError(
        file, None, f"column {name!r} has type {column.type}; IDs must be integers or strings"
    )


def _first(mask: np.ndarray) -> int | None:
    """Index of the first True in ``mask``, or None."""
    hits = np.flatnonzero(mask)
    return int(hits[0]) if hits.size else None


def _bool_numpy(column: pa.ChunkedArray) -> np.ndarray:
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=bool)


def _node_ids(column: pa.ChunkedArray, file: str) -> _NodeIds:
    values = _plain(column, file, "id")
    empty = _bool_numpy(pc.is_null(values))
    if values.type == pa.string():
        empty |= _bool_numpy(pc.fill_null(pc.equal(values, ""), True))
    if (row := _first(empty)) is not None:
        raise GraphInputError(file, row + 1, "id is empty; every node needs an id")
    if values.type == pa.string():
        nul = _bool_numpy(pc.match_substring(values, "\0"))
        if (row := _first(nul)) is not None:
            raise GraphInputError(
                file,
                row + 1,
                f"id {values[row].as_py()!r} contains a NUL byte, which ids cannot hold",
            )
        as_ints = _parse_ints(values)
        if as_ints is not None:
            values = as_ints
    first_seen = pc.index_in(values, value_set=values).to_numpy(zero_copy_only=False)
    repeat = _first(first_seen != np.arange(len(values)))
    if repeat is not None:
        earlier = int(first_seen[repeat])
        raise GraphInputError(
            file,
            repeat + 1,
            f"duplicate node id {values[repeat].as_py()!r}: rows {earlier + 1} and {repeat + 1} "
            "both have it; every node id must be unique",
        )
    return _NodeIds(kind="int" if values.type == pa.int64() else "str", values=values, file=file)


def _parse_ints(text: pa.ChunkedArray) -> pa.ChunkedArray | None:
    """``text`` as int64 if every value is an integer in canonical form within int64, else None."""
    if not pc.all(pc.match_substring_regex(text, _INT_TEXT)).as_py():
        return None
    try:
        return pc.cast(text, pa.int64())
    except pa.ArrowInvalid:  # out of int64 range
        return None


def _positions(column: pa.ChunkedArray, nodes: _NodeIds, file: str, name: str) -> np.ndarray:
    """Position of each endpoint in the nodes file, -1 where it is not a node."""
    values = _plain(column, file, name)
    node_values = nodes.values
    if nodes.kind == "str":
        if values.type == pa.int64():
            values = pc.cast(values, pa.string())
    elif values.type == pa.string():
        as_ints = _parse_ints(values)
        if as_ints is None:
            # Some endpoint is no int64 in canonical form, so it is no node; match by text
            # (node IDs as str() writes them), which finds every other endpoint all the same.
            node_values = pc.cast(node_values, pa.string())
        else:
            values = as_ints
    found = pc.index_in(values, value_set=node_values)
    return np.asarray(pc.fill_null(found, -1).to_numpy(zero_copy_only=False), dtype=np.int64)


def _edges(
    edges: pa.Table, sources: _NodeIds, destinations: _NodeIds, file: str
) -> tuple[np.ndarray, np.ndarray]:
    """Positions of each edge's ``src`` among ``sources`` and ``dst`` among ``destinations``
    (one nodes file for both on a graph of one type); the first row naming an unknown or
    empty endpoint stops the read."""
    src = _positions(edges["src"], sources, file, "src")
    dst = _positions(edges["dst"], destinations, file, "dst")
    row = _first((src < 0) | (dst < 0))
    if row is not None:
        name, nodes = ("src", sources) if src[row] < 0 else ("dst", destinations)
        value = edges[name][row].as_py()
        if value is None or value == "":
            raise GraphInputError(file, row + 1, f"{name} is empty; every edge needs both ends")
        raise GraphInputError(
            file,
            row + 1,
            f"{name} {value!r} is not a node id in {nodes.file}; every edge endpoint must be "
            f"listed in {nodes.file}",
        )
    return src, dst


def _is_number(column: pa.ChunkedArray) -> bool:
    return bool(pa.types.is_integer(column.type) or pa.types.is_floating(column.type))


def _as_float64(column: pa.ChunkedArray, file: str, name: str, what: str) -> np.ndarray:
    """A feature column as float64, NaN where empty or not a number."""
    if _is_number(column):
        return np.asarray(pc.cast(column, pa.float64()).to_numpy(zero_copy_only=False))
    if pa.types.is_null(column.type):
        return np.full(len(column), np.nan)
    # Text, booleans, dates...: parse as numbers; what does not parse becomes NaN and is
    # reported with its text.
    parsed = pd.to_numeric(pd.Series(_text(column, file, name, what)), errors="coerce")
    return np.asarray(parsed, dtype=np.float64)


def _text(column: pa.ChunkedArray, file: str, name: str, what: str) -> np.ndarray:
    try:
        return np.asarray(pc.cast(column, pa.string()).to_numpy(zero_copy_only=False))
    except pa.ArrowNotImplementedError as exc:
        raise GraphInputError(
            file, None, f"{what} column {name!r} has type {column.type}; {what}s must be numbers"
        ) from exc
    except pa.ArrowInvalid as exc:  # bytes that are no UTF-8: find the first such row
        row, raw = next(
            (row, value)
            for row, value in enumerate(column.to_pylist())
            if isinstance(value, bytes) and not _is_utf8(value)
        )
        raise GraphInputError(
            file,
            row + 1,
            f"{what} {name!r} is {raw[:16]!r}, bytes that are not UTF-8 text; every {what} "
            "must be a finite number written in UTF-8",
        ) from exc


def _is_utf8(value: bytes) -> bool:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _features(nodes: pa.Table, names: list[str], file: str) -> np.ndarray:
    """Node features: at least one column, every value a finite float32."""
    if not names:
        raise GraphInputError(
            file,
            None,
            "has no feature columns; expected `id`, one or more numeric feature columns and "
            "optionally `label`",
        )
    return _numbers(nodes, names, file, "feature")


def _numbers(table: pa.Table, names: list[str], file: str, what: str) -> np.ndarray:
    """Columns ``names`` of ``table`` as float32 ``[rows, len(names)]``; the first row (in file
    order) holding a value that is no finite float32 is reported naming its column, as a
    ``what`` ("feature", "edge feature")."""
    features = np.empty((table.num_rows, len(names)), dtype=np.float32)
    first_bad: tuple[int, int] | None = None  # (row, column), the earliest row in the file
    for j, name in enumerate(names):
        values = _as_float64(table[name], file, name, what)
        row = _first(~(np.abs(values) <= _FLOAT32_MAX))  # also catches NaN
        if row is None:
            features[:, j] = values
        elif first_bad is None or row < first_bad[0]:
            first_bad = (row, j)
    if first_bad is not None:
        row, j = first_bad
        column = table[names[j]]
        value = _as_float64(column, file, names[j], what)[row]
        raw = (
            column[row].as_py() if _is_number(column) else _text(column, file, names[j], what)[row]
        )
        if math.isinf(value):
            raw = _csv_text(table, names[j], row) or raw
        raise GraphInputError(
            file,
            row + 1,
            f"{what} {names[j]!r} is {_describe(raw, value)}; every {what} must be a finite number",
        )
    return features


def _describe(raw: object, value: float) -> str:
    """Word a bad feature: its text when that is the problem, else what the number is."""
    if raw is None or raw == "":
        return "empty"
    if math.isnan(value):
        text = str(raw)
        return "NaN" if text.strip().lower().lstrip("+-") == "nan" else f"{text!r}, not a number"
    beyond = f"beyond float32's range of ±{_FLOAT32_MAX:.1e}"
    if math.isinf(value):
        text = str(raw).strip()
        if text.lower().lstrip("+-") in ("inf", "infinity"):
            return "inf" if value > 0 else "-inf"
        if re.fullmatch(r"[+-]?[0-9]+", text):
            return f"an integer of {len(text.lstrip('+-'))} digits, {beyond} (and int64's)"
        return f"{text[:24]!r}, {beyond}"
    return f"{value:g}, {beyond}"


def _labels(nodes: pa.Table, file: str) -> tuple[np.ndarray, list[str] | None]:
    """Class index per node (-1 unlabelled) and the class names when labels are names."""
    labels = np.full(nodes.num_rows, -1, dtype=np.int64)
    if "label" not in nodes.column_names:
        return labels, None
    column = nodes["label"]
    if pa.types.is_dictionary(column.type):
        column = pc.cast(column, column.type.value_type)
    if pa.types.is_floating(column.type):
        # A float label column is how pandas writes integer labels with some missing: its NaN
        # is a missing label, as null and an empty CSV field are, not a class named "nan".
        column = pc.if_else(pc.is_nan(column), pa.scalar(None, column.type), column)
    text = pc.fill_null(pc.cast(column, pa.string()), "")
    labelled = _bool_numpy(pc.not_equal(text, ""))
    given = text.filter(pa.array(labelled))
    if not pc.all(pc.match_substring_regex(given, _INT_TEXT)).as_py():
        names = sorted(pc.unique(given).to_pylist())
        labels[labelled] = pc.index_in(given, value_set=pa.array(names, pa.string())).to_numpy()
        return labels, names
    rows = np.flatnonzero(labelled)
    # Via float64 so that a literal beyond int64 is just "too large" rather than a crash.
    as_float = np.asarray(pc.cast(given, pa.float64()).to_numpy(zero_copy_only=False))
    if (bad := _first((as_float < 0) | (as_float >= MAX_CLASSES))) is not None:
        raise GraphInputError(
            file,
            int(rows[bad]) + 1,
            f"label {given[bad].as_py()!r} is not a class index in [0, {MAX_CLASSES}); "
            "integer labels are class indices 0..C-1 (use names for other labels, and leave "
            "the label empty for an unlabelled node)",
        )
    indices = as_float.astype(np.int64)
    labels[rows] = indices
    return labels, None


def _to_numpy_ids(nodes: _NodeIds) -> np.ndarray:
    if nodes.kind == "int":
        return np.asarray(nodes.values.to_numpy(), dtype=np.int64)
    encoded = pc.cast(nodes.values, pa.binary())
    width = max(1, pc.max(pc.binary_length(encoded)).as_py())
    return np.asarray(encoded.to_numpy(zero_copy_only=False), dtype=f"S{width}")
