"""The store format (version 2) and `open_store`, which memory-maps a store after checking it.

A store is one directory of ``.npy`` arrays plus ``meta.json`` (docs/architecture.md has the
table). Every check a server needs happens here, at open time, so a bad store refuses to load
with a message that says how to fix it instead of failing mid-request. Version 2 added edge
features; a version 1 store (written before) still opens, as a graph without edge features.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, NotRequired, Protocol, TypedDict, cast

import blake3
import numpy as np

from graph_assets.errors import StoreError
from graph_assets.graph_view import InLists
from graph_assets.schema import GraphSchema
from graph_assets.tables import IdKind

FORMAT_VERSION = 3
# Versions open_store reads: 1 and 2 are one-type stores (1 without edge features), whose
# files open as node type 0's and relation 0's.
READABLE_VERSIONS = (1, 2, 3)
META_FILE = "meta.json"
# Version 1 and 2 file names of what version 3 keeps per node type or relation.
EDGE_FEATURES_FILE = "edge_features.npy"
_V2_ARRAY_FILES = (
    EDGE_FEATURES_FILE,
    "features.npy",
    "ids.npy",
    "in_degree.npy",
    "indices.npy",
    "indptr.npy",
    "labels.npy",
    "out_degree.npy",
)
_V1_ARRAY_FILES = tuple(name for name in _V2_ARRAY_FILES if name != EDGE_FEATURES_FILE)
# Only in a compacted store (one whose meta.json has "update_log"): the IDs updates removed.
REMOVED_IDS_FILE = "removed_ids.npy"
# Version 3: the global arrays, then one file per node type and per relation (by position).
GLOBAL_FILES = ("in_degree.npy", "indices.npy", "indptr.npy", "labels.npy", "out_degree.npy")
EDGE_TYPE_FILE = "edge_type.npy"  # more than one relation: each edge's relation
EDGE_ROWS_FILE = "edge_rows.npy"  # and its row in its relation's edge_features.<r>.npy
REBUILD_HINT = (
    "rebuild the store with `python -m graph_assets build --graph DIR --out STORE` "
    "(or `python -m graph_assets synthetic ...`)"
)


def ids_file(node_type: int) -> str:
    return f"ids.{node_type}.npy"


def features_file(node_type: int) -> str:
    return f"features.{node_type}.npy"


def removed_ids_file(node_type: int) -> str:
    return f"removed_ids.{node_type}.npy"


def relation_bounds_file(node_type: int) -> str:
    """``[n_t, R_t + 1]``: where each relation's segment of a node's in-list starts (a type
    with more than one relation into it)."""
    return f"relation_bounds.{node_type}.npy"


def edge_features_file(relation: int) -> str:
    return f"edge_features.{relation}.npy"


_HASH_BLOCK_BYTES = 8 << 20
_SCAN_BLOCK = 1 << 22  # elements per pass over a memory-mapped array: bounded temporaries
_INT64 = np.dtype("<i8")
_INDEX_DTYPES = (np.dtype("<i4"), _INT64)
# Canonical decimal form of an int, as str(int) writes it: no sign on zero, no leading zeros.
_CANONICAL_INT = re.compile(r"0|-?[1-9][0-9]*")
_INT64_MIN, _INT64_MAX = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)
_CHECKSUM = re.compile(r"[0-9a-f]{64}")


class FileMeta(TypedDict):
    """What meta.json records about one array file."""

    dtype: str  # numpy dtype string, e.g. "<f4", "|S12"
    shape: list[int]
    bytes: int
    sha256: str  # what the store's checksum is made of: its identity
    blake3: NotRequired[str]  # what a worker re-hashes at start (stores written before: sha256)


class StoreStats(TypedDict):
    """What the build kept and dropped; ``input_edges`` counts edges after ``--undirected``
    added the reverses, and ``num_edges = input_edges - self_loops_dropped -
    duplicate_edges_dropped``. A duplicate edge repeats an earlier edge's ``(src, dst)``; a
    repeated self-loop counts as both. The ``_kept`` counts are absent in version 1 stores,
    which kept neither."""

    input_edges: int
    self_loops_dropped: int
    duplicate_edges_dropped: int
    self_loops_kept: NotRequired[int]
    duplicate_edges_kept: NotRequired[int]
    undirected: bool


class UpdateLogMeta(TypedDict):
    """Where a compacted store's updates continue: the log in ``<state_dir>/<base>/`` after the
    record of ``seq``, which ends at byte ``offset`` (records up to it are folded in)."""

    base: str  # checksum of the lineage's first store, whose state directory holds the log
    seq: int
    offset: int


class StoreMeta(TypedDict):
    """The content of meta.json. Version 3 records the schema (``node_types``, ``edge_types``,
    ``target_node_type``: see graph_assets.schema); versions 1 and 2 described their one type
    with ``feature_dim``, ``id_kind`` and (version 2) the edge feature keys. ``update_log`` only
    in a compacted store."""

    format_version: int
    num_nodes: int
    num_edges: int
    node_types: NotRequired[list[dict[str, Any]]]
    edge_types: NotRequired[list[dict[str, Any]]]
    target_node_type: NotRequired[str]
    feature_dim: NotRequired[int]
    edge_feature_dim: NotRequired[int]
    edge_feature_names: NotRequired[list[str]]
    id_kind: NotRequired[IdKind]
    num_classes: int
    class_names: list[str] | None
    files: dict[str, FileMeta]
    checksum: str
    stats: StoreStats
    update_log: NotRequired[UpdateLogMeta]


def schema_of(meta: Mapping[str, Any]) -> GraphSchema:
    """The graph's schema: version 3 records it, a version 1 or 2 store is one type."""
    if meta["format_version"] >= 3:
        return GraphSchema.from_meta(dict(meta))
    return GraphSchema.homogeneous(
        meta["num_nodes"],
        meta["num_edges"],
        meta["feature_dim"],
        meta.get("edge_feature_names", []),
        meta["id_kind"],
    )


def index_dtype(count: int) -> np.dtype[Any]:
    """The dtype that indexes ``count`` items: int32 while it fits (half the memory), else int64."""
    return np.dtype("<i4") if count < 2**31 else _INT64


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in blocks so a large feature matrix is never held in memory."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_HASH_BLOCK_BYTES):
            digest.update(block)
    return digest.hexdigest()


def blake3_file(path: Path) -> str:
    """Hex BLAKE3 of a file, memory-mapped and hashed on every core: about 4x sha256's speed
    here, which is what a worker that re-checks a 1 GB store at every start pays."""
    digest = blake3.blake3(max_threads=blake3.blake3.AUTO)
    digest.update_mmap(path)
    return digest.hexdigest()


class FileDigests(TypedDict):
    sha256: str
    blake3: str


def file_digests(path: Path) -> FileDigests:
    """The digests meta.json records for a file: sha256 (the store's identity) and blake3 (what
    opening it re-checks)."""
    return {"sha256": sha256_file(path), "blake3": blake3_file(path)}


def digest_mismatch(file: Path, entry: Mapping[str, Any]) -> str | None:
    """None when ``file`` hashes to what its meta.json entry records, else what differs. Checks
    BLAKE3 where the entry has it (the fast one), sha256 in entries written before it."""
    algorithm = "blake3" if "blake3" in entry else "sha256"
    digest = blake3_file(file) if algorithm == "blake3" else sha256_file(file)
    if digest == entry[algorithm]:
        return None
    return f"{file} has {algorithm} {digest}, meta.json says {entry[algorithm]}"


def combined_checksum(
    file_sha256: Mapping[str, str], update_log: UpdateLogMeta | None = None
) -> str:
    """One digest naming the whole graph: sha256 over the files' hex digests in name order,
    then a compacted store's ``update_log`` entry (so where its updates continue is covered)."""
    joined = "".join(file_sha256[name] for name in sorted(file_sha256))
    if update_log is not None:
        joined += json.dumps(update_log, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(joined.encode("ascii")).hexdigest()


def store_files(meta: Mapping[str, Any]) -> tuple[str, ...]:
    """The array files a store with this meta.json has, in name order."""
    return tuple(sorted(_file_names(meta).values()))


def _file_names(meta: Mapping[str, Any]) -> dict[str, str]:
    """Each file's role (its version 3 name) -> its name in this store's version."""
    version = meta.get("format_version")
    compacted = "update_log" in meta
    if version in (1, 2):
        names = {name: name for name in (_V1_ARRAY_FILES if version == 1 else _V2_ARRAY_FILES)}
        names[ids_file(0)] = names.pop("ids.npy")
        names[features_file(0)] = names.pop("features.npy")
        if version == 2:
            names[edge_features_file(0)] = names.pop(EDGE_FEATURES_FILE)
        if compacted:
            names[removed_ids_file(0)] = REMOVED_IDS_FILE
        return names
    schema = schema_of(meta)
    roles = list(GLOBAL_FILES)
    for index, node_type in enumerate(schema.node_types):
        roles += [ids_file(index), features_file(index)]
        if compacted:
            roles.append(removed_ids_file(index))
        if len(schema.relations_into(node_type.name)) > 1:
            roles.append(relation_bounds_file(index))
    roles += [edge_features_file(r) for r in range(len(schema.relations))]
    if len(schema.relations) > 1:
        roles += [EDGE_TYPE_FILE, EDGE_ROWS_FILE]
    return {role: role for role in roles}


_SELF_LOOP_BLOCK = 1 << 16  # nodes per block when counting self-loops


class _HasMeta(Protocol):
    @property
    def meta(self) -> StoreMeta: ...


class MetaFigures:
    """The figures a store's ``meta.json`` records, read the same way by every kind of store
    (mapped, in Redis) and by the layout a Redis store records."""

    @property
    def num_nodes(self: _HasMeta) -> int:
        return self.meta["num_nodes"]

    @property
    def num_edges(self: _HasMeta) -> int:
        return self.meta["num_edges"]

    @property
    def num_classes(self: _HasMeta) -> int:
        """Number of classes (0 when the graph has no labels)."""
        return self.meta["num_classes"]

    @property
    def class_names(self: _HasMeta) -> list[str] | None:
        """Name of each class index, or None when labels were given as integers."""
        return self.meta["class_names"]

    @property
    def checksum(self: _HasMeta) -> str:
        """Digest of all arrays: names this exact graph (e.g. to seed deterministic sampling)."""
        return self.meta["checksum"]


@dataclass(frozen=True, eq=False)
class NodeTable:
    """The stored arrays of one node type.

    Attributes:
        ids: ``[n_t]`` sorted external IDs, int64 or UTF-8 bytes (``S<k>``); node ``i`` of the
            type is global index ``offset_t + i``.
        features: ``[n_t, F_t]`` float32 (``F_t`` may be 0: a featureless type).
        removed_ids: sorted IDs of the type that updates removed before the store was
            compacted; empty unless it is. They are never reused.
    """

    ids: np.ndarray
    features: np.ndarray
    removed_ids: np.ndarray


@dataclass(frozen=True, eq=False)
class GraphStore(MetaFigures):
    """An opened store; use `open_store` to get one.

    The arrays are read-only memory maps, so every worker serving the graph shares one copy in
    the page cache. Nodes live in one global index space: node types hold contiguous ranges in
    schema order, the target type first (``graph_assets.schema``); a homogeneous graph is the
    one-type case. The one-type accessors (``ids``, ``features``, ``lookup`` without a type)
    are the target type's, whose global indices are its local ones.

    Attributes:
        path: the store directory.
        meta: the content of meta.json.
        schema: the node types and relations.
        indptr: ``[N+1]`` int32/int64; the in-edges of node ``v`` are
            ``indices[indptr[v]:indptr[v+1]]`` (CSC), grouped by relation in schema order.
        indices: ``[E]`` int32/int64 global source node of each in-edge; within a node's
            relation segment ascending, parallel edges in input order.
        labels: ``[n_target]`` int64 class index of the target type's nodes, -1 unlabelled.
        in_degree: ``[N]`` int64 full-graph in-degree: every stored in-edge, self-loops and
            parallel edges included.
        out_degree: ``[N]`` int64 full-graph out-degree, counted the same way.
        tables: each node type's IDs and features.
        edge_features: per relation, ``[E_r, D_r]`` float32; row ``k`` belongs to the
            relation's ``k``-th edge in CSC order. With one relation, row ``p`` is the edge at
            CSC position ``p``, which is every edge's ID.
        edge_type: ``[E]`` relation of each edge (None with one relation).
        edge_rows: ``[E]`` each edge's row in its relation's ``edge_features`` (None with one
            relation, where it is the edge's ID).
        relation_bounds: node type index -> ``[n_t, R_t + 1]`` absolute CSC positions where
            each of the ``R_t`` relations into the type starts (and the last ends), for types
            with more than one.
    """

    path: Path
    meta: StoreMeta
    schema: GraphSchema
    indptr: np.ndarray
    indices: np.ndarray
    labels: np.ndarray
    in_degree: np.ndarray
    out_degree: np.ndarray
    tables: tuple[NodeTable, ...]
    edge_features_by_relation: tuple[np.ndarray, ...]
    edge_type: np.ndarray | None
    edge_rows: np.ndarray | None
    relation_bounds: dict[int, np.ndarray]

    @property
    def ids(self) -> np.ndarray:
        """The target type's sorted external IDs (every node's, on a homogeneous graph)."""
        return self.tables[0].ids

    @property
    def features(self) -> np.ndarray:
        """The target type's ``[n_target, F]`` features (every node's, on a homogeneous graph)."""
        return self.tables[0].features

    @property
    def removed_ids(self) -> np.ndarray:
        return self.tables[0].removed_ids

    @property
    def feature_dim(self) -> int:
        """The target type's feature width."""
        return self.schema.target_type.feature_dim

    @property
    def edge_features(self) -> np.ndarray:
        """Every edge's features by edge ID: the one relation's table. A graph with several
        relations has one table per relation (``edge_features_by_relation``)."""
        self._one_relation("edge_features")
        return self.edge_features_by_relation[0]

    @property
    def edge_feature_dim(self) -> int:
        """Features per edge (0 when the graph has none, as in every version 1 store)."""
        return len(self.edge_feature_names)

    @property
    def edge_feature_names(self) -> list[str]:
        """The edge feature column names in input file order (empty without edge features);
        on a graph with several relations, those all of them share (ValueError otherwise)."""
        widths = {r.edge_feature_names for r in self.schema.relations}
        if len(widths) > 1:
            raise ValueError(
                "the relations of this graph have different edge features; ask the schema "
                "for each relation's"
            )
        return list(widths.pop()) if widths else []

    def _one_relation(self, what: str) -> None:
        if len(self.schema.relations) > 1:
            raise ValueError(
                f"{what} is a one-relation accessor; this graph has "
                f"{len(self.schema.relations)} relations ({', '.join(self.schema.edge_type_names)})"
            )

    @property
    def id_kind(self) -> IdKind:
        """The target type's ID kind."""
        return cast(IdKind, self.schema.target_type.id_kind)

    @property
    def update_log(self) -> UpdateLogMeta | None:
        """Where a compacted store's updates continue in its lineage's log; None otherwise."""
        return self.meta.get("update_log")

    @property
    def log_base(self) -> str:
        """The checksum naming the state directory of this store's update log: the lineage's
        first store for a compacted store (one log per lineage), else its own."""
        lineage = self.update_log
        return lineage["base"] if lineage is not None else self.checksum

    @property
    def folded_seq(self) -> int:
        """Seq of the last update record folded into the arrays (0 for a store never updated)."""
        lineage = self.update_log
        return lineage["seq"] if lineage is not None else 0

    def lookup(self, ids: Sequence[int | str], node_type: str | None = None) -> np.ndarray:
        """Global indices (int64) of external ``ids`` of ``node_type`` (default: the target
        type); -1 marks an ID the type does not have.

        On an int type a str in canonical decimal form (``"42"``, not ``"042"``) finds node
        42; on a str type an int finds the node whose ID is its decimal string. Anything else
        (bools, floats, other strings) is reported missing rather than raising, since callers
        turn -1 into "node not found".
        """
        index = 0 if node_type is None else self.schema.type_index(node_type)
        found = _find(self.tables[index].ids, ids, self.schema.node_types[index].id_kind)
        offset = self.schema.node_types[index].offset
        return np.where(found >= 0, found + offset, -1) if offset else found

    def was_removed(self, node_id: int | str, node_type: str | None = None) -> bool:
        """Whether an update removed ``node_id`` before this store was compacted: such an ID
        is refused by ``add_node``, as it was before compaction (IDs are not reused)."""
        index = 0 if node_type is None else self.schema.type_index(node_type)
        kind = self.schema.node_types[index].id_kind
        return bool(_find(self.tables[index].removed_ids, [node_id], kind)[0] >= 0)

    def edge_index(self) -> np.ndarray:
        """All edges as int64 ``[2, E]`` (row 0 source, row 1 destination), in CSC order.

        This materialises the whole graph: meant for training and full-graph reference checks,
        not for serving.
        """
        dst = np.repeat(np.arange(self.num_nodes, dtype=np.int64), np.diff(self.indptr))
        return np.stack([np.asarray(self.indices, dtype=np.int64), dst])

    def feature_rows(self, nodes: np.ndarray) -> np.ndarray:
        """float32 feature rows of global ``nodes``, all of one type (a copy). np.take, not
        fancy indexing or torch's index_select: about half their time on a memory map."""
        nodes = np.asarray(nodes)
        index = self._one_type(nodes)
        local = nodes - self.schema.node_types[index].offset if index else nodes
        table = self.tables[index].features
        return np.take(table, local, axis=0).astype(np.float32, copy=False)

    def _one_type(self, nodes: np.ndarray) -> int:
        """The node type of ``nodes`` (ValueError when they mix types)."""
        if len(self.tables) == 1 or nodes.size == 0:
            return 0
        types = self.schema.types_of(nodes)
        if (types != types[0]).any():
            raise ValueError("feature rows of nodes of several types have several widths")
        return int(types[0])

    def types_of(self, nodes: np.ndarray) -> np.ndarray:
        """The node type index of each of the global ``nodes``."""
        return self.schema.types_of(nodes)

    def in_lists(self, nodes: np.ndarray) -> InLists:
        """The in-edge lists of global ``nodes`` (a copy of their parts of the CSC arrays),
        with each edge's ID and relation: the graph view's read of whole lists. The sampler
        reads the mapped arrays in place instead."""
        nodes = np.asarray(nodes, dtype=np.int64).reshape(-1)
        pointers, sources = self._csc
        starts = pointers[nodes].astype(np.int64)
        counts = pointers[nodes + 1].astype(np.int64) - starts
        indptr = np.zeros(len(nodes) + 1, dtype=np.int64)
        np.cumsum(counts, out=indptr[1:])
        edge_ids = np.repeat(starts, counts) + _ragged(counts)
        return InLists(
            indptr=indptr,
            indices=sources[edge_ids].astype(np.int64),
            edge_ids=edge_ids,
            relations=self.edge_relations(edge_ids),
        )

    @cached_property
    def _csc(self) -> tuple[np.ndarray, np.ndarray]:
        """Plain ndarray views of ``indptr`` and ``indices`` (no copy): indexing a numpy.memmap
        pays a Python-level ``__array_finalize__`` per call, half of a small ``in_lists`` read
        (the overlay reads one per update request)."""
        return np.asarray(self.indptr), np.asarray(self.indices)

    def edge_relations(self, edge_ids: np.ndarray) -> np.ndarray:
        """The relation index (int64) of each edge by ID."""
        edge_ids = np.asarray(edge_ids, dtype=np.int64)
        if self.edge_type is None:
            return np.zeros(len(edge_ids), dtype=np.int64)
        return np.take(self.edge_type, edge_ids).astype(np.int64)

    def edge_feature_rows(self, edge_ids: np.ndarray) -> np.ndarray:
        """float32 ``[len(edge_ids), D]`` features of edges by ID, all of one relation (a
        copy). An edge's ID is its CSC position ``p``: the in-edge ``indices[p]`` of the node
        whose ``indptr[v]:indptr[v+1]`` holds ``p``. Without edge features the rows have no
        columns."""
        edge_ids = np.asarray(edge_ids)
        relation = 0
        if edge_ids.size == 0:
            edge_ids = edge_ids.astype(np.int64)
        else:
            check_edge_ids(edge_ids, self.num_edges, "CSC positions")
            if self.edge_type is not None:
                relations = np.take(self.edge_type, edge_ids)
                relation = int(relations[0])
                if (relations != relation).any():
                    raise ValueError("edge features of several relations have several widths")
                assert self.edge_rows is not None
                edge_ids = np.take(self.edge_rows, edge_ids)
        table = self.edge_features_by_relation[relation]
        return np.take(table, edge_ids, axis=0).astype(np.float32, copy=False)

    def degree_rows(self, nodes: np.ndarray) -> np.ndarray:
        """int64 full-graph in-degrees of global ``nodes``, self-loops not counted: what GCN
        normalises by (PyG's ``add_remaining_self_loops`` replaces a node's self-loops by
        one of its own)."""
        degree = np.take(self.in_degree, nodes).astype(np.int64, copy=False)
        loops = self.self_loop_counts
        return degree if loops is None else degree - np.take(loops, nodes)

    def out_degree_rows(self, nodes: np.ndarray) -> np.ndarray:
        """int64 full-graph out-degrees of global ``nodes``, self-loops not counted: what
        ChebConv's Laplacian normalises by (PyG's ``get_laplacian`` counts ``edge_index[0]``
        with self-loops removed). A self-loop is one in- and one out-edge of its node."""
        degree = np.take(self.out_degree, nodes).astype(np.int64, copy=False)
        loops = self.self_loop_counts
        return degree if loops is None else degree - np.take(loops, nodes)

    def largest_out_degree(self) -> int:
        """The largest ``out_degree_rows`` of any node (0 without edges), counted once."""
        return self._largest_out_degree

    @cached_property
    def _largest_out_degree(self) -> int:
        if not self.num_nodes:
            return 0
        return int(self.out_degree_rows(np.arange(self.num_nodes)).max())

    @cached_property
    def self_loop_counts(self) -> np.ndarray | None:
        """int64 ``[N]`` self-loops of each node, counted once per store in blocks of nodes;
        None when the graph has none (a format 1 store never has)."""
        stats = self.meta.get("stats", {})
        if self.meta["format_version"] == 1 or stats.get("self_loops_kept", 1) == 0:
            return None
        counts = np.zeros(self.num_nodes, dtype=np.int64)
        indptr = self.indptr
        for start in range(0, self.num_nodes, _SELF_LOOP_BLOCK):
            stop = min(start + _SELF_LOOP_BLOCK, self.num_nodes)
            begin, end = int(indptr[start]), int(indptr[stop])
            dst = np.repeat(
                np.arange(start, stop, dtype=np.int64), np.diff(indptr[start : stop + 1])
            )
            loops = dst[np.asarray(self.indices[begin:end]) == dst]
            counts[start:stop] = np.bincount(loops - start, minlength=stop - start)
        return counts if counts.any() else None

    def external_ids(self, index: np.ndarray) -> list[int | str]:
        """External IDs of global indices (Python ints or strs, as the input file had them);
        each type's IDs are its own, so on a graph with several types say which with
        ``schema.types_of``."""
        index = np.asarray(index)
        if index.size and (index.min() < 0 or index.max() >= self.num_nodes):
            raise ValueError(
                f"internal indices must be in [0, {self.num_nodes}), got values from "
                f"{index.min()} to {index.max()}; map external IDs with lookup() first"
            )
        types = (
            np.zeros(index.shape, dtype=np.int64)
            if len(self.tables) == 1
            else self.schema.types_of(index)
        )
        values: list[Any] = [None] * index.size
        flat, flat_types = index.reshape(-1), types.reshape(-1)
        for t in np.unique(flat_types).tolist():
            where = np.flatnonzero(flat_types == t)
            node_type = self.schema.node_types[t]
            found = self.tables[t].ids[flat[where] - node_type.offset].tolist()
            if node_type.id_kind == "str":
                found = [v.decode("utf-8") for v in found]
            for position, value in zip(where.tolist(), found, strict=True):
                values[position] = value
        return values


def _find(table: np.ndarray, ids: Sequence[int | str], id_kind: str) -> np.ndarray:
    """Positions of ``ids`` in the sorted ID array ``table``, -1 where absent."""
    if len(table) == 0:
        return np.full(len(ids), -1, dtype=np.int64)
    keys, usable = _keys(ids, table.dtype, id_kind)
    pos = np.searchsorted(table, keys)
    # Positions past the end and unusable keys both mean missing; clip only to compare safely.
    clipped = np.minimum(pos, len(table) - 1)
    found = usable & (pos < len(table)) & (table[clipped] == keys)
    return np.where(found, pos, -1).astype(np.int64)


def _keys(
    ids: Sequence[int | str], dtype: np.dtype[Any], id_kind: str
) -> tuple[np.ndarray, np.ndarray]:
    """The query IDs as an array of ``dtype`` plus a mask of those that could match."""
    if id_kind == "int":
        ints = [_as_int_id(x) for x in ids]
        usable = np.array([v is not None for v in ints], dtype=bool)
        keys = np.array([0 if v is None else v for v in ints], dtype=np.int64)
        return keys, usable
    width = dtype.itemsize
    raw = [_as_str_id(x) for x in ids]
    # Longer keys would be truncated by the S<k> dtype and could falsely match a prefix.
    usable = np.array([b is not None and len(b) <= width for b in raw], dtype=bool)
    keys = np.array(
        [b if ok and b is not None else b"" for b, ok in zip(raw, usable, strict=True)],
        dtype=dtype,
    )
    return keys, usable


def _as_int_id(x: object) -> int | None:
    """``x`` as an int64 node ID, or None when it cannot be one."""
    if isinstance(x, bool | np.bool_):
        return None
    if isinstance(x, int | np.integer) or (isinstance(x, str) and _CANONICAL_INT.fullmatch(x)):
        value = int(x)
        return value if _INT64_MIN <= value <= _INT64_MAX else None
    return None


def _as_str_id(x: object) -> bytes | None:
    """``x`` as the UTF-8 bytes of a string node ID, or None when it cannot be one."""
    if isinstance(x, bool | np.bool_):
        return None
    if isinstance(x, int | np.integer):
        return str(int(x)).encode("ascii")
    if not isinstance(x, str):
        return None
    try:
        encoded = x.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: no stored ID can equal them
        return None
    # Stored IDs are never empty and never hold NUL (S<k> would strip a trailing one).
    return encoded if encoded and b"\0" not in encoded else None


def open_store(path: Path, verify_checksum: bool = True) -> GraphStore:
    """Open the store at ``path`` after checking it; raise `StoreError` if anything is off.

    Checks the format version, that every file is present with the size, dtype and shape that
    meta.json records (and that the format requires), the CSC structure (``indptr`` starts at 0,
    never decreases, ends at E; ``indices`` in range; each edge's source and destination of its
    relation's types, relation segments in schema order), label range, sorted unique IDs and
    degrees. With ``verify_checksum`` (default) it also re-hashes every file, which reads the
    whole store once; turn it off only where the store was verified already.
    """
    path = Path(path)
    meta = read_meta(path)
    names = _file_names(meta)
    for name in names.values():
        _check_size(path, name, meta["files"][name])
    if verify_checksum:
        _verify_checksums(path, meta)
    schema = schema_of(meta)
    expected = _expected_layout(meta, schema)
    arrays = {
        role: _load(path, name, meta["files"][name], expected[role], meta["format_version"])
        for role, name in names.items()
    }
    _check_structure(path, meta, schema, arrays)
    tables = tuple(
        NodeTable(
            ids=arrays[ids_file(t)],
            features=arrays[features_file(t)],
            removed_ids=arrays.get(removed_ids_file(t), arrays[ids_file(t)][:0]),
        )
        for t in range(len(schema.node_types))
    )
    no_edge_features = np.empty((meta["num_edges"], 0), dtype=np.float32)  # version 1
    return GraphStore(
        path=path,
        meta=meta,
        schema=schema,
        indptr=arrays["indptr.npy"],
        indices=arrays["indices.npy"],
        labels=arrays["labels.npy"],
        in_degree=arrays["in_degree.npy"],
        out_degree=arrays["out_degree.npy"],
        tables=tables,
        edge_features_by_relation=tuple(
            arrays.get(edge_features_file(r), no_edge_features)
            for r in range(len(schema.relations))
        ),
        edge_type=arrays.get(EDGE_TYPE_FILE),
        edge_rows=arrays.get(EDGE_ROWS_FILE),
        relation_bounds={
            t: arrays[relation_bounds_file(t)]
            for t in range(len(schema.node_types))
            if relation_bounds_file(t) in arrays
        },
    )


def read_meta(path: Path) -> StoreMeta:
    """meta.json of the store at ``path``, checked for version and field types."""
    meta_path = path / META_FILE
    if not meta_path.is_file():
        raise StoreError(
            f"{path} is not a graph store: expected {META_FILE} there, found none; {REBUILD_HINT}"
        )
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StoreError(f"{meta_path}: cannot read it as JSON ({exc}); {REBUILD_HINT}") from exc
    if not isinstance(meta, dict):
        raise StoreError(f"{meta_path}: expected a JSON object, found {type(meta).__name__}")
    version = meta.get("format_version")
    if isinstance(version, bool) or version not in READABLE_VERSIONS:
        readable = ", ".join(str(v) for v in READABLE_VERSIONS)
        raise StoreError(
            f"{meta_path}: format_version is {version!r}, this gnnserve reads versions "
            f"{readable}; {REBUILD_HINT} with this version"
        )
    _check_meta_fields(meta_path, meta)
    return cast(StoreMeta, meta)


def _check_meta_fields(meta_path: Path, meta: dict[str, Any]) -> None:
    """Types and ranges of meta.json's fields, so later code can trust them."""

    def bad(problem: str) -> StoreError:
        return StoreError(f"{meta_path}: {problem}; {REBUILD_HINT}")

    minimum = {"num_nodes": 1, "num_edges": 0, "num_classes": 0}
    if meta["format_version"] < 3:
        minimum["feature_dim"] = 1
    for key, low in minimum.items():
        value = meta.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise bad(f"{key} must be an integer >= {low}, found {value!r}")
    names = meta.get("class_names")
    if names is not None and (
        not isinstance(names, list)
        or not all(isinstance(n, str) for n in names)
        or len(names) != meta["num_classes"]
    ):
        raise bad(f"class_names must be null or {meta['num_classes']} strings, found {names!r}")
    if meta["format_version"] < 3:
        if meta.get("id_kind") not in ("int", "str"):
            raise bad(f"id_kind must be 'int' or 'str', found {meta.get('id_kind')!r}")
        _check_edge_feature_fields(meta, bad)
    else:
        _check_schema(meta, bad)
    if not isinstance(meta.get("checksum"), str):
        raise bad("checksum is missing")
    if not isinstance(meta.get("stats"), dict):
        raise bad("stats is missing")
    if "update_log" in meta:
        _check_update_log(meta["update_log"], bad)
    files = meta.get("files")
    listed = list(store_files(meta))
    if not isinstance(files, dict) or sorted(files) != listed:
        found = sorted(files) if isinstance(files, dict) else files
        raise bad(f"files must list exactly {listed}, found {found!r}")
    for name, entry in files.items():
        if not (
            isinstance(entry, dict)
            and isinstance(entry.get("dtype"), str)
            and isinstance(entry.get("shape"), list)
            and all(isinstance(d, int) for d in entry["shape"])
            and isinstance(entry.get("bytes"), int)
            and isinstance(entry.get("sha256"), str)
            and isinstance(entry.get("blake3", ""), str)
        ):
            raise bad(f"files[{name!r}] must hold dtype, shape, bytes and sha256, found {entry!r}")


def _check_schema(meta: dict[str, Any], bad: Callable[[str], StoreError]) -> None:
    """Version 3: a well-formed schema whose counts add up to ``num_nodes``/``num_edges``,
    with the target type first."""
    try:
        schema = GraphSchema.from_meta(meta)
    except ValueError as error:
        raise bad(str(error)) from None
    if schema.node_types[0].name != schema.target:
        raise bad(f"the target node type {schema.target!r} must be the first node type")
    if schema.num_nodes != meta["num_nodes"] or schema.num_edges != meta["num_edges"]:
        raise bad(
            f"node_types hold {schema.num_nodes} nodes and edge_types {schema.num_edges} edges, "
            f"num_nodes/num_edges say {meta['num_nodes']}/{meta['num_edges']}"
        )


def _check_edge_feature_fields(meta: dict[str, Any], bad: Callable[[str], StoreError]) -> None:
    """Version 2: ``edge_feature_dim`` >= 0 and as many distinct names; version 1: neither."""
    keys = ("edge_feature_dim", "edge_feature_names")
    if meta["format_version"] == 1:
        present = [key for key in keys if key in meta]
        if present:
            raise bad(f"a format version 1 store has no edge features, found {present[0]}")
        return
    dim, names = meta.get("edge_feature_dim"), meta.get("edge_feature_names")
    if not isinstance(dim, int) or isinstance(dim, bool) or dim < 0:
        raise bad(f"edge_feature_dim must be an integer >= 0, found {dim!r}")
    if not (
        isinstance(names, list)
        and all(isinstance(name, str) for name in names)
        and len(names) == dim
        and len(set(names)) == dim
    ):
        raise bad(f"edge_feature_names must be {dim} distinct strings, found {names!r}")


def _check_update_log(entry: object, bad: Callable[[str], StoreError]) -> None:
    """A compacted store's ``update_log``: the lineage's checksum, a seq and a byte offset."""
    if not (
        isinstance(entry, dict)
        and sorted(entry) == ["base", "offset", "seq"]
        and isinstance(entry["base"], str)
        and _CHECKSUM.fullmatch(entry["base"])
        and all(
            isinstance(entry[key], int) and not isinstance(entry[key], bool) and entry[key] >= 0
            for key in ("seq", "offset")
        )
    ):
        raise bad(
            "update_log must hold base (a 64-digit hex checksum), seq and offset (integers "
            f">= 0), found {entry!r}"
        )


def _check_size(path: Path, name: str, entry: FileMeta) -> None:
    file = path / name
    if not file.is_file():
        raise StoreError(f"{file} is missing: the store is incomplete; {REBUILD_HINT}")
    size = file.stat().st_size
    if size != entry["bytes"]:
        raise StoreError(
            f"{file} is {size} bytes, meta.json says {entry['bytes']}: the file was truncated "
            f"or replaced; {REBUILD_HINT}"
        )


def _verify_checksums(path: Path, meta: StoreMeta) -> None:
    """Every file against its recorded digest, then the recorded sha256s against the checksum
    (which names the graph everywhere else: versions, logs, archives by reference)."""
    for name in store_files(meta):
        mismatch = digest_mismatch(path / name, meta["files"][name])
        if mismatch is not None:
            raise StoreError(f"{mismatch}: the file is corrupt or was changed; {REBUILD_HINT}")
    recorded = {name: entry["sha256"] for name, entry in meta["files"].items()}
    combined = combined_checksum(recorded, meta.get("update_log"))
    if combined != meta["checksum"]:
        raise StoreError(
            f"{path / META_FILE}: checksum is {meta['checksum']}, the files combine to "
            f"{combined}; {REBUILD_HINT}"
        )


def _expected_layout(
    meta: StoreMeta, schema: GraphSchema
) -> dict[str, tuple[tuple[np.dtype[Any], ...], list[int]]]:
    """Allowed dtypes and the shape of each file by role, as the format defines them from
    meta's counts."""
    n, e = meta["num_nodes"], meta["num_edges"]
    layout: dict[str, tuple[tuple[np.dtype[Any], ...], list[int]]] = {
        "in_degree.npy": ((_INT64,), [n]),
        "indices.npy": (_INDEX_DTYPES, [e]),
        "indptr.npy": (_INDEX_DTYPES, [n + 1]),
        "labels.npy": ((_INT64,), [schema.target_type.num_nodes]),
        "out_degree.npy": ((_INT64,), [n]),
        EDGE_TYPE_FILE: ((np.dtype("<i2"),), [e]),
        EDGE_ROWS_FILE: (_INDEX_DTYPES, [e]),
    }
    names = _file_names(meta)
    for t, node_type in enumerate(schema.node_types):
        if node_type.id_kind == "int":
            id_dtypes: tuple[np.dtype[Any], ...] = (_INT64,)
        else:
            # Any width: S<k> is as wide as the longest ID. Checked by kind in _load.
            id_dtypes = (np.dtype("S1"),)
        layout[ids_file(t)] = (id_dtypes, [node_type.num_nodes])
        layout[features_file(t)] = (
            (np.dtype("<f4"),),
            [node_type.num_nodes, node_type.feature_dim],
        )
        removed = removed_ids_file(t)
        if removed in names:  # 1-D, as long as meta.json records
            layout[removed] = (id_dtypes, meta["files"][names[removed]]["shape"][:1])
        count = len(schema.relations_into(node_type.name))
        layout[relation_bounds_file(t)] = (_INDEX_DTYPES, [node_type.num_nodes, count + 1])
    for r, relation in enumerate(schema.relations):
        layout[edge_features_file(r)] = (
            (np.dtype("<f4"),),
            [relation.num_edges, relation.edge_feature_dim],
        )
    return layout


def open_recorded_array(
    file: Path, entry: Mapping[str, Any], rebuild: str, verify_checksum: bool = False
) -> np.ndarray:
    """A ``.npy`` file memory-mapped read-only (no pickle), checked against the dtype, shape
    and, if asked, the digest its meta.json recorded: the one way every store of this package
    and of model/ opens its arrays. StoreError names the file and ends with ``rebuild``."""
    mismatch = digest_mismatch(file, entry) if verify_checksum else None
    if mismatch is not None:
        raise StoreError(f"{mismatch}: the file is corrupt; {rebuild}")
    try:
        array = np.load(file, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise StoreError(f"{file}: cannot read it as a .npy array ({exc}); {rebuild}") from exc
    found = f"{array.dtype.str} {list(array.shape)}"
    recorded = f"{entry['dtype']} {entry['shape']}"
    if found != recorded:
        raise StoreError(
            f"{file} holds {found} (dtype, shape), meta.json says {recorded}: the files and "
            f"meta.json disagree; {rebuild}"
        )
    return array


def _load(
    path: Path,
    name: str,
    entry: FileMeta,
    expected: tuple[tuple[np.dtype[Any], ...], list[int]],
    version: int,
) -> np.ndarray:
    file = path / name
    array = open_recorded_array(file, entry, REBUILD_HINT)
    found = f"{array.dtype.str} {list(array.shape)}"
    dtypes, shape = expected
    if array.dtype.kind == "S" and dtypes[0].kind == "S":
        dtype_ok = array.dtype.itemsize >= 1
    else:
        dtype_ok = array.dtype in dtypes
    if not dtype_ok or list(array.shape) != shape:
        allowed = " or ".join("S<k>" if d.kind == "S" else d.str for d in dtypes)
        raise StoreError(
            f"{file} holds {found}, format version {version} needs {allowed} {shape}; "
            f"{REBUILD_HINT}"
        )
    return array


def _blocks(length: int) -> Iterator[tuple[int, int]]:
    for start in range(0, length, _SCAN_BLOCK):
        yield start, min(start + _SCAN_BLOCK, length)


def _check_structure(
    path: Path, meta: StoreMeta, schema: GraphSchema, arrays: dict[str, np.ndarray]
) -> None:
    """The invariants the sampler and the model rely on, checked in bounded-memory passes."""
    n, e = meta["num_nodes"], meta["num_edges"]
    indptr, indices = arrays["indptr.npy"], arrays["indices.npy"]
    names = _file_names(meta)

    def bad(role: str, problem: str) -> StoreError:
        return StoreError(f"{path / names[role]}: {problem}; {REBUILD_HINT}")

    if indptr[0] != 0 or indptr[-1] != e:
        raise bad(
            "indptr.npy",
            f"indptr must start at 0 and end at num_edges={e}, found {indptr[0]} .. {indptr[-1]}",
        )
    for start, stop in _blocks(n):
        counts = np.diff(indptr[start : stop + 1])
        drops = np.flatnonzero(counts < 0)
        if drops.size:
            v = start + int(drops[0])
            raise bad(
                "indptr.npy",
                f"indptr must never decrease, found indptr[{v}]={indptr[v]} > "
                f"indptr[{v + 1}]={indptr[v + 1]}",
            )
        if not np.array_equal(counts, arrays["in_degree.npy"][start:stop]):
            raise bad("in_degree.npy", "in_degree disagrees with indptr's in-edge counts")
    for t in range(len(schema.node_types)):
        ids = arrays[ids_file(t)]
        for start, stop in _blocks(len(ids)):
            block = ids[start : min(stop + 1, len(ids))]
            if not np.all(block[1:] > block[:-1]):
                raise bad(ids_file(t), "ids must be sorted ascending without duplicates")
        removed = removed_ids_file(t)
        if removed in arrays:
            _check_removed_ids(path / names[removed], ids, arrays[removed])
    for start, stop in _blocks(e):
        block = indices[start:stop]
        if block.min() < 0 or block.max() >= n:
            raise bad(
                "indices.npy",
                f"source indices must be in [0, {n}), found values from {block.min()} to "
                f"{block.max()}",
            )
    if len(schema.relations) > 1:
        _check_relations(schema, arrays, bad)
    out_degree = np.bincount(indices, minlength=n)
    if not np.array_equal(out_degree, arrays["out_degree.npy"]):
        raise bad("out_degree.npy", "out_degree disagrees with the edges in indices.npy")
    labels, num_classes = arrays["labels.npy"], meta["num_classes"]
    for start, stop in _blocks(len(labels)):
        block = labels[start:stop]
        if block.min() < -1 or block.max() >= num_classes:
            raise bad(
                "labels.npy",
                f"labels must be -1 (unlabelled) or in [0, {num_classes}), found values from "
                f"{block.min()} to {block.max()}",
            )


def _check_relations(
    schema: GraphSchema, arrays: dict[str, np.ndarray], bad: Callable[[str, str], StoreError]
) -> None:
    """Each edge's relation: in range, grouped per in-list in schema order (the bounds), its
    source of the relation's source type; each row of its relation's edge features once."""
    edge_type, edge_rows = arrays[EDGE_TYPE_FILE], arrays[EDGE_ROWS_FILE]
    indptr, indices = arrays["indptr.npy"], arrays["indices.npy"]
    if edge_type.min() < 0 or edge_type.max() >= len(schema.relations):
        raise bad(EDGE_TYPE_FILE, f"relations must be in [0, {len(schema.relations)})")
    counts = np.bincount(edge_type, minlength=len(schema.relations))
    for r, relation in enumerate(schema.relations):
        if counts[r] != relation.num_edges:
            raise bad(
                EDGE_TYPE_FILE,
                f"{relation.name} has {counts[r]} edges, meta.json says {relation.num_edges}",
            )
        rows = np.sort(edge_rows[edge_type == r])
        if not np.array_equal(rows, np.arange(relation.num_edges)):
            raise bad(EDGE_ROWS_FILE, f"the rows of {relation.name} must be 0..E_r-1, once each")
        source = schema.node_type(relation.edge_type.src)
        sources = indices[edge_type == r]
        if sources.size and (sources.min() < source.offset or sources.max() >= source.stop):
            raise bad("indices.npy", f"a {relation.name} edge has a source of another type")
    for t, node_type in enumerate(schema.node_types):
        into = schema.relations_into(node_type.name)
        begin, end = int(indptr[node_type.offset]), int(indptr[node_type.stop])
        kinds = np.asarray(edge_type[begin:end])
        if not np.isin(kinds, into).all():
            raise bad(EDGE_TYPE_FILE, f"an edge into a {node_type.name} has another relation")
        if len(into) < 2:
            continue
        bounds = arrays[relation_bounds_file(t)]
        ends = np.asarray(indptr[node_type.offset : node_type.stop + 1])
        if not (
            np.array_equal(bounds[:, 0], ends[:-1])
            and np.array_equal(bounds[:, -1], ends[1:])
            and (np.diff(bounds, axis=1) >= 0).all()
        ):
            raise bad(relation_bounds_file(t), "bounds must split each in-list in order")
        for k, r in enumerate(into):
            counts = np.asarray(bounds[:, k + 1] - bounds[:, k], dtype=np.int64)
            starts = np.repeat(np.asarray(bounds[:, k], dtype=np.int64), counts) + _ragged(counts)
            if (np.asarray(edge_type[starts]) != r).any():
                raise bad(
                    relation_bounds_file(t),
                    f"a segment of {schema.relations[r].name} holds edges of another relation",
                )


def _ragged(counts: np.ndarray) -> np.ndarray:
    """``0..c-1`` for each count ``c``, concatenated."""
    total = int(counts.sum())
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    return np.arange(total) - starts


def _check_removed_ids(file: Path, ids: np.ndarray, removed: np.ndarray) -> None:
    """Sorted, unique, and none of them a node of the store (a removed node is gone)."""
    hint = "compact the source store again with `python -m graph_assets.compact`"
    if not np.all(removed[1:] > removed[:-1]):
        raise StoreError(f"{file}: removed IDs must be sorted ascending without duplicates; {hint}")
    if len(removed) and len(ids):  # a type whose every node was removed has no ids
        pos = np.minimum(np.searchsorted(ids, removed), len(ids) - 1)
        both = removed[ids[pos] == removed]
        if len(both):
            raise StoreError(
                f"{file}: {len(both)} removed IDs are also nodes of the store (first: "
                f"{both[0]!r}); {hint}"
            )


def check_edge_ids(edge_ids: np.ndarray, count: int, what: str) -> None:
    """Edge IDs must be a 1-D integer array of values in ``[0, count)`` (``what`` they are)."""
    if edge_ids.ndim != 1 or edge_ids.dtype.kind not in "iu":
        raise ValueError(
            f"edge_ids must be a 1-D integer array, got dtype {edge_ids.dtype} shape "
            f"{edge_ids.shape}"
        )
    if edge_ids.min() < 0 or edge_ids.max() >= count:
        raise ValueError(
            f"edge IDs must be {what} in [0, {count}), got values from {edge_ids.min()} to "
            f"{edge_ids.max()}"
        )


def node_key(id_kind: IdKind, x: object) -> int | bytes | None:
    """The canonical key of an external ID in a store of ``id_kind`` (None: cannot be an ID)."""
    return _as_int_id(x) if id_kind == "int" else _as_str_id(x)
