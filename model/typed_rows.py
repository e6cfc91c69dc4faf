"""A subgraph of a graph of several node types, in the graph's global index space, as a
heterogeneous model reads it: the one rule for a sampled ego-graph (``handler.graph.typed_ego``)
and for a node's whole in-neighbourhood (``model.in_closure``, which precomputed rows are built
and refreshed with), so both gather and split alike.

A row's type is the type whose range holds its node (a boundary row ``-1 - t`` is of type
``t``), an edge's relation the one its edge ID has; :func:`typed_rows` splits rows and edges by
type (``model.typed_batch``), gathers each type's features and each relation's edge features
through the graph view (the stored graph or its live overlay) and runs the model on the seeds;
:func:`gather_typed` is that gathering alone, for explanations, which differentiate through it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor
from torch_geometric.typing import EdgeType

from graph_assets.graph_view import GraphView
from graph_assets.schema import GraphSchema
from model.served.contract import ServedModel
from model.served_hetero import answer_seeds
from model.typed_batch import HeteroInput, TypedLayout

TypeFeatureRows = Callable[[int, np.ndarray], Tensor]
"""``(node type index, global nodes all of that type) -> [n, F_t]`` feature rows on the
device, zero for a negative node (a boundary or padding row): a GPU worker's per-type tables
(``handler.gpu.device_features``) in place of the graph view's host rows."""


@dataclass(frozen=True)
class TypedSubgraph:
    """A subgraph's per-type tensors, as :func:`gather_typed` reads them.

    Attributes:
        layout: where each row and edge goes in the per-type dicts.
        row_type: ``[n]`` each row's node type index; ``edge_relation``: ``[E]`` each edge's
            relation index (schema order).
        features, n_id, edge_features: as :meth:`TypedLayout.inputs` takes them.
    """

    layout: TypedLayout
    row_type: np.ndarray
    edge_relation: np.ndarray
    features: dict[str, Tensor]
    n_id: dict[str, Tensor]
    edge_features: dict[EdgeType, Tensor]

    def inputs(self) -> HeteroInput:
        """The model's input on the whole subgraph (every layer computes every row)."""
        return self.layout.inputs(self.features, self.n_id, self.edge_features)


def gather_typed(
    schema: GraphSchema,
    view: GraphView,
    node: np.ndarray,
    edge_index: Tensor,
    edge_ids: np.ndarray,
    device: torch.device,
    relation: np.ndarray | None = None,
    feature_rows: TypeFeatureRows | None = None,
    padding_edges: np.ndarray | None = None,
    layout_device: torch.device | None = None,
) -> TypedSubgraph:
    """The per-type tensors on ``device`` of the subgraph whose row ``i`` is global node
    ``node[i]`` and whose edge ``k`` is ``edge_index[:, k]`` (local rows) with ID
    ``edge_ids[k]``, read through ``view``. For a padded ego-graph: ``relation``, each edge's
    relation (default: read by ID), and ``padding_edges``, ``[E]`` True for a padding edge,
    which gets zero edge features. ``feature_rows``: node features from the device (default:
    the view's host rows); ``layout_device``: where the layout's tensors go (default
    ``device``; a captured forward copies its edges from the host into its own buffers)."""
    row_type = np.where(node >= 0, view.types_of(np.maximum(node, 0)), -1 - node)
    if relation is None:
        relation = view.edge_relations(edge_ids)
    # Built on the host, where the rows' types are, then moved: splitting reads no device data.
    layout = TypedLayout.build(
        torch.from_numpy(row_type),
        edge_index.cpu(),
        torch.from_numpy(relation),
        tuple(schema.node_type_names),
        tuple(r.edge_type.triple for r in schema.relations),
    )
    features, n_id = {}, {}
    for index, node_type in enumerate(schema.node_types):
        rows = layout.rows[node_type.name].numpy()
        nodes = node[rows]
        real = nodes >= 0
        if feature_rows is not None and node_type.feature_dim:
            features[node_type.name] = feature_rows(index, nodes)
        elif len(nodes) and real.all() and node_type.feature_dim:  # no boundary row: as gathered
            x = view.feature_rows(nodes)
            features[node_type.name] = torch.from_numpy(x).to(device)
        else:
            x = np.zeros((len(rows), node_type.feature_dim), dtype=np.float32)
            if real.any() and node_type.feature_dim:
                x[real] = view.feature_rows(nodes[real])
            features[node_type.name] = torch.from_numpy(x).to(device)
        # A node an update added has no stored index within its type (its type has features:
        # graph_assets.live.operations refuses to add nodes of a featureless type).
        stored = real & (nodes < node_type.stop)
        local = np.where(stored, nodes - node_type.offset, -1)
        n_id[node_type.name] = torch.from_numpy(local).to(device)
    edge_features = {}
    for relation_meta in schema.relations:
        if not relation_meta.edge_feature_dim:
            continue
        triple = relation_meta.edge_type.triple
        positions = layout.edges[triple].numpy()
        ids = edge_ids[positions]
        real = np.ones(len(ids), dtype=bool) if padding_edges is None else ~padding_edges[positions]
        if real.all():
            attr = view.edge_feature_rows(ids)
        else:
            attr = np.zeros((len(ids), relation_meta.edge_feature_dim), dtype=np.float32)
            if real.any():
                attr[real] = view.edge_feature_rows(ids[real])
        edge_features[triple] = torch.from_numpy(attr).to(device)
    on = device if layout_device is None else layout_device
    return TypedSubgraph(layout.to(on), row_type, relation, features, n_id, edge_features)


def typed_rows(
    schema: GraphSchema,
    view: GraphView,
    model: ServedModel,
    node: np.ndarray,
    edge_index: Tensor,
    edge_ids: np.ndarray,
    num_seeds: int,
    device: torch.device,
    embedding: bool = False,
    hops: Sequence[int] | None = None,
    feature_rows: TypeFeatureRows | None = None,
) -> tuple[Tensor, Tensor | None]:
    """The seeds' output rows (and embeddings with ``embedding``) of ``model`` on the
    subgraph whose row ``i`` is global node ``node[i]`` (seeds first, of the model's target
    type) and whose edge ``k`` is ``edge_index[:, k]`` (local rows) with ID ``edge_ids[k]``;
    ``hops``, a sampled ego-graph's rows per hop, lets a recipe compute each layer for the rows
    that need it only; ``feature_rows``: node features from the device (:func:`gather_typed`)."""
    edge_index = edge_index.to(device)
    typed = gather_typed(schema, view, node, edge_index, edge_ids, device, None, feature_rows)
    levels = None if hops is None else (hops, edge_index)
    return answer_seeds(
        model,
        typed.layout,
        typed.features,
        typed.n_id,
        typed.edge_features,
        num_seeds,
        embedding,
        levels,
    )
