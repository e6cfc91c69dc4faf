"""The updated graph as a test sees it: which IDs a live graph holds, random valid updates of
it, and PyG's full-graph forward on it (the reference every served answer is held to)."""

from __future__ import annotations

import random

import numpy as np
import torch

from handler.live.live_graph import LiveGraph
from model.served import EdgeInput, serving_needs


def live_ids(live: LiveGraph) -> list:
    overlay = live.overlay
    kept = [n for n in range(overlay.num_nodes) if n not in overlay.removed]
    ids = overlay.external_ids(np.array(kept, dtype=np.int64))
    found = overlay.lookup(ids) if ids else np.empty(0, dtype=np.int64)
    return [i for i, node in zip(ids, found.tolist(), strict=True) if node >= 0]


def random_update(rng: random.Random, live: LiveGraph, counter: list[int]) -> list[dict]:
    """One valid update: any pair may get an edge (self-loops and parallel edges too), and on
    a graph with edge features edges carry ``attr`` and some updates set an edge's features.
    Valid on the graph as the log has it now: ``live`` first applies what others appended."""
    live.sync()
    ids = live_ids(live)
    x = [rng.uniform(-1, 1) for _ in range(live.store.feature_dim)]
    width = live.store.edge_feature_dim
    attr = {"attr": [rng.uniform(-2, 2) for _ in range(width)]} if width else {}
    kind = rng.choices(
        ["add_node", "add_edge", "remove_edge", "set_features", "remove_node", "set_edge_features"],
        [2, 5, 2, 1, 1, 2 if width else 0],
    )[0]
    if kind == "add_node":
        counter[0] += 3
        new = 10_000 + counter[0] if live.store.id_kind == "int" else f"new_{counter[0]}"
        return [{"type": kind, "id": new, "x": x}]
    if kind == "set_features":
        return [{"type": kind, "id": rng.choice(ids), "x": x}]
    if kind == "remove_node":
        return [{"type": kind, "id": rng.choice(ids)}]
    dst = rng.choice(ids)
    node = int(live.overlay.lookup([dst])[0])
    sources = live.overlay.external_ids(live.overlay.in_list(node))
    if kind == "remove_edge" and sources:
        return [{"type": kind, "src": rng.choice(sources), "dst": dst}]
    if kind == "set_edge_features" and sources:
        return [{"type": kind, "src": rng.choice(sources), "dst": dst, **attr}]
    roll = rng.random()
    if roll < 0.1:
        src = dst  # a self-loop
    elif roll < 0.3 and sources:
        src = rng.choice(sources)  # a parallel edge
    else:
        src = rng.choice(ids)
    return [{"type": "add_edge", "src": src, "dst": dst, **attr}]


def materialized_graph(live: LiveGraph) -> tuple[list, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The updated graph as plain tensors: live IDs, ``x``, ``edge_index`` and each edge's
    features (``[E, D]``, read by edge ID), every edge in its in-list's order."""
    overlay = live.overlay
    ids = live_ids(live)
    nodes = overlay.lookup(ids)
    position = {int(n): i for i, n in enumerate(nodes)}
    x = torch.from_numpy(overlay.feature_rows(nodes))
    src, dst, edge_ids = [], [], []
    for node in nodes.tolist():
        for source in overlay.in_list(node).tolist():
            src.append(position[source])
            dst.append(position[node])
        edge_ids.extend(overlay.in_list_edge_ids(node).tolist())
    edge_index = torch.tensor([src, dst], dtype=torch.int64).reshape(2, -1)
    edge_attr = torch.from_numpy(overlay.edge_feature_rows(np.array(edge_ids, dtype=np.int64)))
    return ids, x, edge_index, edge_attr


def materialized_forward(live: LiveGraph, model) -> tuple[list, torch.Tensor]:
    """The updated graph as plain tensors, and PyG's full-graph forward on it (with the edges'
    features for a model that reads them)."""
    ids, x, edge_index, edge_attr = materialized_graph(live)
    reads_edges = serving_needs(model).edge_input is not EdgeInput.NONE
    with torch.no_grad():
        rows = model(x, edge_index, edge_attr=edge_attr if reads_edges else None)
    return ids, torch.softmax(rows, dim=-1)


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
