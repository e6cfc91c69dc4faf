"""Datasets of small labelled graphs (graph classification): input tables, a store, synthetic sets.

Input (``docs/graph-format.md``): one directory with three tables, CSV or Parquet, every row
naming its graph by ``graph_id``:

| file | columns |
|---|---|
| ``graphs.csv`` | ``graph_id``, ``label`` (class index or name; empty = unlabelled) |
| ``nodes.csv`` | ``graph_id``, ``node_id``, then one numeric column per feature |
| ``edges.csv`` | ``graph_id``, ``src``, ``dst`` (``node_id`` s of that graph), then one numeric
column per edge feature |

IDs are compared as text and are local to their graph (node ``0`` of two graphs are two
nodes). A graph's nodes are numbered in file order; that order is the row order of ``x`` a
client sends. The graph is kept as given, self-loops and parallel edges included (each with its
own edge features), unless the build is asked to drop them, as for node graphs.

The store (``python -m graph_assets graphs --dataset DIR --out DSET``) is one directory of
``.npy`` arrays, no pickle: ``x`` ``[total_nodes, F]`` float32, ``node_ptr`` ``[G+1]`` (graph
``g`` owns rows ``node_ptr[g]:node_ptr[g+1]``), ``edge_index`` ``[2, total_edges]`` of
graph-local node numbers, ``edge_ptr`` ``[G+1]``, ``edge_attr`` ``[total_edges, D]`` float32
(``D`` = 0 without edge features), ``labels`` ``[G]`` int64 (-1 unlabelled), and ``meta.json``
(``edge_feature_dim``, ``edge_feature_names``). A store written before edge features (no
``edge_attr.npy``) opens with ``D`` = 0.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from graph_assets.errors import GraphInputError, StoreError
from graph_assets.input.reader import (
    _features,
    _find,
    _labels,
    _numbers,
    _read_table,
    _require_columns,
)
from graph_assets.stored.store import file_digests, open_recorded_array
from graph_assets.tables import check_edge_features

FORMAT_VERSION = 1
META_FILE = "meta.json"
ARRAY_FILES = ("edge_index.npy", "edge_ptr.npy", "labels.npy", "node_ptr.npy", "x.npy")
EDGE_ATTR_FILE = "edge_attr.npy"  # not in ARRAY_FILES: older stores have none
_GRAPHS_EXPECTED = "a header `graph_id,label` and one row per graph"
_NODES_EXPECTED = "a header `graph_id,node_id,<numeric feature columns>` and one row per node"
_EDGES_EXPECTED = (
    "a header `graph_id,src,dst[,<numeric edge feature columns>]` and one row per directed edge"
)

# Synthetic graph families, in class order; each is drawn at a random size.
MOTIFS = ("cycle", "star", "wheel", "ladder", "tree", "dense")
DEFAULT_SYNTHETIC_CLASSES = 4
DEFAULT_SYNTHETIC_FEATURES = 8


@dataclass(frozen=True, eq=False)
class GraphDataset:
    """Small graphs packed into flat arrays (see the module docstring for the layout).

    ``edge_attr`` is ``[total_edges, D]`` float32, row ``k`` the features of edge ``k``;
    ``edge_feature_names`` its ``D`` column names (both empty without edge features).
    """

    x: np.ndarray
    node_ptr: np.ndarray
    edge_index: np.ndarray
    edge_ptr: np.ndarray
    labels: np.ndarray
    class_names: list[str] | None
    stats: dict[str, int] | None = None
    edge_attr: np.ndarray | None = None  # None: no edge features, [total_edges, 0]
    edge_feature_names: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.edge_attr is None:
            empty = np.zeros((self.edge_index.shape[1], 0), dtype=np.float32)
            object.__setattr__(self, "edge_attr", empty)
        check_edge_features(
            "edge_attr",
            self.edge_features,
            self.edge_index.shape[1],
            len(self.edge_feature_names),
        )

    @property
    def edge_features(self) -> np.ndarray:
        """``edge_attr``, never None (``[total_edges, 0]`` without edge features)."""
        assert self.edge_attr is not None  # set by __post_init__
        return self.edge_attr

    @property
    def edge_feature_dim(self) -> int:
        return len(self.edge_feature_names)

    @property
    def num_graphs(self) -> int:
        return int(self.labels.shape[0])

    @property
    def feature_dim(self) -> int:
        return int(self.x.shape[1])

    @property
    def num_classes(self) -> int:
        if self.class_names is not None:
            return len(self.class_names)
        return int(self.labels.max()) + 1 if self.labels.size else 0

    def graph(self, g: int) -> tuple[np.ndarray, np.ndarray]:
        """``(x [n, F], edge_index [2, e])`` of graph ``g``, edges in local node numbers."""
        nodes = slice(int(self.node_ptr[g]), int(self.node_ptr[g + 1]))
        edges = slice(int(self.edge_ptr[g]), int(self.edge_ptr[g + 1]))
        return np.asarray(self.x[nodes]), np.asarray(self.edge_index[:, edges])

    def graph_edge_attr(self, g: int) -> np.ndarray:
        """``[e, D]`` edge features of graph ``g``, in the order of its ``edge_index``."""
        return np.asarray(self.edge_features[int(self.edge_ptr[g]) : int(self.edge_ptr[g + 1])])

    def graphs(self) -> Iterator[tuple[np.ndarray, np.ndarray, int]]:
        """Every graph as ``(x, edge_index, label)``."""
        for g in range(self.num_graphs):
            x, edge_index = self.graph(g)
            yield x, edge_index, int(self.labels[g])


def _text_column(table: pa.Table, name: str, file: str) -> np.ndarray:
    column = pc.cast(table[name], pa.string())
    values = np.asarray(pc.fill_null(column, "").to_numpy(zero_copy_only=False), dtype=object)
    empty = np.flatnonzero(values == "")
    if empty.size:
        raise GraphInputError(file, int(empty[0]) + 1, f"{name} is empty; every row needs one")
    return values


def read_graph_dataset(
    path: Path,
    undirected: bool = False,
    *,
    drop_self_loops: bool = False,
    drop_duplicate_edges: bool = False,
) -> GraphDataset:
    """Reads and validates a dataset directory; raises `GraphInputError` naming file and row.

    Every edges column after ``graph_id``, ``src`` and ``dst`` is an edge feature. The graphs
    are kept as given unless ``drop_self_loops`` / ``drop_duplicate_edges`` (both default
    False) drop self-loops / every repeat of a (graph, src, dst) but its first.
    """
    path = Path(path)
    if not path.is_dir():
        raise GraphInputError(
            str(path), None, "not a directory; expected a folder with graphs, nodes and edges"
        )
    graphs_file, nodes_file, edges_file = (_find(path, s) for s in ("graphs", "nodes", "edges"))
    graphs = _read_table(graphs_file, ("graph_id", "label"), _GRAPHS_EXPECTED)
    nodes = _read_table(nodes_file, ("graph_id", "node_id"), _NODES_EXPECTED)
    edges = _read_table(edges_file, ("graph_id", "src", "dst"), _EDGES_EXPECTED)
    _require_columns(graphs, ("graph_id", "label"), graphs_file.name, _GRAPHS_EXPECTED)
    _require_columns(nodes, ("graph_id", "node_id"), nodes_file.name, _NODES_EXPECTED)
    _require_columns(edges, ("graph_id", "src", "dst"), edges_file.name, _EDGES_EXPECTED)
    if graphs.num_rows == 0:
        raise GraphInputError(graphs_file.name, None, "has no rows; a dataset needs a graph")

    graph_ids = _text_column(graphs, "graph_id", graphs_file.name)
    graph_index, first = np.unique(graph_ids, return_index=True)
    if graph_index.size != graph_ids.size:
        row = int(np.setdiff1d(np.arange(graph_ids.size), first)[0])
        raise GraphInputError(
            graphs_file.name, row + 1, f"graph_id {graph_ids[row]!r} appears more than once"
        )
    # Graphs are numbered in file order; sorted ids are only for lookups.
    order_of_sorted = first
    labels, class_names = _labels(graphs, graphs_file.name)

    def graph_of(ids: np.ndarray, file: str) -> np.ndarray:
        pos = np.searchsorted(graph_index, ids)
        found = (pos < graph_index.size) & (
            graph_index[np.minimum(pos, graph_index.size - 1)] == ids
        )
        if not found.all():
            row = int(np.flatnonzero(~found)[0])
            raise GraphInputError(
                file, row + 1, f"graph_id {ids[row]!r} is not in {graphs_file.name}"
            )
        return order_of_sorted[pos]

    node_graph = graph_of(_text_column(nodes, "graph_id", nodes_file.name), nodes_file.name)
    node_ids = _text_column(nodes, "node_id", nodes_file.name)
    feature_names = [c for c in nodes.column_names if c not in ("graph_id", "node_id")]
    features = _features(nodes, feature_names, nodes_file.name)
    order = np.argsort(node_graph, kind="stable")  # file order within each graph
    counts = np.bincount(node_graph, minlength=graph_ids.size)
    if (empty := np.flatnonzero(counts == 0)).size:
        raise GraphInputError(
            graphs_file.name,
            int(empty[0]) + 1,
            f"graph {graph_ids[empty[0]]!r} has no rows in {nodes_file.name}; a graph needs nodes",
        )
    node_ptr = np.zeros(graph_ids.size + 1, dtype=np.int64)
    np.cumsum(counts, out=node_ptr[1:])
    # Global row of each node after sorting, and its number within its graph.
    row_of_input = np.empty(order.size, dtype=np.int64)
    row_of_input[order] = np.arange(order.size)
    keys = np.array(
        [f"{g}\x00{n}" for g, n in zip(node_graph, node_ids, strict=True)], dtype=object
    )
    key_index, key_first = np.unique(keys, return_index=True)
    if key_index.size != keys.size:
        row = int(np.setdiff1d(np.arange(keys.size), key_first)[0])
        raise GraphInputError(
            nodes_file.name,
            row + 1,
            f"node_id {node_ids[row]!r} appears twice in graph {graph_ids[node_graph[row]]!r}",
        )

    edge_graph = graph_of(_text_column(edges, "graph_id", edges_file.name), edges_file.name)
    endpoints = []
    for name in ("src", "dst"):
        ends = _text_column(edges, name, edges_file.name)
        wanted = np.array(
            [f"{g}\x00{n}" for g, n in zip(edge_graph, ends, strict=True)], dtype=object
        )
        pos = np.searchsorted(key_index, wanted) if wanted.size else np.zeros(0, dtype=np.int64)
        found = (pos < key_index.size) & (key_index[np.minimum(pos, key_index.size - 1)] == wanted)
        if not found.all():
            row = int(np.flatnonzero(~found)[0])
            raise GraphInputError(
                edges_file.name,
                row + 1,
                f"{name} {ends[row]!r} is not a node of graph {graph_ids[edge_graph[row]]!r} "
                f"in {nodes_file.name}",
            )
        global_row = row_of_input[key_first[pos]]
        endpoints.append(global_row - node_ptr[edge_graph])
    src, dst = endpoints
    edge_feature_names = [c for c in edges.column_names if c not in ("graph_id", "src", "dst")]
    edge_attr = _numbers(edges, edge_feature_names, edges_file.name, "edge feature")
    if undirected:  # a self-loop is its own reverse, as for node graphs
        reverse = np.flatnonzero(src != dst)
        src, dst, edge_graph = (
            np.concatenate([src, dst[reverse]]),
            np.concatenate([dst, src[reverse]]),
            np.concatenate([edge_graph, edge_graph[reverse]]),
        )
        edge_attr = np.concatenate([edge_attr, edge_attr[reverse]])
    return _pack(
        features[order],
        node_ptr,
        _Edges(edge_graph, src, dst, edge_attr, edge_feature_names),
        labels,
        class_names,
        drop_self_loops=drop_self_loops,
        drop_duplicate_edges=drop_duplicate_edges,
    )


@dataclass(frozen=True)
class _Edges:
    """Edges of every graph in input order: graph, graph-local src and dst, features."""

    graph: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    attr: np.ndarray  # [E, D] float32
    names: list[str]


def _pack(
    x: np.ndarray,
    node_ptr: np.ndarray,
    edges: _Edges,
    labels: np.ndarray,
    class_names: list[str] | None,
    *,
    drop_self_loops: bool,
    drop_duplicate_edges: bool,
) -> GraphDataset:
    """Sorts edges by (graph, dst, src), parallel edges in input order (their features follow
    them), dropping self-loops and repeats if asked."""
    num_graphs = labels.size
    given = edges.src.size
    largest = int(np.diff(node_ptr).max())
    key = (edges.graph.astype(np.int64) * largest + edges.dst) * largest + edges.src
    loops = edges.src == edges.dst
    kept = np.flatnonzero(~loops) if drop_self_loops else np.arange(given)
    kept = kept[np.argsort(key[kept], kind="stable")]
    repeat = np.zeros(kept.size, dtype=bool)
    np.equal(key[kept][1:], key[kept][:-1], out=repeat[1:])
    if drop_duplicate_edges:
        kept = kept[~repeat]
    edge_ptr = np.zeros(num_graphs + 1, dtype=np.int64)
    np.cumsum(np.bincount(edges.graph[kept], minlength=num_graphs), out=edge_ptr[1:])
    loop_count, repeat_count = int(loops.sum()), int(repeat.sum())
    return GraphDataset(
        x=np.ascontiguousarray(x, dtype=np.float32),
        node_ptr=node_ptr.astype(np.int64),
        edge_index=np.stack([edges.src[kept], edges.dst[kept]]).astype(np.int64),
        edge_ptr=edge_ptr,
        labels=labels.astype(np.int64),
        class_names=class_names,
        stats={
            "input_edges": int(given),
            "self_loops_dropped": loop_count if drop_self_loops else 0,
            "duplicate_edges_dropped": repeat_count if drop_duplicate_edges else 0,
            "self_loops_kept": 0 if drop_self_loops else loop_count,
            "duplicate_edges_kept": 0 if drop_duplicate_edges else repeat_count,
        },
        edge_attr=np.ascontiguousarray(edges.attr[kept], dtype=np.float32),
        edge_feature_names=list(edges.names),
    )


def write_graph_dataset(dataset: GraphDataset, out_dir: Path) -> dict[str, Any]:
    """Writes the store; returns its meta.json content (the checksum names the dataset)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    arrays = {
        "x.npy": dataset.x,
        "node_ptr.npy": dataset.node_ptr,
        "edge_index.npy": dataset.edge_index,
        "edge_ptr.npy": dataset.edge_ptr,
        "labels.npy": dataset.labels,
    }
    files: dict[str, dict[str, Any]] = {}
    for name in ARRAY_FILES:
        files[name] = _save(out / name, arrays[name])
    files[EDGE_ATTR_FILE] = _save(out / EDGE_ATTR_FILE, dataset.edge_features)
    # Edge features join the checksum only where there are some, so a dataset without them
    # keeps the checksum it had before they were stored.
    named = [*ARRAY_FILES, EDGE_ATTR_FILE] if dataset.edge_feature_dim else list(ARRAY_FILES)
    checksum = hashlib.sha256("".join(files[n]["sha256"] for n in named).encode()).hexdigest()
    meta = {
        "format_version": FORMAT_VERSION,
        "kind": "graph_dataset",
        "num_graphs": dataset.num_graphs,
        "num_nodes": int(dataset.x.shape[0]),
        "num_edges": int(dataset.edge_index.shape[1]),
        "feature_dim": dataset.feature_dim,
        "edge_feature_dim": dataset.edge_feature_dim,
        "edge_feature_names": dataset.edge_feature_names,
        "num_classes": dataset.num_classes,
        "class_names": dataset.class_names,
        "checksum": checksum,
        "files": files,
        "stats": dataset.stats or {},
    }
    (out / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def _save(path: Path, array: np.ndarray) -> dict[str, Any]:
    """Writes one ``.npy`` (no pickle); returns its record for ``meta.json``."""
    np.save(path, array, allow_pickle=False)
    return {"dtype": array.dtype.str, "shape": list(array.shape), **file_digests(path)}


def open_graph_dataset(path: Path) -> GraphDataset:
    """Loads a store written by `write_graph_dataset` (memory-mapped, no pickle)."""
    path = Path(path)
    meta_path = path / META_FILE
    if not meta_path.is_file():
        raise StoreError(
            f"{path} is not a graph dataset store: no {META_FILE}; build one with "
            "`python -m graph_assets graphs --dataset DIR --out DSET`"
        )
    meta = json.loads(meta_path.read_text())
    if meta.get("kind") != "graph_dataset" or meta.get("format_version") != FORMAT_VERSION:
        raise StoreError(f"{meta_path}: not a graph dataset of format version {FORMAT_VERSION}")
    rebuild = "rebuild the dataset with `python -m graph_assets graphs --dataset DIR --out DSET`"
    arrays = {
        name: open_recorded_array(path / name, meta["files"][name], rebuild) for name in ARRAY_FILES
    }
    edge_attr = None  # a store from before edge features: none
    if (recorded := meta["files"].get(EDGE_ATTR_FILE)) is not None:
        edge_attr = open_recorded_array(path / EDGE_ATTR_FILE, recorded, rebuild)
    return GraphDataset(
        x=arrays["x.npy"],
        node_ptr=arrays["node_ptr.npy"],
        edge_index=arrays["edge_index.npy"],
        edge_ptr=arrays["edge_ptr.npy"],
        labels=arrays["labels.npy"],
        class_names=meta["class_names"],
        stats=meta.get("stats"),
        edge_attr=edge_attr,
        edge_feature_names=list(meta.get("edge_feature_names", [])),
    )


def _motif_edges(motif: str, n: int, rng: np.random.Generator) -> list[tuple[int, int]]:
    """Undirected edges (each once) of one graph of the family ``motif`` with ``n`` nodes."""
    if motif == "cycle":
        return [(i, (i + 1) % n) for i in range(n)]
    if motif == "star":
        return [(0, i) for i in range(1, n)]
    if motif == "wheel":
        rim = n - 1
        return [(0, i) for i in range(1, n)] + [(1 + i, 1 + (i + 1) % rim) for i in range(rim)]
    if motif == "ladder":
        half = n // 2
        rails = [(i, i + 1) for i in range(half - 1)] + [
            (half + i, half + i + 1) for i in range(half - 1)
        ]
        return rails + [(i, half + i) for i in range(half)]
    if motif == "tree":
        return [(int(rng.integers(0, i)), i) for i in range(1, n)]
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    keep = rng.random(len(pairs)) < 0.4
    return [p for p, k in zip(pairs, keep, strict=True) if k]


def generate_graph_dataset(
    num_graphs: int,
    *,
    num_classes: int = DEFAULT_SYNTHETIC_CLASSES,
    feature_dim: int = DEFAULT_SYNTHETIC_FEATURES,
    min_nodes: int = 8,
    max_nodes: int = 24,
    noise_edges: float = 0.15,
    seed: int = 0,
) -> GraphDataset:
    """Labelled small graphs whose class is their structure (``MOTIFS[:num_classes]``).

    Each graph has ``min_nodes..max_nodes`` nodes (so size alone does not give the class), its
    family's edges plus ``noise_edges`` times as many random extra edges, stored in both
    directions. Node features: a constant 1 (so a sum aggregation counts neighbours) then
    Gaussian noise, which carries no class signal: only message passing over the structure
    separates the classes.
    """
    if not 2 <= num_classes <= len(MOTIFS):
        raise ValueError(f"num_classes must be in [2, {len(MOTIFS)}], got {num_classes}")
    if num_graphs < num_classes or feature_dim < 1 or not 4 <= min_nodes <= max_nodes:
        raise ValueError(
            f"need num_graphs >= num_classes ({num_classes}), feature_dim >= 1 and "
            f"4 <= min_nodes <= max_nodes; got {num_graphs}, {feature_dim}, {min_nodes}, "
            f"{max_nodes}"
        )
    rng = np.random.default_rng(seed)
    labels = np.arange(num_graphs) % num_classes
    rng.shuffle(labels)
    xs, sources, destinations, edge_graphs, sizes = [], [], [], [], []
    for g, label in enumerate(labels):
        n = int(rng.integers(min_nodes, max_nodes + 1))
        edges = _motif_edges(MOTIFS[label], n, rng)
        extra = rng.integers(0, n, size=(round(noise_edges * len(edges)), 2))
        pairs = np.array(edges + [tuple(e) for e in extra.tolist()], dtype=np.int64).reshape(-1, 2)
        sources += [pairs[:, 0], pairs[:, 1]]
        destinations += [pairs[:, 1], pairs[:, 0]]
        edge_graphs.append(np.full(2 * len(pairs), g, dtype=np.int64))
        x = rng.normal(size=(n, feature_dim)).astype(np.float32)
        x[:, 0] = 1.0
        xs.append(x)
        sizes.append(n)
    node_ptr = np.zeros(num_graphs + 1, dtype=np.int64)
    np.cumsum(sizes, out=node_ptr[1:])
    src = np.concatenate(sources)
    # The noise edges' chance self-loops and repeats are no part of a family's structure.
    return _pack(
        np.concatenate(xs),
        node_ptr,
        _Edges(
            np.concatenate(edge_graphs),
            src,
            np.concatenate(destinations),
            np.zeros((src.size, 0), dtype=np.float32),
            [],
        ),
        labels.astype(np.int64),
        list(MOTIFS[:num_classes]),
        drop_self_loops=True,
        drop_duplicate_edges=True,
    )


def write_graph_dataset_csv(dataset: GraphDataset, out_dir: Path) -> None:
    """Writes ``graphs.csv``, ``nodes.csv`` and ``edges.csv`` (graph ids ``g0``, ``g1``, ...)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = [f"g{g}" for g in range(dataset.num_graphs)]
    labels = [
        dataset.class_names[label] if dataset.class_names and label >= 0 else str(label)
        for label in dataset.labels.tolist()
    ]
    pd.DataFrame({"graph_id": names, "label": labels}).to_csv(out / "graphs.csv", index=False)
    sizes = np.diff(dataset.node_ptr)
    node_graph = np.repeat(np.arange(dataset.num_graphs), sizes)
    local = np.arange(dataset.x.shape[0]) - np.repeat(dataset.node_ptr[:-1], sizes)
    nodes = pd.DataFrame(
        np.asarray(dataset.x), columns=[f"f{i}" for i in range(dataset.feature_dim)]
    )
    nodes.insert(0, "node_id", local)
    nodes.insert(0, "graph_id", np.array(names, dtype=object)[node_graph])
    nodes.to_csv(out / "nodes.csv", index=False)
    edge_graph = np.repeat(np.arange(dataset.num_graphs), np.diff(dataset.edge_ptr))
    edges = pd.DataFrame(
        {
            "graph_id": np.array(names, dtype=object)[edge_graph],
            "src": dataset.edge_index[0],
            "dst": dataset.edge_index[1],
        }
    )
    for j, name in enumerate(dataset.edge_feature_names):
        edges[name] = dataset.edge_features[:, j]
    edges.to_csv(out / "edges.csv", index=False)
