"""Folds a base store and its update log into a new store, for the next archive version.

``python -m graph_assets.compact --store BASE --log STATE/<checksum>/updates.log --out NEW``
writes a fresh store (new checksum, so a fresh, empty update log) while the running server keeps
serving BASE plus its log: nothing running is touched. Build the next version from it with
``./build_mar.sh --store NEW ...``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from graph_assets.errors import StoreError
from graph_assets.overlay import GraphOverlay
from graph_assets.store import StoreMeta, open_store
from graph_assets.update_log import UpdateLog
from graph_assets.writer import StoreBuilder, feature_block_rows


def replay(store_dir: Path, log_path: Path) -> GraphOverlay:
    """The base store with every intact record of the log applied."""
    overlay = GraphOverlay(open_store(store_dir))
    records, _ = UpdateLog.open(log_path).read_from(0)
    for record in records:
        overlay.apply(record.operations, record.seq)
    return overlay


def compact(overlay: GraphOverlay, out_dir: Path) -> StoreMeta:
    """Writes the graph ``overlay`` describes as a plain store at ``out_dir``."""
    base = overlay.base
    live = np.array(
        [n for n in range(overlay.num_nodes) if n not in overlay.removed], dtype=np.int64
    )
    keys = _external_keys(overlay, live)
    order = np.argsort(keys, kind="stable")
    nodes = live[order]
    position = np.full(overlay.num_nodes, -1, dtype=np.int64)
    position[nodes] = np.arange(len(nodes))
    src, dst = _edges(overlay, nodes)
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
        )


def _external_keys(overlay: GraphOverlay, nodes: np.ndarray) -> np.ndarray:
    base = overlay.base
    values = [overlay.external_id(int(n)) for n in nodes]
    if base.id_kind == "int":
        return np.array(values, dtype=np.int64)
    return np.array([str(v).encode("utf-8") for v in values])


def _edges(overlay: GraphOverlay, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All current edges: clean nodes' from the base CSC (vectorized), dirty ones' from the
    overlay."""
    base = overlay.base
    dirty = overlay.dirty_mask(nodes)
    clean = nodes[~dirty]
    counts = base.indptr[clean + 1] - base.indptr[clean]
    starts = np.repeat(base.indptr[clean], counts)
    offsets = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    src = [np.asarray(base.indices[starts + offsets], dtype=np.int64)]
    dst = [np.repeat(clean, counts)]
    changed = nodes[dirty]
    lists = overlay.in_edges(changed)
    src.append(lists.indices)
    dst.append(np.repeat(changed, np.diff(lists.indptr)))
    return np.concatenate(src), np.concatenate(dst)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m graph_assets.compact", description=__doc__)
    parser.add_argument("--store", type=Path, required=True, help="the base store")
    parser.add_argument("--log", type=Path, required=True, help="its updates.log")
    parser.add_argument("--out", type=Path, required=True, help="directory of the new store")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    try:
        overlay = replay(args.store, args.log)
        meta = compact(overlay, args.out)
    except (StoreError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(
        f"compacted {args.store} + {overlay.seq} updates -> {args.out}: {meta['num_nodes']} "
        f"nodes, {meta['num_edges']} edges, checksum {meta['checksum']} "
        f"({time.perf_counter() - started:.1f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
