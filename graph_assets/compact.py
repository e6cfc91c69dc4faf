"""Folds a base store and its update log into a new store, for the next archive version.

``python -m graph_assets.compact --store BASE --log STATE/<checksum>/updates.log --out NEW`` (or
``--log-url redis://host:port/db`` for a log on Redis, with ``GNNSERVE_REDIS_PASSWORD_FILE`` as
the servers have it) writes a fresh store (new checksum) while the running server keeps serving
BASE plus its log: nothing running is touched. Build the next version from it with
``./build_mar.sh --store NEW ...``. NEW continues the same log after the last record it folded
in (its meta.json ``update_log``), so both versions see every update sent to either, before and
after ``set-default``; compacting NEW again keeps that log (one log per lineage). With
``--redis-url URL --redis-prefix NAME`` NEW is also loaded into a Redis Cluster (or a single
Redis) under NAME, as ``python -m graph_assets load-redis`` does, for ``./build_mar.sh
--store NEW --graph-location redis://host:port/NAME``.

A graph of several node types and relations is compacted as a one-type graph is (the one-type
case of the same code): each type keeps its own IDs, features and removed IDs, each relation
its edges and edge features. Edge features are carried through: every edge still in the graph
keeps its current row (a base edge its stored one or the one ``set_edge_features`` gave it, an
edge added by an update the ``attr`` it was added with). Parallel edges keep their order, so a
``remove_edge`` after the compaction takes the same edge on either version.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from graph_assets.errors import StoreError
from graph_assets.live.log_lineage import open_update_log
from graph_assets.live.operations import decode_operations
from graph_assets.live.overlay import GraphOverlay
from graph_assets.live.redis_log import (
    RedisLogConfig,
    RedisUpdateLog,
    open_redis_update_log,
    shown_url,
)
from graph_assets.live.update_log import UpdateLog, check_next
from graph_assets.remote.cli import load_into_redis, prefix_argument
from graph_assets.remote.errors import RemoteGraphError, RemoteUnavailable
from graph_assets.stored.store import GraphStore, StoreMeta, open_store
from graph_assets.stored.writer import (
    LogContinuation,
    NodeTypeInput,
    RelationInput,
    StoreBuilder,
    feature_block_rows,
)


@dataclass(frozen=True)
class Replayed:
    """A store with its log applied, and the log's position after the last record applied
    (a byte offset in a log file, a seq on Redis)."""

    overlay: GraphOverlay
    log_end: int
    base: GraphStore  # the overlay's base: compaction reads its arrays, not only the view


def replay(store_dir: Path, log: Path | RedisLogConfig) -> Replayed:
    """The base store with every intact record of the log after the store's own applied (a
    log file, or the lineage's stream on Redis)."""
    base = open_store(store_dir)
    overlay = GraphOverlay(base)
    opened: UpdateLog | RedisUpdateLog
    if isinstance(log, RedisLogConfig):
        opened, start = open_redis_update_log(base, log)
    else:
        opened, start = open_update_log(base, log, writable=False)
    try:
        records, end = opened.read_from(start)
    finally:
        opened.close()
    for record in records:
        check_next(record, overlay.seq, opened.path)
        overlay.apply(decode_operations(record.operations, base), record.seq)
    return Replayed(overlay=overlay, log_end=end, base=base)


def compact(replayed: Replayed, out_dir: Path) -> StoreMeta:
    """Writes the graph ``replayed`` describes as a store at ``out_dir`` that continues the
    same update log after the records folded into it: each node type's live nodes (added ones
    included, in sorted ID order as a build writes them), each relation's live edges with
    their current features, the target type's labels, and every ID removed so far."""
    overlay, base = replayed.overlay, replayed.base
    schema = base.schema
    _check_indices_kept(overlay)
    types = _live_nodes(overlay)
    nodes = np.concatenate([t.nodes for t in types])
    position = np.full(overlay.num_nodes, -1, dtype=np.int64)
    position[nodes] = np.arange(len(nodes))
    src, dst, edge_ids = _edges(overlay, base, nodes)
    edge_relations = overlay.edge_relations(edge_ids)
    inputs = [
        NodeTypeInput(node_type.name, t.ids, node_type.feature_dim)
        for node_type, t in zip(schema.node_types, types, strict=True)
    ]
    with StoreBuilder(out_dir, inputs) as builder:
        for index, (node_type, t) in enumerate(zip(schema.node_types, types, strict=True)):
            if not node_type.feature_dim:
                continue
            step = feature_block_rows(node_type.feature_dim)
            for start in range(0, len(t.nodes), step):
                builder.add_features(overlay.feature_rows(t.nodes[start : start + step]), index)
        relations = []
        for r, relation in enumerate(schema.relations):
            mine = edge_relations == r
            relations.append(
                RelationInput(
                    relation.edge_type,
                    position[src[mine]],
                    position[dst[mine]],
                    _edge_features(overlay, edge_ids[mine], relation.edge_feature_dim),
                    relation.edge_feature_names,
                )
            )
        return builder.commit(
            relations,
            _labels(overlay, base, types[0].nodes),
            num_classes=base.num_classes,
            class_names=base.class_names,
            undirected=bool(base.meta["stats"].get("undirected", False)),
            continues=LogContinuation(
                update_log={"base": base.log_base, "seq": overlay.seq, "offset": replayed.log_end},
                removed_ids=_removed_ids(overlay, base),
            ),
        )


def _check_indices_kept(overlay: GraphOverlay) -> None:
    """Refuses a log that removed nodes of a featureless type: a model tells such nodes apart
    by their index within the type (an embedding row), which dropping some would shift, so
    the compacted store would answer otherwise than base + log."""
    removed = np.array(sorted(overlay.removed), dtype=np.int64)
    types = overlay.types_of(removed)
    for index, node_type in enumerate(overlay.schema.node_types):
        gone = removed[types == index]
        if node_type.feature_dim == 0 and len(gone):
            [first] = overlay.external_ids(gone[:1])
            raise StoreError(
                f"the update log removed {len(gone)} {node_type.name} node(s) (first: "
                f"{first!r}); {node_type.name} has no features, so a model tells its nodes "
                "apart by their index within the type, which compaction would shift: keep "
                "serving this store with its log"
            )


@dataclass(frozen=True)
class _TypeNodes:
    """One node type's live nodes (overlay indices) in the new store's order, and their IDs
    as the store keeps them (int64 or UTF-8 bytes), ascending."""

    nodes: np.ndarray
    ids: np.ndarray


def _live_nodes(overlay: GraphOverlay) -> list[_TypeNodes]:
    """Each node type's live nodes, base and added, sorted by ID (schema order: target first)."""
    every = np.arange(overlay.num_nodes, dtype=np.int64)
    live = ~np.isin(every, np.fromiter(overlay.removed, dtype=np.int64))
    types = overlay.types_of(every)
    found = []
    for index in range(len(overlay.schema.node_types)):
        nodes = every[live & (types == index)]
        keys = _external_keys(overlay, nodes, index)
        order = np.argsort(keys, kind="stable")
        found.append(_TypeNodes(nodes[order], keys[order]))
    return found


def _labels(overlay: GraphOverlay, base: GraphStore, targets: np.ndarray) -> np.ndarray:
    """The class index of each target-type node: stored, or given by the update that added it."""
    stored = base.num_nodes
    added = targets >= stored
    labels = np.empty(len(targets), dtype=np.int64)
    labels[~added] = base.labels[targets[~added]]  # the target type starts at 0
    labels[added] = np.asarray(overlay.new_labels, dtype=np.int64)[targets[added] - stored]
    return labels


def _edge_features(overlay: GraphOverlay, edge_ids: np.ndarray, width: int) -> np.ndarray | None:
    """The current features of one relation's edges (None for a relation without any)."""
    if not width:
        return None
    if not len(edge_ids):  # the view cannot tell the relation of no edges, nor its width
        return np.empty((0, width), dtype=np.float32)
    return overlay.edge_feature_rows(edge_ids)


def _removed_ids(overlay: GraphOverlay, base: GraphStore) -> tuple[np.ndarray, ...]:
    """Per node type, every ID removed in the lineage so far, sorted: the base's and the
    overlay's."""
    removed = np.array(sorted(overlay.removed), dtype=np.int64)
    types = overlay.types_of(removed)
    return tuple(
        np.unique(
            np.concatenate(
                (
                    np.asarray(base.tables[index].removed_ids),
                    _external_keys(overlay, removed[types == index], index),
                )
            )
        )
        for index in range(len(overlay.schema.node_types))
    )


def _external_keys(overlay: GraphOverlay, nodes: np.ndarray, node_type: int) -> np.ndarray:
    """The IDs of ``nodes`` (all of ``node_type``) as a store keeps them."""
    values = overlay.external_ids(np.asarray(nodes, dtype=np.int64))
    if overlay.schema.node_types[node_type].id_kind == "int":
        return np.array(values, dtype=np.int64)
    return np.array([str(v).encode("utf-8") for v in values], dtype=np.bytes_)


def _edges(
    overlay: GraphOverlay, base: GraphStore, nodes: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All current edges into ``nodes`` as ``(src, dst, edge ID)``: clean nodes' from the base
    CSC (vectorized; an edge's ID is its position), dirty ones' from the overlay, each in-list
    in its order (by relation, ascending source within one, parallel edges in ascending ID)."""
    dirty = overlay.dirty_mask(nodes)
    clean = nodes[~dirty]
    counts = base.indptr[clean + 1] - base.indptr[clean]
    starts = np.repeat(base.indptr[clean], counts)
    offsets = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    positions = np.asarray(starts + offsets, dtype=np.int64)
    src = [np.asarray(base.indices[positions], dtype=np.int64)]
    dst = [np.repeat(clean, counts)]
    edge_ids = [positions]
    changed = nodes[dirty]
    lists = overlay.in_edges(changed)
    src.append(lists.indices)
    dst.append(np.repeat(changed, np.diff(lists.indptr)))
    edge_ids.append(lists.edge_ids)
    return np.concatenate(src), np.concatenate(dst), np.concatenate(edge_ids)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m graph_assets.compact", description=__doc__)
    parser.add_argument("--store", type=Path, required=True, help="the base store")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--log", type=Path, help="its updates.log")
    source.add_argument("--log-url", help="or its log on Redis: redis://host:port/db")
    parser.add_argument("--out", type=Path, required=True, help="directory of the new store")
    parser.add_argument(
        "--redis-url",
        metavar="URL",
        help="also load the new store into this Redis Cluster or single Redis (redis[s]://"
        "host:port; the password from GNNSERVE_REDIS_PASSWORD_FILE), as load-redis does",
    )
    parser.add_argument(
        "--redis-prefix",
        type=prefix_argument,
        metavar="NAME",
        help="with --redis-url: the new graph's name there (required: the old graph's name "
        "holds the old graph, which serving archives still read)",
    )
    args = parser.parse_args(argv)
    if (args.redis_url is None) != (args.redis_prefix is None):
        parser.error("--redis-url and --redis-prefix go together")
    started = time.perf_counter()
    try:
        log = args.log if args.log is not None else _redis_log(args.log_url)
        replayed = replay(args.store, log)
        meta = compact(replayed, args.out)
    except (StoreError, ValueError, OSError) as error:  # a missing log, a damaged one, ...
        print(f"error: {error}", file=sys.stderr)
        return 2
    seq = replayed.overlay.seq
    print(
        f"compacted {args.store} + updates up to seq {seq} -> {args.out}: {meta['num_nodes']} "
        f"nodes, {meta['num_edges']} edges, checksum {meta['checksum']}; it continues "
        f"{args.log or shown_url(args.log_url)} at seq {seq + 1} "
        f"({time.perf_counter() - started:.1f} s)"
    )
    if args.redis_url is None:
        return 0
    try:
        print(load_into_redis(args.out, args.redis_url, args.redis_prefix))
    except (RemoteGraphError, RemoteUnavailable) as error:
        print(
            f"error: {error} (the store at {args.out} is written; load-redis it)", file=sys.stderr
        )
        return 2
    return 0


def _redis_log(url: str) -> RedisLogConfig:
    environ = {**os.environ, "GNNSERVE_UPDATE_LOG_URL": url}
    config = RedisLogConfig.from_environment(environ)
    assert config is not None
    return config


if __name__ == "__main__":
    sys.exit(main())
