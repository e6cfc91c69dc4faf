"""A live graph of several node types as a test sees it: random valid typed updates, and the
updated graph as one HeteroInput (the reference every served answer is held to)."""

from __future__ import annotations

import random

import numpy as np
import torch

from handler.live.live_graph import LiveGraph
from model.typed_batch import HeteroInput


def live_nodes(live: LiveGraph, node_type: int) -> np.ndarray:
    """The global indices of the live nodes of ``node_type``, ascending."""
    overlay = live.overlay
    every = np.arange(overlay.num_nodes, dtype=np.int64)
    kept = every[overlay.types_of(every) == node_type]
    return np.array([n for n in kept.tolist() if n not in overlay.removed], dtype=np.int64)


def random_typed_update(rng: random.Random, live: LiveGraph, counter: list[int]) -> list[dict]:
    """One valid operation on a typed graph: nodes of featured types added, features set,
    nodes removed, edges of any relation added (with their features), removed or changed."""
    live.sync()
    overlay, schema = live.overlay, live.store.schema
    kind = rng.choices(
        ["add_node", "set_features", "remove_node", "add_edge", "remove_edge", "set_edge"],
        [2, 2, 1, 6, 2, 2],
    )[0]
    if kind in ("add_node", "set_features", "remove_node"):
        featured = [i for i, t in enumerate(schema.node_types) if t.feature_dim]
        index = rng.choice(featured if kind != "remove_node" else range(len(schema.node_types)))
        node_type = schema.node_types[index]
        x = [rng.uniform(-1, 1) for _ in range(node_type.feature_dim)]
        if kind == "add_node":
            counter[0] += 1
            new_id = f"new_{counter[0]}" if node_type.id_kind == "str" else 50_000 + counter[0]
            return [{"type": kind, "id": new_id, "x": x, "node_type": node_type.name}]
        nodes = live_nodes(live, index)
        [node_id] = overlay.external_ids(nodes[[rng.randrange(len(nodes))]])
        extra = {"x": x} if kind == "set_features" else {}
        return [{"type": kind, "id": node_id, "node_type": node_type.name, **extra}]
    r = rng.randrange(len(schema.relations))
    relation = schema.relations[r]
    src_type = schema.type_index(relation.edge_type.src)
    dst_type = schema.type_index(relation.edge_type.dst)
    dsts = live_nodes(live, dst_type)
    dst = int(dsts[rng.randrange(len(dsts))])
    sources = overlay.in_list(dst)[overlay.edge_relations(overlay.in_list_edge_ids(dst)) == r]
    attr = {"attr": [rng.uniform(-2, 2) for _ in range(relation.edge_feature_dim)]}
    attr = attr if relation.edge_feature_dim else {}
    [dst_id] = overlay.external_ids(np.array([dst]))
    edge = {"dst": dst_id, "edge_type": relation.name}
    if kind in ("remove_edge", "set_edge") and len(sources):
        [src_id] = overlay.external_ids(sources[[rng.randrange(len(sources))]])
        if kind == "remove_edge":
            return [{"type": "remove_edge", "src": src_id, **edge}]
        if attr:
            return [{"type": "set_edge_features", "src": src_id, **edge, **attr}]
    srcs = live_nodes(live, src_type)
    [src_id] = overlay.external_ids(srcs[[rng.randrange(len(srcs))]])
    return [{"type": "add_edge", "src": src_id, **edge, **attr}]


def materialized_typed(live: LiveGraph) -> tuple[list, HeteroInput]:
    """The target type's live IDs (in order) and the updated graph as one HeteroInput: each
    type's live nodes, each relation's live edges in per-type positions with their features."""
    overlay, schema = live.overlay, live.store.schema
    position: dict[int, tuple[int, int]] = {}
    x_dict, n_id_dict = {}, {}
    for index, node_type in enumerate(schema.node_types):
        nodes = live_nodes(live, index)
        for local, node in enumerate(nodes.tolist()):
            position[node] = (index, local)
        x_dict[node_type.name] = (
            torch.from_numpy(overlay.feature_rows(nodes))
            if len(nodes)
            else torch.empty(0, node_type.feature_dim)
        )
        stored = nodes < node_type.stop
        n_id_dict[node_type.name] = torch.from_numpy(np.where(stored, nodes - node_type.offset, 0))
    edges: dict[int, tuple[list, list, list]] = {
        r: ([], [], []) for r in range(len(schema.relations))
    }
    for node, (_, local) in position.items():
        ids = overlay.in_list_edge_ids(node)
        for source, edge_id, r in zip(
            overlay.in_list(node).tolist(),
            ids.tolist(),
            overlay.edge_relations(ids).tolist(),
            strict=True,
        ):
            edges[r][0].append(position[source][1])
            edges[r][1].append(local)
            edges[r][2].append(edge_id)
    edge_index_dict, edge_attr_dict = {}, {}
    for r, relation in enumerate(schema.relations):
        src, dst, ids = edges[r]
        triple = relation.edge_type.triple
        edge_index_dict[triple] = torch.tensor([src, dst], dtype=torch.int64).reshape(2, -1)
        if relation.edge_feature_dim:
            rows = overlay.edge_feature_rows(np.array(ids, dtype=np.int64))
            edge_attr_dict[triple] = torch.from_numpy(rows.reshape(-1, relation.edge_feature_dim))
    target = live_nodes(live, 0)
    return overlay.external_ids(target), HeteroInput(
        x_dict, edge_index_dict, n_id_dict, edge_attr_dict
    )
