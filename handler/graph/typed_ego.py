"""A sampled ego-graph of a graph of several node types, as a heterogeneous model reads it:
:func:`typed_answer` runs the model on it through ``model.typed_rows`` (rows split by type,
features per type and edge features per relation gathered through the graph view), the rule
precomputed rows are built and refreshed with too; :func:`captured_typed_answer` runs it on a
GPU worker, padded to a bucket (handler.gpu.padding) and replayed from that bucket's captured
graph (handler.gpu.captured_forward), features gathered from device memory.
"""

from __future__ import annotations

import numpy as np
import torch

from graph_assets.graph_view import GraphView
from handler.gpu.captured_forward import CapturedForward
from handler.gpu.device_features import TypedDeviceFeatures
from handler.gpu.padding import PaddedSubgraph, RowTypes, pad_subgraph
from handler.graph.graph_source import ServedGraph
from handler.sampling.sampler import SampledSubgraph
from model.served.contract import ServedModel
from model.typed_rows import TypeFeatureRows, gather_typed, typed_rows


def typed_answer(
    store: ServedGraph,
    view: GraphView,
    model: ServedModel,
    sub: SampledSubgraph,
    device: torch.device,
    embedding: bool = False,
    features: TypedDeviceFeatures | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The seeds' output rows (and embeddings with ``embedding``) of ``model`` on ``sub``,
    node features from ``features`` (device memory) when given, else from ``view``."""
    return typed_rows(
        store.schema,
        view,
        model,
        sub.node.cpu().numpy(),
        sub.edge_index,
        sub.edge.cpu().numpy(),
        sub.num_seeds,
        device,
        embedding,
        sub.level_sizes,
        _device_rows(view, features),
    )


def pad_typed(store: ServedGraph, view: GraphView, sub: SampledSubgraph) -> PaddedSubgraph:
    """``sub`` padded to bucket sizes per node type and relation (its rows' types and edges'
    relations read through ``view``)."""
    schema = store.schema
    node, edge = sub.node.cpu().numpy(), sub.edge.cpu().numpy()
    index = {name: i for i, name in enumerate(schema.node_type_names)}
    ends = [[index[r.edge_type.triple[0]], index[r.edge_type.triple[2]]] for r in schema.relations]
    types = RowTypes(
        row_type=np.where(node >= 0, view.types_of(np.maximum(node, 0)), -1 - node),
        edge_relation=view.edge_relations(edge),
        relation_ends=np.asarray(ends, dtype=np.int64).reshape(-1, 2),
        num_types=len(schema.node_types),
    )
    return pad_subgraph(sub, types=types)


def captured_typed_answer(
    store: ServedGraph,
    view: GraphView,
    forward: CapturedForward,
    target: str,
    padded: PaddedSubgraph,
    device: torch.device,
    features: TypedDeviceFeatures | None = None,
) -> torch.Tensor:
    """The seeds' output rows of ``forward``'s typed model, which answers for node type
    ``target``, on ``padded`` (:func:`pad_typed`), node features from ``features`` (device
    memory) when given, else from ``view``."""
    assert padded.types is not None
    sub = padded.sub
    seeds = padded.types.row_type[: sub.num_seeds]
    if np.any(seeds != store.schema.node_type_names.index(target)):
        raise ValueError(
            f"the first {sub.num_seeds} rows must be seeds of the model's target type {target!r}"
        )
    # The layout and the edges stay on the host (the padded ego-graph's are there): the
    # forward copies them into its device buffers, and splitting them reads no device data.
    typed = gather_typed(
        store.schema,
        view,
        sub.node.numpy(),
        sub.edge_index,
        sub.edge.numpy(),
        device,
        relation=padded.types.edge_relation,
        feature_rows=_device_rows(view, features),
        padding_edges=padded.padding_edges,
        layout_device=torch.device("cpu"),
    )
    inputs = typed.layout.inputs(
        typed.features, typed.n_id, typed.edge_features, sub.level_sizes, sub.edge_index
    )
    return forward.typed(padded, inputs)


def _device_rows(view: GraphView, features: TypedDeviceFeatures | None) -> TypeFeatureRows | None:
    if features is None:
        return None
    return lambda node_type, nodes: features.gather(view, node_type, nodes)
