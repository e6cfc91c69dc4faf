"""A graph with edge features, self-loops, parallel edges, a hub and isolated nodes, as a user's
transaction graph has them (edges.csv with amount and timestamp columns)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from graph_assets import GraphStore, open_store, read_graph_dir, write_store

NODES, FEATURES, CLASSES, EDGE_DIM = 90, 6, 3, 2


def write_edge_feature_csv(directory: Path, seed: int = 7) -> Path:
    """nodes.csv and edges.csv (src, dst, amount, timestamp) in ``directory``."""
    rng = np.random.default_rng(seed)
    nodes = pd.DataFrame(
        rng.normal(size=(NODES, FEATURES)), columns=[f"f{i}" for i in range(FEATURES)]
    )
    nodes.insert(0, "id", [f"acct_{i}" for i in range(NODES)])
    nodes["label"] = [["fraud", "legit", "review"][i % CLASSES] for i in range(NODES)]
    connected = NODES - 5  # the last five have no edges
    src = rng.integers(0, connected, 600)
    dst = np.where(rng.random(600) < 0.2, 0, rng.integers(0, connected, 600))  # node 0: a hub
    src[:12] = dst[:12]  # self-loops
    src, dst = np.concatenate([src, src[20:40]]), np.concatenate([dst, dst[20:40]])  # parallel
    edges = pd.DataFrame({"src": [f"acct_{s}" for s in src], "dst": [f"acct_{d}" for d in dst]})
    edges["amount"] = rng.gamma(2.0, 50.0, len(edges)).round(2)
    edges["timestamp"] = rng.integers(0, 10_000, len(edges))
    directory.mkdir(parents=True, exist_ok=True)
    nodes.to_csv(directory / "nodes.csv", index=False)
    edges.to_csv(directory / "edges.csv", index=False)
    return directory


def edge_feature_store(root: Path) -> GraphStore:
    """The graph above, written as a store under ``root``."""
    write_store(read_graph_dir(write_edge_feature_csv(root / "input")), root / "store")
    return open_store(root / "store")
