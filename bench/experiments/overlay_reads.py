"""How fast the overlay applies updates and reads changed nodes' in-lists, on a local base.

``python -m bench.experiments.overlay_reads`` on a synthetic graph (default 100,000 nodes, 1M
edges): replays 1,000 update requests of 10 operations each (edges added and removed, features
set) into a fresh overlay, then reads the in-lists of the changed nodes in batches of 256 and
samples [10, 10] from batches of 64 of them. Prints the best of ``--repeats`` runs of each.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from graph_assets import generate_synthetic, open_store
from graph_assets.live.operations import decode_operations
from graph_assets.live.overlay import GraphOverlay
from handler.sampling.arrays import readonly_tensor
from handler.sampling.sampler import NeighbourSampler


def requests(nodes: int, count: int, per_request: int, dim: int, seed: int) -> list[list[dict]]:
    """``count`` requests of ``per_request`` operations: mostly new edges, some removals of
    edges added earlier, some feature rows."""
    rng = random.Random(seed)
    added: list[tuple[int, int]] = []
    out = []
    for _ in range(count):
        operations: list[dict] = []
        for _ in range(per_request):
            roll = rng.random()
            if roll < 0.15 and added:
                src, dst = added.pop(rng.randrange(len(added)))
                operations.append({"type": "remove_edge", "src": src, "dst": dst})
            elif roll < 0.25:
                x = [rng.random() for _ in range(dim)]
                operations.append({"type": "set_features", "id": rng.randrange(nodes), "x": x})
            else:
                pair = (rng.randrange(nodes), rng.randrange(nodes))
                added.append(pair)
                operations.append({"type": "add_edge", "src": pair[0], "dst": pair[1]})
        out.append(operations)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=100_000, help="graph nodes")
    parser.add_argument("--edges", type=int, default=1_000_000, help="graph edges")
    parser.add_argument("--requests", type=int, default=1_000, help="update requests")
    parser.add_argument("--repeats", type=int, default=5, help="runs; the best is printed")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "store"
        generate_synthetic(args.nodes, args.edges, path, feature_dim=16, num_classes=3, seed=0)
        store = open_store(path)
        raw = requests(args.nodes, args.requests, 10, 16, seed=1)
        decoded = [decode_operations(operations, store) for operations in raw]
        replay, lists, sampling = [], [], []
        for _ in range(args.repeats):
            overlay = GraphOverlay(store)
            started = time.perf_counter()
            for seq, operations in enumerate(decoded, start=1):
                overlay.apply(operations, seq)
            replay.append(time.perf_counter() - started)
            changed = np.flatnonzero(overlay.dirty_mask(np.arange(store.num_nodes)))
            started = time.perf_counter()
            for start in range(0, len(changed), 256):
                overlay.in_lists(changed[start : start + 256])
            lists.append(time.perf_counter() - started)
            sampler = NeighbourSampler(
                readonly_tensor(store.indptr),
                readonly_tensor(store.indices),
                fanouts=[10, 10],
                seed=0,
                graph_key=0,
                max_nodes=1 << 30,
                max_edges=1 << 30,
                overlay=overlay,
            )
            started = time.perf_counter()
            for start in range(0, len(changed), 64):
                sampler.sample(torch.from_numpy(changed[start : start + 64]))
            sampling.append(time.perf_counter() - started)
    print(f"changed nodes: {len(changed)}")
    print(f"replay of {args.requests} requests: {min(replay) * 1e3:.1f} ms")
    print(f"in-lists of the changed nodes (256 a read): {min(lists) * 1e3:.1f} ms")
    print(f"[10, 10] samples from the changed nodes (64 a batch): {min(sampling) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
