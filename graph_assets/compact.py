"""Folds a base store and its update log into a new store, for the next archive version.

``python -m graph_assets.compact --store BASE --log STATE/<checksum>/updates.log --out NEW`` (or
``--log-url redis://host:port/db`` for a log on Redis, with ``GNNSERVE_REDIS_PASSWORD_FILE`` as
the servers have it) writes a fresh store (new checksum) while the running server keeps serving
BASE plus its log: nothing running is touched. Build the next version from it with
``./build_mar.sh --store NEW ...``. NEW continues the same log after the last record it folded
in (its meta.json ``update_log``), so both versions see every update sent to either, before and
after ``set-default``; compacting NEW again keeps that log (one log per lineage).

Edge features are carried through: each base edge still in the graph keeps its row, and an
edge added by an update (updates carry no edge features yet) gets a row of zeros. An edge that
an update removed and a later one added again is such a new edge.
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
from graph_assets.overlay import GraphOverlay
from graph_assets.redis_log import RedisLogConfig, RedisUpdateLog, open_redis_update_log, shown_url
from graph_assets.store import GraphStore, StoreMeta, open_store
from graph_assets.update_log import UpdateLog, check_next
from graph_assets.writer import LogContinuation, StoreBuilder, feature_block_rows


@dataclass(frozen=True)
class Replayed:
    """A store with its log applied, and the log's position after the last record applied
    (a byte offset in a log file, a seq on Redis). ``removed_edges`` holds the base ``(src,
    dst)`` index pairs some applied ``remove_edge`` named: none of their base edges is left,
    so such an edge in the graph now was added by an update."""

    overlay: GraphOverlay
    log_end: int
    removed_edges: frozenset[tuple[int, int]] = frozenset()


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
    removals: list[tuple[int | str, int | str]] = []
    for record in records:
        check_next(record, overlay.seq, opened.path)
        overlay.apply(record.operations, record.seq)
        removals.extend(
            (op["src"], op["dst"]) for op in record.operations if op["type"] == "remove_edge"
        )
    return Replayed(overlay=overlay, log_end=end, removed_edges=_base_pairs(overlay.base, removals))


def _base_pairs(
    base: GraphStore, pairs: list[tuple[int | str, int | str]]
) -> frozenset[tuple[int, int]]:
    """The ``(src, dst)`` ID pairs as base indices, leaving out pairs with a node not in the
    base (IDs are never reused, so an ID names the same base node for the whole log)."""
    if not pairs:
        return frozenset()
    src = base.lookup([s for s, _ in pairs]).tolist()
    dst = base.lookup([d for _, d in pairs]).tolist()
    return frozenset((s, d) for s, d in zip(src, dst, strict=True) if s >= 0 and d >= 0)


def compact(replayed: Replayed, out_dir: Path) -> StoreMeta:
    """Writes the graph ``replayed`` describes as a store at ``out_dir`` that continues the
    same update log after the records folded into it."""
    overlay, base = replayed.overlay, replayed.overlay.base
    live = np.array(
        [n for n in range(overlay.num_nodes) if n not in overlay.removed], dtype=np.int64
    )
    keys = _external_keys(overlay, live)
    order = np.argsort(keys, kind="stable")
    nodes = live[order]
    position = np.full(overlay.num_nodes, -1, dtype=np.int64)
    position[nodes] = np.arange(len(nodes))
    src, dst, origin = _edges(overlay, nodes, replayed.removed_edges)
    edge_features = None
    if base.edge_feature_dim:
        edge_features = np.zeros((len(src), base.edge_feature_dim), dtype=np.float32)
        carried = origin >= 0
        edge_features[carried] = base.edge_feature_rows(origin[carried])
    labels = np.array(
        [
            int(base.labels[n]) if n < base.num_nodes else overlay.new_labels[n - base.num_nodes]
            for n in nodes.tolist()
        ],
        dtype=np.int64,
    )
    with StoreBuilder(out_dir, keys[order], base.feature_dim) as builder:
        step = feature_block_rows(base.feature_dim)
        for start in range(0, len(nodes), step):
            builder.add_features(overlay.feature_rows(nodes[start : start + step]))
        return builder.commit(
            position[src],
            position[dst],
            labels,
            num_classes=base.num_classes,
            class_names=base.class_names,
            undirected=bool(base.meta["stats"].get("undirected", False)),
            edge_features=edge_features,
            edge_feature_names=base.edge_feature_names,
            continues=LogContinuation(
                update_log={"base": base.log_base, "seq": overlay.seq, "offset": replayed.log_end},
                removed_ids=_removed_ids(overlay),
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


def _edges(
    overlay: GraphOverlay, nodes: np.ndarray, removed_edges: frozenset[tuple[int, int]]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All current edges as ``(src, dst, origin)``, ``origin`` being each edge's base CSC
    position (-1 for an edge added by an update): clean nodes' from the base CSC (vectorized),
    dirty ones' from the overlay."""
    base = overlay.base
    dirty = overlay.dirty_mask(nodes)
    clean = nodes[~dirty]
    counts = base.indptr[clean + 1] - base.indptr[clean]
    starts = np.repeat(base.indptr[clean], counts)
    offsets = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    positions = np.asarray(starts + offsets, dtype=np.int64)
    src = [np.asarray(base.indices[positions], dtype=np.int64)]
    dst = [np.repeat(clean, counts)]
    origin = [positions]
    changed = nodes[dirty]
    lists = overlay.in_edges(changed)
    src.append(lists.indices)
    dst.append(np.repeat(changed, np.diff(lists.indptr)))
    for i, node in enumerate(changed.tolist()):
        current = lists.indices[lists.indptr[i] : lists.indptr[i + 1]]
        origin.append(_base_positions(base, node, current, removed_edges))
    return np.concatenate(src), np.concatenate(dst), np.concatenate(origin)


def _base_positions(
    base: GraphStore, node: int, current: np.ndarray, removed_edges: frozenset[tuple[int, int]]
) -> np.ndarray:
    """Base CSC position of each in-edge of ``node`` in its in-list now (ascending sources),
    -1 for an edge an update added. A source's base edges into ``node`` are all still there
    unless a ``remove_edge`` took them, since ``add_edge`` refuses an edge that exists and
    removals take every parallel copy: so they match the list's copies one to one, in order."""
    origin = np.full(len(current), -1, dtype=np.int64)
    if node >= base.num_nodes:
        return origin
    start, end = int(base.indptr[node]), int(base.indptr[node + 1])
    before = np.asarray(base.indices[start:end], dtype=np.int64)
    kept = np.isin(current, before)
    if removed_edges:
        kept &= np.array([(s, node) not in removed_edges for s in current.tolist()], dtype=bool)
    matches = start + np.flatnonzero(np.isin(before, current[kept]))
    if len(matches) != int(kept.sum()):
        raise StoreError(
            f"node {node}'s in-edges after the updates do not extend its base in-edges "
            f"({int(kept.sum())} base edges kept, {len(matches)} found); the update log does "
            "not belong to this store"
        )
    origin[kept] = matches
    return origin


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
