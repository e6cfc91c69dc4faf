"""A cold-start node on a precomputed archive, exactly, from the stored rows or its ego-graph.

Adding the new node ``v`` (edges ``u -> v`` from its senders, ``v -> u`` to its receivers)
changes the rows of the nodes it reaches, as an update would; only those that ``v``'s own output
reads matter. The stored graph and rows are never changed.

- **Per-layer rows** (:func:`new_node_rows`): the rows are recomputed inside ``v``'s upstream
  cone alone: ``cone[L] = {v}``, ``cone[l-1] = cone[l]`` plus their in-neighbours on the
  augmented graph. A node of ``cone[l]`` is recomputed at layer ``l`` when it is ``v`` or a
  receiver (its neighbourhood changed), when one of its inputs (itself or an in-neighbour) was
  recomputed at layer ``l-1``, or, with GCN, when an in-neighbour is a receiver (whose degree,
  and so its edge weight, changed). Every other input is the stored row. ``v``'s edges carry
  the request's ``edge_attr`` rows, the others their stored rows by edge ID.
- **Every node's output** (:func:`new_node_ego`): the model's own forward on ``v``'s whole
  in-neighbourhood in the augmented graph (``model.in_closure``), as an update's outputs are
  recomputed: exact for any local model, degree-normalising ones included (their receivers'
  degrees are the augmented graph's).

An edge of ``v`` has the ID ``-1 - i``, ``i`` its neighbour's position among the sorted unique
neighbours, whose ``edge_attr`` row it carries (``PrecomputedRows.edge_rows``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from graph_assets.graph_view import GraphView
from handler.graph.precomputed import PrecomputedRows
from model.in_closure import InEdgeLists, OutDegrees
from model.precompute import LocalGraph, layer_rows

NEW_NODE = -1  # the new node's label among global indices (rows of cold-start ego-graphs too)

# A node's in-neighbours and the ID of each of those edges on the augmented graph.
InList = Callable[[int], tuple[np.ndarray, np.ndarray]]


def new_node_rows(
    rows: PrecomputedRows,
    x: np.ndarray,
    senders: np.ndarray,
    receivers: np.ndarray,
    given: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``(output [1, C], embedding [1, D])`` of the new node from per-layer rows (module
    docstring); ``given``: its edges' features, one row per sorted unique neighbour."""
    receiving = set(receivers.tolist())
    sending = senders.astype(np.int64)
    sender_ids = -1 - np.arange(len(sending), dtype=np.int64)
    degree = rows.plan.degree

    def in_list(node: int) -> tuple[np.ndarray, np.ndarray]:
        if node == NEW_NODE:
            return sending, sender_ids
        stored, ids = rows.in_list(node), rows.in_list_edge_ids(node)
        if node in receiving:
            own = -1 - int(np.searchsorted(receivers, node))
            return np.append(stored, NEW_NODE), np.append(ids, own)
        return stored, ids

    layers = rows.num_layers
    cone: list[set[int]] = [set() for _ in range(layers + 1)]
    cone[layers] = {NEW_NODE}
    for layer in range(layers, 1, -1):
        below = set(cone[layer])
        for node in cone[layer]:
            below.update(in_list(node)[0].tolist())
        cone[layer - 1] = below
    changed: list[dict[int, np.ndarray]] = [{NEW_NODE: np.asarray(x, dtype=np.float32)}]
    for layer in range(1, layers + 1):
        dirty = [
            node
            for node in sorted(cone[layer])
            if node == NEW_NODE
            or node in receiving
            or node in changed[layer - 1]
            or any(source in changed[layer - 1] for source in in_list(node)[0].tolist())
            or (degree and any(source in receiving for source in in_list(node)[0].tolist()))
        ]
        changed.append(
            _recompute(rows, layer, dirty, in_list, changed[layer - 1], receiving, given)
        )
    embedding = changed[layers - 1][NEW_NODE].reshape(1, -1)
    return changed[layers][NEW_NODE].reshape(1, -1), embedding


def _recompute(
    rows: PrecomputedRows,
    layer: int,
    nodes: list[int],
    in_list: InList,
    below: dict[int, np.ndarray],
    receiving: set[int],
    given: np.ndarray | None,
) -> dict[int, np.ndarray]:
    """Layer ``layer`` of ``nodes`` on the augmented graph, inputs from ``below`` where they
    were recomputed, else the stored rows."""
    lists = [in_list(node) for node in nodes]
    sources = sorted({int(s) for items, _ in lists for s in items.tolist()} - set(nodes))
    local = np.array([*nodes, *sources], dtype=np.int64)
    position = {int(node): i for i, node in enumerate(local.tolist())}
    src = np.array([position[int(s)] for items, _ in lists for s in items.tolist()], dtype=np.int64)
    dst = np.repeat(np.arange(len(nodes)), [len(items) for items, _ in lists])
    stored = local != NEW_NODE
    inputs = np.empty((len(local), rows.width(layer - 1)), dtype=np.float32)
    inputs[stored] = rows.rows(layer - 1, local[stored])
    for i, node in enumerate(local.tolist()):
        if node in below:
            inputs[i] = below[node]
    degree = None
    if rows.plan.degree:
        degree = np.zeros(len(local), dtype=np.float32)
        degree[stored] = rows.view.degree_rows(local[stored])
        degree[local == NEW_NODE] = len(in_list(NEW_NODE)[0])
        degree += np.isin(local, list(receiving))
    edge_attr = None
    if rows.plan.edge_attr:
        ids = np.concatenate([ids for _, ids in lists]) if lists else np.empty(0, np.int64)
        edge_attr = rows.edge_rows(ids.astype(np.int64), given)
    graph = LocalGraph(
        nodes=local, edge_index=torch.from_numpy(np.stack((src, dst))), rows=len(nodes)
    )
    out = layer_rows(rows.plan, layer - 1, graph, inputs, degree, edge_attr)
    return {node: out[i] for i, node in enumerate(nodes)}


def new_node_ego(
    rows: PrecomputedRows,
    x: np.ndarray,
    senders: np.ndarray,
    receivers: np.ndarray,
    given: np.ndarray | None,
    max_nodes: int,
    max_edges: int,
) -> tuple[np.ndarray, np.ndarray]:
    """``(output [1, C], embedding [1, D])`` of the new node from the model's forward on its
    whole in-neighbourhood in the augmented graph (module docstring); ``SubgraphTooLarge``
    beyond the limits."""
    sending = senders.astype(np.int64)
    receiving = receivers.astype(np.int64)

    def read(nodes: np.ndarray) -> InEdgeLists:
        existing = nodes[nodes != NEW_NODE]
        found = rows.in_edges(existing)
        into = existing[np.isin(existing, receiving)]
        parts = [
            found,
            InEdgeLists(
                src=np.full(len(into), NEW_NODE, dtype=np.int64),
                dst=into,
                edge_ids=-1 - np.searchsorted(receiving, into).astype(np.int64),
            ),
        ]
        if bool((nodes == NEW_NODE).any()):
            parts.append(
                InEdgeLists(
                    src=sending,
                    dst=np.full(len(sending), NEW_NODE, dtype=np.int64),
                    edge_ids=-1 - np.arange(len(sending), dtype=np.int64),
                )
            )
        return InEdgeLists(
            src=np.concatenate([p.src for p in parts]),
            dst=np.concatenate([p.dst for p in parts]),
            edge_ids=np.concatenate([p.edge_ids for p in parts]),
        )

    output, embedding = rows.ego_forward(
        np.array([NEW_NODE], dtype=np.int64),
        read=read,
        new_x=np.asarray(x, dtype=np.float32),
        new_edge_rows=given,
        with_embedding=True,
        max_nodes=max_nodes,
        max_edges=max_edges,
        degrees=augmented_out_degrees(rows.view, sending, len(receiving)),
    )
    assert embedding is not None
    return output, embedding


def augmented_out_degrees(view: GraphView, senders: np.ndarray, receivers: int) -> OutDegrees:
    """Out-degrees of ``view`` with the new node added (``ColdStartView.out_degree_rows``'s
    rule, the new node being ``NEW_NODE`` here): its own is its ``receivers``, a sender's
    grows by its edges into it; the largest may be either's."""
    ordered = np.sort(senders)

    def rows(nodes: np.ndarray) -> np.ndarray:
        known = nodes != NEW_NODE
        degree = np.full(len(nodes), receivers, dtype=np.int64)
        mine = nodes[known]
        sent = np.searchsorted(ordered, mine, side="right") - np.searchsorted(ordered, mine)
        degree[known] = view.out_degree_rows(mine) + sent
        return degree

    def largest() -> int:
        grown = rows(np.append(ordered, NEW_NODE))
        return max(view.largest_out_degree(), int(grown.max()))

    return OutDegrees(rows, largest)
