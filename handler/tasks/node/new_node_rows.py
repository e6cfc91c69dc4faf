"""A cold-start node on a precomputed archive, exactly, from the stored rows.

Adding the new node ``v`` (edges ``u -> v`` from its senders, ``v -> u`` to its receivers)
changes the rows of the nodes it reaches, as an update would; only those that ``v``'s own output
reads matter. So the rows are recomputed inside ``v``'s upstream cone alone: ``cone[L] = {v}``,
``cone[l-1] = cone[l]`` plus their in-neighbours on the augmented graph. A node of ``cone[l]``
is recomputed at layer ``l`` when it is ``v`` or a receiver (its neighbourhood changed), when
one of its inputs (itself or an in-neighbour) was recomputed at layer ``l-1``, or, with GCN,
when an in-neighbour is a receiver (whose degree, and so its edge weight, changed). Every other
input is the stored row. The stored graph and rows are never changed.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from handler.core.precomputed import PrecomputedRows
from model.precompute import LocalGraph, layer_rows, needs_degree

NEW_NODE = -1  # the new node's label among global indices (rows of cold-start ego-graphs too)


def new_node_rows(
    rows: PrecomputedRows, x: np.ndarray, senders: np.ndarray, receivers: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(output [1, C], embedding [1, D])`` of the new node (module docstring)."""
    receiving = set(receivers.tolist())
    sending = senders.astype(np.int64)
    gcn = needs_degree(rows.model)

    def in_list(node: int) -> np.ndarray:
        if node == NEW_NODE:
            return sending
        stored = rows.in_list(node)
        return np.append(stored, NEW_NODE) if node in receiving else stored

    layers = rows.num_layers
    cone: list[set[int]] = [set() for _ in range(layers + 1)]
    cone[layers] = {NEW_NODE}
    for layer in range(layers, 1, -1):
        below = set(cone[layer])
        for node in cone[layer]:
            below.update(in_list(node).tolist())
        cone[layer - 1] = below
    changed: list[dict[int, np.ndarray]] = [{NEW_NODE: np.asarray(x, dtype=np.float32)}]
    for layer in range(1, layers + 1):
        dirty = [
            node
            for node in sorted(cone[layer])
            if node == NEW_NODE
            or node in receiving
            or node in changed[layer - 1]
            or any(source in changed[layer - 1] for source in in_list(node).tolist())
            or (gcn and any(source in receiving for source in in_list(node).tolist()))
        ]
        changed.append(_recompute(rows, layer, dirty, in_list, changed[layer - 1], receiving))
    embedding = changed[layers - 1][NEW_NODE].reshape(1, -1)
    return changed[layers][NEW_NODE].reshape(1, -1), embedding


def _recompute(
    rows: PrecomputedRows,
    layer: int,
    nodes: list[int],
    in_list: Callable[[int], np.ndarray],
    below: dict[int, np.ndarray],
    receiving: set[int],
) -> dict[int, np.ndarray]:
    """Layer ``layer`` of ``nodes`` on the augmented graph, inputs from ``below`` where they
    were recomputed, else the stored rows."""
    lists = [in_list(node) for node in nodes]
    sources = sorted({int(s) for items in lists for s in items.tolist()} - set(nodes))
    local = np.array([*nodes, *sources], dtype=np.int64)
    position = {int(node): i for i, node in enumerate(local.tolist())}
    src = np.array([position[int(s)] for items in lists for s in items.tolist()], dtype=np.int64)
    dst = np.repeat(np.arange(len(nodes)), [len(items) for items in lists])
    stored = local != NEW_NODE
    inputs = np.empty((len(local), rows.width(layer - 1)), dtype=np.float32)
    inputs[stored] = rows.rows(layer - 1, local[stored])
    for i, node in enumerate(local.tolist()):
        if node in below:
            inputs[i] = below[node]
    degree = None
    if needs_degree(rows.model):
        degree = np.zeros(len(local), dtype=np.float32)
        degree[stored] = rows.view.degree_rows(local[stored])
        degree[local == NEW_NODE] = len(in_list(NEW_NODE))
        degree += np.isin(local, list(receiving))
    graph = LocalGraph(
        nodes=local, edge_index=torch.from_numpy(np.stack((src, dst))), rows=len(nodes)
    )
    out = layer_rows(rows.model, layer - 1, graph, inputs, degree)
    return {node: out[i] for i, node in enumerate(nodes)}
