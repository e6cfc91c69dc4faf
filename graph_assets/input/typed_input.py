"""Read a graph of typed nodes and relations into a validated `TypedGraph`, before
`write_store` renumbers it.

A graph given as one nodes file and one edges file (`RawGraph`) is the one-type case:
:func:`as_typed` names its type ``node`` and its relation ``node__to__node``; :func:`read_graph`
reads either layout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from graph_assets.errors import GraphInputError
from graph_assets.input.reader import (
    _edges,
    _labels,
    _node_ids,
    _NodeIds,
    _numbers,
    _read_table,
    _require_columns,
    _to_numpy_ids,
    read_graph_dir,
)
from graph_assets.schema import EdgeType, check_name
from graph_assets.tables import RawNodes, RawRelation, TypedGraph, as_typed

_TYPED_NODES_EXPECTED = "a header `id[,<numeric feature columns>][,label]` and one row per node"
_TYPED_EDGES_EXPECTED = (
    "a header `src,dst[,<numeric edge feature columns>]` and one row per directed edge"
)


NODES_DIR, EDGES_DIR = "nodes", "edges"


def read_graph(
    path: Path, undirected: bool = False, target_node_type: str | None = None
) -> TypedGraph:
    """Read a graph directory in either layout (docs/graph-format.md): ``nodes/<type>.csv``
    and ``edges/<src>__<relation>__<dst>.csv`` folders (CSV or Parquet), or one
    ``nodes.csv`` and one ``edges.csv``, the one-type case. Raises `GraphInputError` naming the
    file, the row and the problem."""
    path = Path(path)
    if (path / NODES_DIR).is_dir() or (path / EDGES_DIR).is_dir():
        return read_typed_graph_dir(path, undirected, target_node_type)
    graph = as_typed(read_graph_dir(path, undirected))
    if target_node_type not in (None, graph.target):
        raise GraphInputError(
            str(path),
            None,
            f"--target-node-type {target_node_type}: a graph given as nodes.csv and edges.csv "
            f"has one node type, {graph.target}",
        )
    return graph


def read_typed_graph_dir(
    path: Path, undirected: bool = False, target_node_type: str | None = None
) -> TypedGraph:
    """Read ``path/nodes/<type>.{csv,parquet}`` (``id``, feature columns, optional ``label``)
    and ``path/edges/<src>__<relation>__<dst>.{csv,parquet}`` (``src``, ``dst``, edge feature
    columns). Each type has its own IDs (int or string, as `read_graph_dir` decides them) and
    feature width (zero allowed). The target type is ``target_node_type``, else the one type
    with a ``label`` column. With ``undirected`` each relation between two types gets its
    reverse ``<dst>__rev_<relation>__<src>`` (PyG's ``ToUndirected``), and a relation within one
    type its reverse edges in the same relation, self-loops once."""
    nodes_dir, edges_dir = path / NODES_DIR, path / EDGES_DIR
    for folder in (nodes_dir, edges_dir):
        if not folder.is_dir():
            raise GraphInputError(
                str(folder),
                None,
                f"not a directory; a typed graph has {NODES_DIR}/ and "
                f"{EDGES_DIR}/ folders (docs/graph-format.md)",
            )
    node_files = _typed_files(nodes_dir, "node type")
    if not node_files:
        raise GraphInputError(f"{NODES_DIR}/", None, "holds no <type>.csv or <type>.parquet file")
    tables: dict[str, tuple[RawNodes, _NodeIds, pa.Table, str]] = {}
    for name, file in node_files.items():
        shown = f"{NODES_DIR}/{file.name}"
        table = _read_table(file, ("id", "label"), _TYPED_NODES_EXPECTED)
        _require_columns(table, ("id",), shown, _TYPED_NODES_EXPECTED)
        if table.num_rows == 0:
            raise GraphInputError(shown, None, "has no rows; a node type needs at least one node")
        ids = _node_ids(table["id"], shown)
        feature_names = [c for c in table.column_names if c not in ("id", "label")]
        features = _numbers(table, feature_names, shown, "feature")
        nodes = RawNodes(name, _to_numpy_ids(ids), features, feature_names)
        tables[name] = (nodes, ids, table, shown)
    target = _target(tables, target_node_type)
    target_nodes, _, target_table, target_file = tables[target]
    if not target_nodes.feature_dim:
        raise GraphInputError(
            target_file,
            None,
            f"has no feature columns, and {target} is the type the archive serves, which "
            "needs at least one: add a numeric column, or serve another type with "
            "--target-node-type",
        )
    labels, class_names = _labels(target_table, target_file)
    edge_files = _typed_files(edges_dir, "edge type")
    if not edge_files:
        raise GraphInputError(
            f"{EDGES_DIR}/",
            None,
            "holds no <src>__<relation>__<dst>.csv or .parquet file; a typed graph needs at "
            "least one relation",
        )
    relations = []
    for name, file in edge_files.items():
        shown = f"{EDGES_DIR}/{file.name}"
        edge_type = _edge_type(name, shown, tables)
        table = _read_table(file, ("src", "dst"), _TYPED_EDGES_EXPECTED)
        _require_columns(table, ("src", "dst"), shown, _TYPED_EDGES_EXPECTED)
        src, dst = _edges(table, tables[edge_type.src][1], tables[edge_type.dst][1], shown)
        names = [c for c in table.column_names if c not in ("src", "dst")]
        features = _numbers(table, names, shown, "edge feature")
        relations.append(RawRelation(edge_type, src, dst, features, names))
    if undirected:
        relations = _with_reverses(relations, edges_dir)
    return TypedGraph(
        node_types=tuple(entry[0] for entry in tables.values()),
        relations=tuple(relations),
        target=target,
        labels=labels,
        class_names=class_names,
        undirected=undirected,
    )


def _typed_files(folder: Path, what: str) -> dict[str, Path]:
    """``{name: file}`` of the folder's CSV and Parquet files, by sorted name; a name given
    as both, or one that cannot name a ``what``, is refused."""
    found: dict[str, Path] = {}
    for file in sorted(folder.iterdir()):
        if file.suffix not in (".csv", ".parquet") or not file.is_file():
            continue
        shown = f"{folder.name}/{file.name}"
        if file.stem in found:
            raise GraphInputError(
                shown, None, f"both {file.stem}.csv and {file.stem}.parquet exist; keep one"
            )
        if what == "node type":
            try:
                check_name(file.stem, what)
            except ValueError as error:
                raise GraphInputError(
                    shown, None, f"{error} (the file name names the type)"
                ) from None
        found[file.stem] = file
    return found


def _target(tables: dict[str, Any], target: str | None) -> str:
    """The given target type (which must exist), else the one type with labels."""
    names = sorted(tables)
    if target is not None:
        if target not in tables:
            raise GraphInputError(
                f"{NODES_DIR}/",
                None,
                f"--target-node-type {target}: no {NODES_DIR}/{target}.csv; the node types are "
                f"{', '.join(names)}",
            )
        return target
    labelled = [name for name in names if "label" in tables[name][2].column_names]
    if len(labelled) == 1:
        return labelled[0]
    if len(tables) == 1:
        return names[0]
    which = f"{', '.join(labelled)} have" if labelled else "no type has"
    raise GraphInputError(
        f"{NODES_DIR}/",
        None,
        f"{which} a label column; say which type the archive serves with --target-node-type "
        f"(one of {', '.join(names)})",
    )


def _edge_type(name: str, shown: str, tables: dict[str, Any]) -> EdgeType:
    """The file's edge type, whose two node types must have nodes files."""
    try:
        edge_type = EdgeType.parse(name)
    except ValueError as error:
        raise GraphInputError(shown, None, f"{error} (the file name names the edge type)") from None
    for end in (edge_type.src, edge_type.dst):
        if end not in tables:
            raise GraphInputError(
                shown,
                None,
                f"names node type {end!r}, which has no {NODES_DIR}/{end}.csv (the node types "
                f"are {', '.join(sorted(tables))})",
            )
    return edge_type


def _with_reverses(relations: list[RawRelation], edges_dir: Path) -> list[RawRelation]:
    """``relations`` with their reverses (:func:`read_typed_graph_dir`)."""
    names = {r.edge_type.name for r in relations}
    result = []
    for relation in relations:
        if relation.edge_type.src == relation.edge_type.dst:
            back = np.flatnonzero(relation.src != relation.dst)
            result.append(
                RawRelation(
                    relation.edge_type,
                    np.concatenate([relation.src, relation.dst[back]]),
                    np.concatenate([relation.dst, relation.src[back]]),
                    np.concatenate([relation.edge_features, relation.edge_features[back]]),
                    relation.edge_feature_names,
                )
            )
            continue
        reverse = relation.edge_type.reverse()
        if reverse.name in names:
            raise GraphInputError(
                f"{edges_dir.name}/{reverse.name}.csv",
                None,
                f"exists, and --undirected would add {reverse.name} as the reverse of "
                f"{relation.edge_type.name}; rename one or leave --undirected out",
            )
        result += [
            relation,
            RawRelation(
                reverse,
                relation.dst,
                relation.src,
                relation.edge_features,
                relation.edge_feature_names,
            ),
        ]
    return result
