"""A sampled ego-graph of a graph of several node types, as a heterogeneous model reads it:
:func:`typed_answer` runs the model on it through ``model.typed_rows`` (rows split by type,
features per type and edge features per relation gathered through the graph view), the rule
precomputed rows are built and refreshed with too.
"""

from __future__ import annotations

import torch

from graph_assets.graph_view import GraphView
from handler.graph.graph_source import ServedGraph
from handler.sampling.sampler import SampledSubgraph
from model.served_hetero import HeteroNodeModel
from model.typed_rows import typed_rows


def typed_answer(
    store: ServedGraph,
    view: GraphView,
    model: HeteroNodeModel,
    sub: SampledSubgraph,
    device: torch.device,
    embedding: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The seeds' output rows (and embeddings with ``embedding``) of ``model`` on ``sub``."""
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
    )
