"""Write a graph store: CSC structure, node and edge features, IDs, labels, degrees, meta.json.

Everything is written into a temp dir beside the output, fsynced, hashed, and then swapped into
place in one rename, so a reader never sees a half-written store and a failed build leaves
nothing behind. `StoreBuilder` is the one code path; `write_store` feeds it a `TypedGraph` (a
`RawGraph` is its one-type case), the synthetic generator feeds it features chunk by chunk.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any, cast

import numpy as np

from graph_assets.errors import StoreError
from graph_assets.schema import EdgeType, GraphSchema, NodeType, Relation, check_name
from graph_assets.stored.store import (
    EDGE_ROWS_FILE,
    EDGE_TYPE_FILE,
    FORMAT_VERSION,
    META_FILE,
    FileMeta,
    StoreMeta,
    StoreStats,
    UpdateLogMeta,
    combined_checksum,
    edge_features_file,
    features_file,
    file_digests,
    ids_file,
    index_dtype,
    relation_bounds_file,
    removed_ids_file,
)
from graph_assets.tables import RawGraph, TypedGraph, as_typed

_FEATURE_BLOCK_BYTES = 64 << 20


@dataclass(frozen=True)
class LogContinuation:
    """What a compacted store records so that it continues its source's update log.

    Attributes:
        update_log: the lineage's log and the position after the last folded record.
        removed_ids: per node type, every ID removed so far (sorted, unique, the type's ``ids``
            dtype's kind), so the new store refuses to re-add them exactly as its source does.
    """

    update_log: UpdateLogMeta
    removed_ids: tuple[np.ndarray, ...]


@dataclass(frozen=True)
class NodeTypeInput:
    """One node type for `StoreBuilder`: its external IDs in internal order (int64 or UTF-8
    bytes ``S<k>``, strictly ascending: sorted order makes lookup a binary search) and its
    feature width (0: a featureless type)."""

    name: str
    ids: np.ndarray
    feature_dim: int


@dataclass(frozen=True)
class RelationInput:
    """One relation's edges for `StoreBuilder.commit`: global source and destination indices
    (``src -> dst``), and their features (``[E_r, len(edge_feature_names)]``, None: none)."""

    edge_type: EdgeType
    src: np.ndarray
    dst: np.ndarray
    edge_features: np.ndarray | None = None
    edge_feature_names: Sequence[str] = ()


def feature_block_rows(feature_dim: int) -> int:
    """Rows per `StoreBuilder.add_features` block: about 64 MiB, so memory stays bounded."""
    return max(1, _FEATURE_BLOCK_BYTES // (4 * max(1, feature_dim)))


class StoreBuilder:
    """Stages one store in a temp dir beside ``out_dir``; `commit` moves it into place.

    Use it as a context manager: leaving the block without a commit (an exception, say)
    removes the temp dir. Features stream in with `add_features` in internal order (``ids``
    order), type by type, block by block (`feature_block_rows` rows suit), so a large matrix
    never has to be held twice in memory.

    Args:
        out_dir: where the store goes. It may be absent, an empty directory or a previous
            store (replaced); anything else is refused with `StoreError` before work starts.
        node_types: the node types in global index order, the target (served) type first; a
            homogeneous graph has one. The first type needs at least one feature column.
    """

    def __init__(self, out_dir: Path, node_types: Sequence[NodeTypeInput]) -> None:
        if not node_types:
            raise ValueError("a store needs at least one node type")
        for node_type in node_types:
            check_name(node_type.name, "node type")
            ids = np.asarray(node_type.ids)
            if ids.ndim != 1 or not (ids.dtype == np.int64 or ids.dtype.kind == "S"):
                raise ValueError(
                    f"{node_type.name} ids must be a 1-D int64 or bytes (S<k>) array, got "
                    f"dtype {ids.dtype} shape {ids.shape}"
                )
            if not np.all(ids[1:] > ids[:-1]):
                raise ValueError(
                    f"{node_type.name} ids must be strictly ascending (sorted, no duplicates)"
                )
            if node_type.feature_dim < 0:
                raise ValueError(f"feature_dim must be >= 0, got {node_type.feature_dim}")
        if len(node_types[0].ids) == 0:
            raise ValueError(f"the target type {node_types[0].name} needs at least one node")
        if node_types[0].feature_dim < 1:
            raise ValueError(
                f"the target type {node_types[0].name} needs at least one feature column, got "
                f"feature_dim {node_types[0].feature_dim}"
            )
        self.out_dir = Path(out_dir)
        self.node_types = tuple(node_types)
        self._rows_written = [0] * len(node_types)
        _check_replaceable(self.out_dir)
        self.out_dir.parent.mkdir(parents=True, exist_ok=True)
        self._staging = Path(
            tempfile.mkdtemp(
                prefix=f".{self.out_dir.name}.", suffix=".tmp", dir=self.out_dir.parent
            )
        )
        self._features: list[IO[bytes]] | None = []
        try:
            # mkdtemp makes the dir private (0700); a store is read by other users' workers.
            self._staging.chmod(0o755)
            for index, node_type in enumerate(self.node_types):
                stream = (self._staging / features_file(index)).open("wb")
                self._features.append(stream)
                header = {
                    "descr": "<f4",
                    "fortran_order": False,
                    "shape": (len(node_type.ids), node_type.feature_dim),
                }
                np.lib.format.write_array_header_1_0(stream, header)
        except BaseException:
            self.abort()
            raise

    def __enter__(self) -> StoreBuilder:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.abort()

    def add_features(self, rows: np.ndarray, node_type: int = 0) -> None:
        """Append feature rows (any float dtype; stored float32) for the next nodes of
        ``node_type`` (its position in ``node_types``) in order."""
        if self._features is None:
            raise RuntimeError("this StoreBuilder was committed or aborted already")
        width, count = self.node_types[node_type].feature_dim, len(self.node_types[node_type].ids)
        block = np.ascontiguousarray(rows, dtype="<f4")
        if block.ndim != 2 or block.shape[1] != width:
            raise ValueError(f"feature rows must be [n, {width}], got {block.shape}")
        if self._rows_written[node_type] + len(block) > count:
            raise ValueError(
                f"got {self._rows_written[node_type] + len(block)} feature rows for {count} nodes"
            )
        if not np.isfinite(block).all():
            raise ValueError("features must be finite (no NaN or inf)")
        self._features[node_type].write(block.data)
        self._rows_written[node_type] += len(block)

    def commit(
        self,
        relations: Sequence[RelationInput],
        labels: np.ndarray,
        *,
        num_classes: int,
        class_names: Sequence[str] | None,
        undirected: bool,
        drop_self_loops: bool = False,
        drop_duplicate_edges: bool = False,
        continues: LogContinuation | None = None,
    ) -> StoreMeta:
        """Finish the store and move it into place; return its meta.

        Every edge is kept by default: self-loops, and parallel edges each at its own CSC
        position. A destination's in-list holds its relations' segments in ``relations``
        order; within a segment edges are in ascending source order, ties in input order.
        ``drop_self_loops`` drops self-loops and ``drop_duplicate_edges`` every repeat of an
        earlier edge's ``(src, dst)`` in the same relation (the first in input order stays);
        ``meta["stats"]`` counts what was kept and dropped. Edge features are stored per
        relation in CSC order. ``labels`` are the target type's class indices in internal
        order (-1 unlabelled); ``class_names[k]`` names class ``k``. ``undirected`` is only
        recorded: the caller has already added the reverse edges. ``continues`` (compaction
        only, default None) makes the store continue an update log.
        """
        if self._features is None:
            raise RuntimeError("this StoreBuilder was committed or aborted already")
        if not relations:
            raise ValueError("a store needs at least one relation (edge type), got none")
        for node_type, written in zip(self.node_types, self._rows_written, strict=True):
            if node_type.feature_dim and written != len(node_type.ids):
                count = len(node_type.ids)
                raise ValueError(
                    f"got {written} feature rows for {count} nodes of type {node_type.name}"
                )
        schema = self._schema(relations)
        n = schema.num_nodes
        labels = np.asarray(labels, dtype=np.int64)
        _check_inputs(schema, relations, labels, num_classes, class_names)
        edge_features = [
            _checked_edge_features(r.edge_features, r.edge_feature_names, len(r.src))
            for r in relations
        ]
        for stream in self._features:
            stream.flush()
            os.fsync(stream.fileno())
            stream.close()
        self._features = None

        csc = _csc(
            np.concatenate([np.asarray(r.src, dtype=np.int64) for r in relations]),
            np.concatenate([np.asarray(r.dst, dtype=np.int64) for r in relations]),
            n,
            np.repeat(np.arange(len(relations)), [len(r.src) for r in relations]),
            len(relations),
            drop_self_loops=drop_self_loops,
            drop_duplicate_edges=drop_duplicate_edges,
            need_order=len(relations) > 1 or any(f.shape[1] for f in edge_features),
        )
        indptr, indices = csc.indptr, csc.indices
        arrays: dict[str, np.ndarray] = {
            "in_degree.npy": np.diff(indptr).astype(np.int64),
            "indices.npy": indices,
            "indptr.npy": indptr,
            "labels.npy": labels,
            "out_degree.npy": np.bincount(indices, minlength=n).astype(np.int64),
        }
        arrays.update(_per_relation(schema, csc, relations, edge_features))
        for index, node_type in enumerate(self.node_types):
            arrays[ids_file(index)] = node_type.ids
            if continues is not None:
                arrays[removed_ids_file(index)] = continues.removed_ids[index]
        for name, array in arrays.items():
            _save(self._staging / name, array)
        names = {*arrays, *(features_file(i) for i in range(len(self.node_types)))}
        files = {name: _file_meta(self._staging / name) for name in sorted(names)}
        update_log = continues.update_log if continues is not None else None
        stats: StoreStats = {
            "input_edges": csc.input_edges,
            "self_loops_dropped": csc.self_loops_dropped,
            "duplicate_edges_dropped": csc.duplicate_edges_dropped,
            "self_loops_kept": csc.self_loops_kept,
            "duplicate_edges_kept": csc.duplicate_edges_kept,
            "undirected": undirected,
        }
        kept = _kept_schema(schema, csc)
        meta = cast(
            StoreMeta,
            {
                "format_version": FORMAT_VERSION,
                "num_nodes": n,
                "num_edges": len(indices),
                **kept.to_meta(),
                "num_classes": num_classes,
                "class_names": None if class_names is None else list(class_names),
                "files": files,
                "checksum": combined_checksum(
                    {name: f["sha256"] for name, f in files.items()}, update_log
                ),
                "stats": stats,
            },
        )
        if update_log is not None:
            meta["update_log"] = update_log
        with (self._staging / META_FILE).open("w", encoding="utf-8") as f:
            json.dump(meta, f, indent=2)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(self._staging)
        _move_into_place(self._staging, self.out_dir)
        _fsync_dir(self.out_dir.parent)
        return meta

    def _schema(self, relations: Sequence[RelationInput]) -> GraphSchema:
        """The schema of what is being written (relation counts as given, before drops)."""
        node_types, offset = [], 0
        for node_type in self.node_types:
            kind = "int" if node_type.ids.dtype.kind == "i" else "str"
            count = len(node_type.ids)
            node_types.append(NodeType(node_type.name, count, offset, node_type.feature_dim, kind))
            offset += count
        return GraphSchema(
            tuple(node_types),
            tuple(
                Relation(r.edge_type, len(r.src), tuple(r.edge_feature_names)) for r in relations
            ),
            self.node_types[0].name,
        )

    def abort(self) -> None:
        """Remove the temp dir unless the store was committed; safe to call more than once."""
        if self._features is not None:
            for stream in self._features:
                stream.close()
            self._features = None
        shutil.rmtree(self._staging, ignore_errors=True)


def write_store(
    raw: RawGraph | TypedGraph,
    out_dir: Path,
    *,
    drop_self_loops: bool = False,
    drop_duplicate_edges: bool = False,
) -> StoreMeta:
    """Write ``raw`` as a store at ``out_dir`` (replacing a previous store there); return meta.

    Each type's nodes are renumbered into sorted external-ID order so that lookups are binary
    searches, the target type first. Every edge is stored with its features, self-loops and
    parallel edges included, unless ``drop_self_loops`` / ``drop_duplicate_edges`` (both
    default False) drop them (of duplicates the first in input order stays);
    `StoreBuilder.commit` says how.
    """
    graph = raw if isinstance(raw, TypedGraph) else as_typed(raw)
    nodes = sorted(graph.node_types, key=lambda t: t.name != graph.target)  # target first
    ranks: dict[str, np.ndarray] = {}
    offsets: dict[str, int] = {}
    inputs, offset = [], 0
    for node_type in nodes:
        order = np.argsort(node_type.ids, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        ranks[node_type.name], offsets[node_type.name] = rank, offset
        inputs.append(NodeTypeInput(node_type.name, node_type.ids[order], node_type.feature_dim))
        offset += len(order)
    target = nodes[0]
    with StoreBuilder(out_dir, inputs) as builder:
        for index, node_type in enumerate(nodes):
            if not node_type.feature_dim:
                continue
            order = np.argsort(node_type.ids, kind="stable")
            rows = feature_block_rows(node_type.feature_dim)
            for start in range(0, len(order), rows):
                builder.add_features(node_type.features[order[start : start + rows]], index)
        relations = [
            RelationInput(
                edge_type=r.edge_type,
                src=offsets[r.edge_type.src] + ranks[r.edge_type.src][r.src],
                dst=offsets[r.edge_type.dst] + ranks[r.edge_type.dst][r.dst],
                edge_features=r.edge_features,
                edge_feature_names=r.edge_feature_names,
            )
            for r in graph.relations
        ]
        labels = np.full(len(target.ids), -1, dtype=np.int64)
        labels[ranks[target.name]] = graph.labels
        return builder.commit(
            relations,
            labels,
            num_classes=graph.num_classes,
            class_names=graph.class_names,
            undirected=graph.undirected,
            drop_self_loops=drop_self_loops,
            drop_duplicate_edges=drop_duplicate_edges,
        )


def _check_inputs(
    schema: GraphSchema,
    relations: Sequence[RelationInput],
    labels: np.ndarray,
    num_classes: int,
    class_names: Sequence[str] | None,
) -> None:
    for relation in relations:
        src, dst = np.asarray(relation.src), np.asarray(relation.dst)
        if src.shape != dst.shape or src.ndim != 1:
            raise ValueError(
                f"src and dst must be 1-D of one length, got {src.shape} and {dst.shape}"
            )
        for name, ends, end_type in (
            ("src", src, relation.edge_type.src),
            ("dst", dst, relation.edge_type.dst),
        ):
            node_type = schema.node_type(end_type)
            if ends.size and (ends.min() < node_type.offset or ends.max() >= node_type.stop):
                raise ValueError(
                    f"{relation.edge_type.name} {name} must hold global indices of "
                    f"{end_type} nodes, [{node_type.offset}, {node_type.stop})"
                )
    n = schema.target_type.num_nodes
    if labels.shape != (n,):
        raise ValueError(f"labels must have shape ({n},), got {labels.shape}")
    if labels.size and (labels.min() < -1 or labels.max() >= num_classes):
        raise ValueError(f"labels must be -1 or in [0, {num_classes}), num_classes={num_classes}")
    if class_names is not None and (
        len(class_names) != num_classes or len(set(class_names)) != num_classes
    ):
        raise ValueError(f"class_names must be {num_classes} distinct names, got {class_names}")


def _checked_edge_features(
    edge_features: np.ndarray | None, names: Sequence[str], num_edges: int
) -> np.ndarray:
    """``edge_features`` as float32 ``[num_edges, len(names)]`` (``[num_edges, 0]`` for None),
    refused unless it has that shape and is finite."""
    if edge_features is None:
        if names:
            raise ValueError(f"edge_feature_names {list(names)} given without edge_features")
        return np.empty((num_edges, 0), dtype=np.float32)
    if len(set(names)) != len(names):
        raise ValueError(f"edge_feature_names must be distinct, got {list(names)}")
    values = np.asarray(edge_features)
    if values.shape != (num_edges, len(names)):
        raise ValueError(
            f"edge_features must be [{num_edges}, {len(names)}] (one row per edge, one column "
            f"per name), got {list(values.shape)}"
        )
    with np.errstate(over="ignore"):
        values = values.astype("<f4", copy=False)
    if not np.isfinite(values).all():
        raise ValueError("edge features must be finite float32 values (no NaN or inf)")
    return values


@dataclass(frozen=True)
class _Csc:
    """The CSC arrays of an edge list and what building them kept and dropped.

    ``order[p]`` is the input position of the edge stored at CSC position ``p`` (None when
    not asked for: with one relation and no edge features nothing needs it); ``relation[p]``
    its relation (None with one relation)."""

    indptr: np.ndarray
    indices: np.ndarray
    order: np.ndarray | None
    relation: np.ndarray | None
    input_edges: int
    self_loops_dropped: int
    duplicate_edges_dropped: int
    self_loops_kept: int
    duplicate_edges_kept: int


def _csc(
    src: np.ndarray,
    dst: np.ndarray,
    n: int,
    relation: np.ndarray,
    num_relations: int,
    *,
    drop_self_loops: bool,
    drop_duplicate_edges: bool,
    need_order: bool,
) -> _Csc:
    """CSC arrays of the edge list, grouped by destination, then relation, ascending source
    within a group and ties (parallel edges) in input order; self-loops and repeats dropped
    if asked.

    One sort of the key ``(dst * R + relation) * n + src`` yields CSC order and puts repeats
    side by side. Only with ``need_order`` (edge features follow their edges) does it track
    positions, stably; else it is a plain in-place sort (equal keys are interchangeable then),
    half the time.
    """
    if n * n * num_relations >= 2**63:  # the keys would overflow int64
        raise ValueError(f"{n} nodes is more than this writer's int64 edge keys can address")
    keys = dst * num_relations
    if num_relations > 1:
        keys += relation
    keys *= n
    keys += src  # in place: one E-sized temporary at a time keeps 10M-edge builds small
    kept: np.ndarray | None = None  # input positions of the edges still in keys; None: all
    self_loops = int(np.count_nonzero(src == dst))
    if drop_self_loops and self_loops:
        kept = np.flatnonzero(src != dst)
        keys = keys[kept]
    order: np.ndarray | None = None
    if need_order:
        keys, order = _stable_sort(keys, n * n * num_relations)
        if kept is not None:
            order = kept[order]
    else:
        keys.sort()
    repeat = np.zeros(len(keys), dtype=bool)
    np.equal(keys[1:], keys[:-1], out=repeat[1:])
    duplicates = int(np.count_nonzero(repeat))
    if drop_duplicate_edges and duplicates:
        first = ~repeat
        keys = keys[first]
        if order is not None:
            order = order[first]
    group = keys // n
    indices = keys - group * n
    dst_sorted = group // num_relations
    in_degree = np.bincount(dst_sorted, minlength=n)
    indptr = np.zeros(n + 1, dtype=index_dtype(len(keys)))
    np.cumsum(in_degree, out=indptr[1:])
    return _Csc(
        indptr=indptr,
        indices=indices.astype(index_dtype(n)),
        order=order,
        relation=(group - dst_sorted * num_relations) if num_relations > 1 else None,
        input_edges=len(src),
        self_loops_dropped=self_loops if drop_self_loops else 0,
        duplicate_edges_dropped=duplicates if drop_duplicate_edges else 0,
        self_loops_kept=0 if drop_self_loops else int(np.count_nonzero(indices == dst_sorted)),
        duplicate_edges_kept=0 if drop_duplicate_edges else duplicates,
    )


def _per_relation(
    schema: GraphSchema,
    csc: _Csc,
    relations: Sequence[RelationInput],
    edge_features: list[np.ndarray],
) -> dict[str, np.ndarray]:
    """Each relation's edge features in CSC order; with several relations, each edge's
    relation and row, and each node type's relation bounds."""
    if csc.relation is None:
        features = edge_features[0]
        if csc.order is not None:
            # np.take, not fancy indexing: a quarter of its time for 10M rows.
            features = np.take(features, csc.order, axis=0)
        else:  # no edge features: only the row count follows the edges
            features = np.empty((len(csc.indices), 0), dtype=np.float32)
        return {edge_features_file(0): features}
    assert csc.order is not None
    arrays: dict[str, np.ndarray] = {EDGE_TYPE_FILE: csc.relation.astype("<i2")}
    rows = np.empty(len(csc.indices), dtype=index_dtype(len(csc.indices)))
    first_input = np.cumsum([0] + [len(r.src) for r in relations])
    for r, features in enumerate(edge_features):
        positions = np.flatnonzero(csc.relation == r)
        rows[positions] = np.arange(len(positions))
        arrays[edge_features_file(r)] = np.take(
            features, csc.order[positions] - first_input[r], axis=0
        )
    arrays[EDGE_ROWS_FILE] = rows
    for t, node_type in enumerate(schema.node_types):
        into = schema.relations_into(node_type.name)
        if len(into) < 2:
            continue
        begin, end = int(csc.indptr[node_type.offset]), int(csc.indptr[node_type.stop])
        dst = np.repeat(
            np.arange(node_type.num_nodes, dtype=np.int64),
            np.diff(csc.indptr[node_type.offset : node_type.stop + 1]),
        )
        slot = np.searchsorted(np.array(into), csc.relation[begin:end])
        counts = np.bincount(dst * len(into) + slot, minlength=node_type.num_nodes * len(into))
        bounds = np.zeros((node_type.num_nodes, len(into) + 1), dtype=csc.indptr.dtype)
        bounds[:, 0] = csc.indptr[node_type.offset : node_type.stop]
        bounds[:, 1:] = bounds[:, :1] + np.cumsum(counts.reshape(-1, len(into)), axis=1)
        arrays[relation_bounds_file(t)] = bounds
    return arrays


def _kept_schema(schema: GraphSchema, csc: _Csc) -> GraphSchema:
    """``schema`` with each relation's count of the edges kept."""
    if csc.relation is None:
        counts = [len(csc.indices)]
    else:
        counts = np.bincount(csc.relation, minlength=len(schema.relations)).tolist()
    return dataclasses.replace(
        schema,
        relations=tuple(
            dataclasses.replace(r, num_edges=int(c))
            for r, c in zip(schema.relations, counts, strict=True)
        ),
    )


def _stable_sort(keys: np.ndarray, limit: int) -> tuple[np.ndarray, np.ndarray]:
    """``keys`` (in ``[0, limit)``) sorted, and the stable argsort that sorts them.

    Where a key and its position fit in 64 bits together, one in-place sort of the packed
    pairs gives both: measured on 10M edges, 0.6 s against 4 s for
    ``np.argsort(kind="stable")``, which is what larger graphs use.
    """
    position_bits = max(1, (len(keys) - 1).bit_length())
    if (max(1, limit - 1).bit_length() + position_bits) > 64:
        order = np.argsort(keys, kind="stable")
        return keys[order], order
    packed = keys.astype(np.uint64) << np.uint64(position_bits)
    packed |= np.arange(len(keys), dtype=np.uint64)
    packed.sort()
    order = (packed & np.uint64((1 << position_bits) - 1)).astype(np.int64)
    packed >>= np.uint64(position_bits)
    return packed.astype(np.int64), order


def _save(path: Path, array: np.ndarray) -> None:
    with path.open("wb") as f:
        np.save(f, array, allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())


def _file_meta(path: Path) -> FileMeta:
    array = np.load(path, mmap_mode="r", allow_pickle=False)
    return {
        "dtype": array.dtype.str,
        "shape": list(array.shape),
        "bytes": path.stat().st_size,
        **file_digests(path),
    }


def _fsync_dir(path: Path) -> None:
    """Make renames and new entries in ``path`` durable (a no-op where dirs cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _is_store(path: Path) -> bool:
    try:
        meta = json.loads((path / META_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(meta, dict) and "format_version" in meta


def _check_replaceable(out_dir: Path) -> None:
    """Refuse to replace anything but a previous store or an empty directory."""
    if not out_dir.exists() and not out_dir.is_symlink():
        return
    if (
        out_dir.is_dir()
        and not out_dir.is_symlink()
        and (_is_store(out_dir) or not any(out_dir.iterdir()))
    ):
        return
    raise StoreError(
        f"{out_dir} exists and is not a graph store (no readable {META_FILE}); refusing to "
        f"replace it. Choose a new output path or remove {out_dir} first."
    )


def _move_into_place(staged: Path, out_dir: Path) -> None:
    """Rename ``staged`` to ``out_dir``, replacing a previous store there atomically if possible."""
    if not out_dir.exists():
        os.rename(staged, out_dir)
        return
    if _exchange(staged, out_dir):
        shutil.rmtree(staged)  # now holds the previous store
        return
    # No atomic exchange on this system: move the old store aside first, so that a crash
    # between the two renames leaves it recoverable beside out_dir rather than lost.
    previous = staged.with_name(staged.name + ".old")
    os.rename(out_dir, previous)
    os.rename(staged, out_dir)
    shutil.rmtree(previous)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    if sys.platform != "linux":
        return False
    renameat2: Any = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:  # glibc older than 2.28
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL):  # kernel or filesystem without RENAME_EXCHANGE
        return False
    raise OSError(err, os.strerror(err), str(b))
