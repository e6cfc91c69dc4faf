"""The updated graph as a test sees it: which IDs a live graph holds, random valid updates of
it, and PyG's full-graph forward on it (the reference every served answer is held to)."""

from __future__ import annotations

import random

import numpy as np
import torch

from handler.live.live_graph import LiveGraph


def live_ids(live: LiveGraph) -> list:
    overlay = live.overlay
    kept = [n for n in range(overlay.num_nodes) if n not in overlay.removed]
    ids = overlay.external_ids(np.array(kept, dtype=np.int64))
    return [i for i in ids if overlay.lookup([i])[0] >= 0]


def random_update(rng: random.Random, live: LiveGraph, counter: list[int]) -> list[dict]:
    ids = live_ids(live)
    x = [rng.uniform(-1, 1) for _ in range(live.store.feature_dim)]
    kind = rng.choices(
        ["add_node", "add_edge", "remove_edge", "set_features", "remove_node"], [2, 5, 2, 1, 1]
    )[0]
    if kind == "add_node":
        counter[0] += 3
        return [{"type": kind, "id": 10_000 + counter[0], "x": x}]
    if kind == "set_features":
        return [{"type": kind, "id": rng.choice(ids), "x": x}]
    if kind == "remove_node":
        return [{"type": kind, "id": rng.choice(ids)}]
    dst = rng.choice(ids)
    node = int(live.overlay.lookup([dst])[0])
    sources = live.overlay.external_ids(live.overlay.in_list(node))
    if kind == "remove_edge" and sources:
        return [{"type": kind, "src": rng.choice(sources), "dst": dst}]
    candidates = [i for i in ids if i != dst and i not in sources]
    return [{"type": "add_edge", "src": rng.choice(candidates), "dst": dst}]


def materialized_forward(live: LiveGraph, model) -> tuple[list, torch.Tensor]:
    """The updated graph as plain tensors, and PyG's full-graph forward on it."""
    overlay = live.overlay
    ids = live_ids(live)
    nodes = overlay.lookup(ids)
    position = {int(n): i for i, n in enumerate(nodes)}
    x = torch.from_numpy(overlay.feature_rows(nodes))
    src, dst = [], []
    for node in nodes.tolist():
        for source in overlay.in_list(node).tolist():
            src.append(position[source])
            dst.append(position[node])
    edge_index = torch.tensor([src, dst], dtype=torch.int64)
    with torch.no_grad():
        return ids, torch.softmax(model(x, edge_index), dim=-1)


def materialized_embeddings(live: LiveGraph, model) -> tuple[list, torch.Tensor, list]:
    """Live IDs, the link encoder's full-graph embeddings of the updated graph, its edges."""
    overlay = live.overlay
    ids = live_ids(live)
    nodes = overlay.lookup(ids)
    position = {int(n): i for i, n in enumerate(nodes)}
    x = torch.from_numpy(overlay.feature_rows(nodes))
    edges = [
        (position[source], position[node])
        for node in nodes.tolist()
        for source in overlay.in_list(node).tolist()
    ]
    edge_index = torch.tensor(edges, dtype=torch.int64).T.reshape(2, -1)
    with torch.no_grad():
        return ids, model(x, edge_index), edges
