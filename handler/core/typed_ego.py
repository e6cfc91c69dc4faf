"""A sampled ego-graph of a graph of several node types, as a heterogeneous model reads it.

The sampler works in the graph's global index space; a row's type is the type whose range
holds its node (a boundary row ``-1 - t`` is of type ``t``), an edge's relation is the one its
edge ID has. :func:`typed_answer` splits the rows and edges by type (``model.typed_batch``),
gathers each type's features and each relation's edge features through the graph view, and
runs the model on the seeds.
"""

from __future__ import annotations

import numpy as np
import torch

from graph_assets.graph_view import GraphView
from graph_assets.store import GraphStore
from handler.core.sampler import SampledSubgraph
from model.served_hetero import HeteroNodeModel, answer_seeds
from model.typed_batch import TypedLayout


def typed_answer(
    store: GraphStore,
    view: GraphView,
    model: HeteroNodeModel,
    sub: SampledSubgraph,
    device: torch.device,
    embedding: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The seeds' output rows (and embeddings with ``embedding``) of ``model`` on ``sub``."""
    schema = store.schema
    node = sub.node.cpu().numpy()
    row_type = np.where(node >= 0, view.types_of(np.maximum(node, 0)), -1 - node)
    edge_ids = sub.edge.cpu().numpy()
    relation = view.edge_relations(edge_ids)
    layout = TypedLayout.build(
        torch.from_numpy(row_type).to(device),
        sub.edge_index.to(device),
        torch.from_numpy(relation).to(device),
        tuple(schema.node_type_names),
        tuple(r.edge_type.triple for r in schema.relations),
    )
    features, n_id = {}, {}
    for node_type in schema.node_types:
        rows = layout.rows[node_type.name].cpu().numpy()
        nodes = node[rows]
        real = nodes >= 0
        x = np.zeros((len(rows), node_type.feature_dim), dtype=np.float32)
        if real.any() and node_type.feature_dim:
            x[real] = view.feature_rows(nodes[real])
        features[node_type.name] = torch.from_numpy(x).to(device)
        # A node an update added has no stored index within its type (its type has features:
        # graph_assets.operations refuses to add nodes of a featureless type).
        stored = real & (nodes < node_type.stop)
        local = np.where(stored, nodes - node_type.offset, -1)
        n_id[node_type.name] = torch.from_numpy(local).to(device)
    edge_features = {}
    for relation_meta in schema.relations:
        if not relation_meta.edge_feature_dim:
            continue
        triple = relation_meta.edge_type.triple
        ids = edge_ids[layout.edges[triple].cpu().numpy()]
        edge_features[triple] = torch.from_numpy(view.edge_feature_rows(ids)).to(device)
    hops = (sub.level_sizes, sub.edge_index.to(device))
    return answer_seeds(
        model, layout, features, n_id, edge_features, sub.num_seeds, embedding, hops
    )
