"""Node classifiers with one interface: ``forward(x, edge_index, degree=None) -> logits``.

The server runs these on sampled ego-graphs whose rows are ``(node, hop)`` pairs and whose
in-edges are, for the rows that matter, the node's whole in-neighbourhood. Mean (SAGE), sum
(GIN) and attention (GAT) aggregation then give the full-graph answer at the seed rows by
themselves; GCN's symmetric normalisation also needs the degree of each neighbour, which an
ego-graph truncates, so GCN takes the full-graph in-degree of every row as ``degree``.

The layers are PyG's stock models (``torch_geometric.nn.models``) so that a served model can
be checked against a plain PyG forward with the same ``state_dict`` (keys under ``gnn.``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor
from torch_geometric.nn import GINConv
from torch_geometric.nn import models as pyg_models
from torch_geometric.nn.models import MLP
from torch_geometric.nn.models.basic_gnn import BasicGNN

from model.config import Arch, ModelConfig, Task


class NodeClassifier(torch.nn.Module):
    """A PyG ``BasicGNN`` (ReLU and dropout between layers, last layer maps to classes)."""

    def __init__(self, gnn: BasicGNN) -> None:
        super().__init__()
        self.gnn = gnn

    def forward(self, x: Tensor, edge_index: Tensor, degree: Tensor | None = None) -> Tensor:
        """Logits ``[num_rows, out_dim]``; ``degree`` is accepted for a uniform interface."""
        return self.gnn(x, edge_index)


class GCN(NodeClassifier):
    """Kipf & Welling GCN whose normalisation uses full-graph degrees when given.

    Edge ``j -> i`` has weight ``1/sqrt((deg_i+1)(deg_j+1))`` and each row a self-loop of
    weight ``1/(deg_i+1)``: exactly what ``GCNConv(normalize=True)`` computes on the whole
    graph, so an ego-graph with full neighbourhoods and full-graph ``degree`` is exact.
    """

    def __init__(
        self, in_dim: int, hidden_dim: int, out_dim: int, num_layers: int, dropout: float
    ) -> None:
        super().__init__(
            pyg_models.GCN(
                in_dim, hidden_dim, num_layers, out_dim, dropout=dropout, normalize=False
            )
        )

    def forward(self, x: Tensor, edge_index: Tensor, degree: Tensor | None = None) -> Tensor:
        """Logits; ``degree`` = full-graph in-degree without self-loop of each row of ``x``.

        When ``degree`` is None it is the in-degree within ``edge_index`` (whole-graph use).
        ``edge_index`` must hold no self-loops: the layer adds its own.
        """
        edge_index, edge_weight = gcn_norm_with_degree(edge_index, x.size(0), degree, x.dtype)
        return self.gnn(x, edge_index, edge_weight=edge_weight)


class GraphSAGE(NodeClassifier):
    """GraphSAGE with mean aggregation (a node with no in-edges aggregates zeros)."""

    def __init__(
        self, in_dim: int, hidden_dim: int, out_dim: int, num_layers: int, dropout: float
    ) -> None:
        super().__init__(
            pyg_models.GraphSAGE(in_dim, hidden_dim, num_layers, out_dim, dropout=dropout)
        )


class GAT(NodeClassifier):
    """GAT: hidden layers concatenate ``heads`` heads of ``hidden_dim // heads`` channels each;
    the last layer averages its heads. ``GATConv`` adds its own self-loops."""

    def __init__(
        self,
        in_dim: int,
        hidden_dim: int,
        out_dim: int,
        num_layers: int,
        dropout: float,
        heads: int,
    ) -> None:
        super().__init__(
            pyg_models.GAT(in_dim, hidden_dim, num_layers, out_dim, dropout=dropout, heads=heads)
        )


class GIN(NodeClassifier):
    """GIN: each layer is ``MLP((1 + eps) * x_i + sum_j x_j)``, the MLP Linear-ReLU-Linear."""

    def __init__(
        self, in_dim: int, hidden_dim: int, out_dim: int, num_layers: int, dropout: float
    ) -> None:
        super().__init__(_WideGIN(in_dim, hidden_dim, num_layers, out_dim, dropout=dropout))


class _WideGIN(pyg_models.GIN):
    """PyG's GIN with every MLP ``hidden_dim`` wide inside.

    Stock PyG sizes the last layer's MLP ``[hidden, out_dim, out_dim]``: a ReLU bottleneck of
    ``out_dim`` units in which one dead unit loses a class for good; on our synthetic graphs
    it left training at chance for most seeds.
    """

    def init_conv(self, in_channels: int, out_channels: int, **kwargs: Any) -> GINConv:
        mlp = MLP(
            [in_channels, self.hidden_channels, out_channels],
            act=self.act,
            act_first=self.act_first,
            norm=None,
        )
        return GINConv(mlp, **kwargs)


def gcn_norm_with_degree(
    edge_index: Tensor, num_rows: int, degree: Tensor | None, dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """GCN's symmetric normalisation from given in-degrees: edges plus one self-loop per row.

    Returns ``(edge_index with self-loops appended, edge_weight)``. ``degree`` None means the
    in-degree within ``edge_index`` (``edge_index[1]`` counted), as on a whole graph.
    """
    if degree is None:
        deg = torch.zeros(num_rows, dtype=dtype, device=edge_index.device)
        deg.scatter_add_(0, edge_index[1], torch.ones_like(edge_index[1], dtype=dtype))
    else:
        if degree.shape != (num_rows,):
            raise ValueError(
                f"degree must have one entry per row of x, shape ({num_rows},), "
                f"got shape {tuple(degree.shape)}"
            )
        deg = degree.to(device=edge_index.device, dtype=dtype)
    inv_sqrt = (deg + 1.0).rsqrt()
    src, dst = edge_index
    loops = torch.arange(num_rows, device=edge_index.device, dtype=edge_index.dtype)
    weight = torch.cat([inv_sqrt[src] * inv_sqrt[dst], inv_sqrt * inv_sqrt])
    return torch.cat([edge_index, torch.stack([loops, loops])], dim=1), weight


def build_model(config: ModelConfig | Mapping[str, Any]) -> torch.nn.Module:
    """Builds the untrained module for a config or its ``model_config.json`` dict.

    ``task`` picks the module: a :class:`NodeClassifier` (``node``), a
    ``model.link.LinkPredictor`` (``link``) or a ``model.graph_level.GraphClassifier``
    (``graph``). Load weights with ``load_state_dict`` (or ``model.export.load_model``) and call
    ``eval()`` before serving: dropout is active in training mode.
    """
    if not isinstance(config, ModelConfig):
        config = ModelConfig.from_dict(config)
    # The link and graph modules build their encoders with this module, so they import it,
    # and it imports them only here, when one is asked for.
    if config.task is Task.LINK:
        from model.link import LinkPredictor

        return LinkPredictor(config)
    if config.task is Task.GRAPH:
        from model.graph_level import GraphClassifier

        return GraphClassifier(config)
    return build_node_classifier(config)


def build_node_classifier(config: ModelConfig) -> NodeClassifier:
    """The node-level GNN of ``config`` (whatever its task): ``out_dim`` outputs per node."""
    dims = (config.in_dim, config.hidden_dim, config.out_dim, config.num_layers, config.dropout)
    if config.arch is Arch.GCN:
        return GCN(*dims)
    if config.arch is Arch.SAGE:
        return GraphSAGE(*dims)
    if config.arch is Arch.GAT:
        return GAT(*dims, heads=config.heads)
    return GIN(*dims)
