"""Folds a base store and its update log into a new store, for the next archive version.

``python -m graph_assets.compact --store BASE --log STATE/<checksum>/updates.log --out NEW`` (or
``--log-url redis://host:port/db`` for a log on Redis, with ``GNNSERVE_REDIS_PASSWORD_FILE`` as
the servers have it) writes a fresh store (new checksum) while the running server keeps serving
BASE plus its log: nothing running is touched. Build the next version from it with
``./build_mar.sh --store NEW ...``. NEW continues the same log after the last record it folded
in (its meta.json ``update_log``), so both versions see every update sent to either, before and
after ``set-default``; compacting NEW again keeps that log (one log per lineage).

Edge features are carried through: every edge still in the graph keeps its current row (a base
edge its stored one or the one ``set_edge_features`` gave it, an edge added by an update the
``attr`` it was added with). Parallel edges keep their order, so a ``remove_edge`` after the
compaction takes the same edge on either version.
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
from graph_assets.log_lineage import open_update_log
from graph_assets.operations import decode_operations
from graph_assets.overlay import GraphOverlay
from graph_assets.redis_log import RedisLogConfig, RedisUpdateLog, open_redis_update_log, shown_url
from graph_assets.store import StoreMeta, open_store
from graph_assets.update_log import UpdateLog, check_next
from graph_assets.writer import (
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


def replay(store_dir: Path, log: Path | RedisLogConfig) -> Replayed:
    """The base store with every intact record of the log after the store's own applied (a
    log file, or the lineage's stream on Redis)."""
    overlay = GraphOverlay(open_store(store_dir))
    opened: UpdateLog | RedisUpdateLog
    if isinstance(log, RedisLogConfig):
        opened, start = open_redis_update_log(overlay.base, log)
    else:
        opened, start = open_update_log(overlay.base, log, writable=False)
    try:
        records, end = opened.read_from(start)
    finally:
        opened.close()
    for record in records:
        check_next(record, overlay.seq, opened.path)
        overlay.apply(decode_operations(record.operations, overlay.base), record.seq)
    return Replayed(overlay=overlay, log_end=end)


def compact(replayed: Replayed, out_dir: Path) -> StoreMeta:
    """Writes the graph ``replayed`` describes as a store at ``out_dir`` that continues the
    same update log after the records folded into it."""
    overlay, base = replayed.overlay, replayed.overlay.base
    if not base.schema.is_homogeneous:
        raise StoreError(
            "compaction of a store with several node types or relations is not available yet"
        )
    live = np.array(
        [n for n in range(overlay.num_nodes) if n not in overlay.removed], dtype=np.int64
    )
    keys = _external_keys(overlay, live)
    order = np.argsort(keys, kind="stable")
    nodes = live[order]
    position = np.full(overlay.num_nodes, -1, dtype=np.int64)
    position[nodes] = np.arange(len(nodes))
    src, dst, edge_ids = _edges(overlay, nodes)
    edge_features = overlay.edge_feature_rows(edge_ids) if base.edge_feature_dim else None
    labels = np.array(
        [
            int(base.labels[n]) if n < base.num_nodes else overlay.new_labels[n - base.num_nodes]
            for n in nodes.tolist()
        ],
        dtype=np.int64,
    )
    node = NodeTypeInput(base.schema.target, keys[order], base.feature_dim)
    with StoreBuilder(out_dir, [node]) as builder:
        step = feature_block_rows(base.feature_dim)
        for start in range(0, len(nodes), step):
            builder.add_features(overlay.feature_rows(nodes[start : start + step]))
        relation = base.schema.relations[0]
        edges = RelationInput(
            relation.edge_type,
            position[src],
            position[dst],
            edge_features,
            relation.edge_feature_names,
        )
        return builder.commit(
            [edges],
            labels,
            num_classes=base.num_classes,
            class_names=base.class_names,
            undirected=bool(base.meta["stats"].get("undirected", False)),
            continues=LogContinuation(
                update_log={"base": base.log_base, "seq": overlay.seq, "offset": replayed.log_end},
                removed_ids=(_removed_ids(overlay),),
            ),
        )


def _removed_ids(overlay: GraphOverlay) -> np.ndarray:
    """Every ID removed in the lineage so far, sorted: the base's and the overlay's."""
    removed = np.array(sorted(overlay.removed), dtype=np.int64)
    return np.unique(
        np.concatenate((np.asarray(overlay.base.removed_ids), _external_keys(overlay, removed)))
    )


def _external_keys(overlay: GraphOverlay, nodes: np.ndarray) -> np.ndarray:
    base = overlay.base
    values = overlay.external_ids(np.asarray(nodes, dtype=np.int64))
    if base.id_kind == "int":
        return np.array(values, dtype=np.int64)
    return np.array([str(v).encode("utf-8") for v in values], dtype=np.bytes_)


def _edges(overlay: GraphOverlay, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All current edges as ``(src, dst, edge ID)``: clean nodes' from the base CSC
    (vectorized; an edge's ID is its position), dirty ones' from the overlay, each in-list in
    its order (ascending source, parallel edges in ascending ID)."""
    base = overlay.base
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
    args = parser.parse_args(argv)
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
    return 0


def _redis_log(url: str) -> RedisLogConfig:
    environ = {**os.environ, "GNNSERVE_UPDATE_LOG_URL": url}
    config = RedisLogConfig.from_environment(environ)
    assert config is not None
    return config


if __name__ == "__main__":
    sys.exit(main())
