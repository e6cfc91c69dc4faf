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

import itertools
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from torch_geometric.nn import GCNConv, GINConv
from torch_geometric.nn import models as pyg_models
from torch_geometric.nn.models import MLP
from torch_geometric.nn.models.basic_gnn import BasicGNN

from model.config import Arch, ModelConfig, Task
from model.served.capture import with_input_of
from model.served.contract import Mode, OneNodeType, Plan, ServedModel, ServingNeeds
from model.trimmed import (
    ConvOnRows,
    gnn_layer,
    known_hop_edges,
    runs_stock_propagate,
    trimmed_forward,
)


class NodeClassifier(OneNodeType, torch.nn.Module):
    """A PyG ``BasicGNN`` (ReLU and dropout between layers, last layer maps to classes).

    ``level_sizes`` (rows per hop of a sampled ego-graph whose rows are grouped by hop and
    whose edges are grouped by the hop of their destination, as the server's sampler lays them
    out) lets each layer compute only the rows a later layer reads, PyG's trim-to-layer: layer
    ``i`` drops the last ``i`` hops. The seed rows' outputs are unchanged. ``hop_edges`` (edges
    into each hop, as the sampler knows them) spares counting them from ``edge_index``: the
    forward then reads no tensor data on the host, so a CUDA graph can capture it.
    """

    task = Task.NODE
    serving_needs = ServingNeeds()
    has_embedding = True
    # A node's degree is part of what its out-edges carry (the GCN preset's normalisation).
    reads_degree = False

    def __init__(self, gnn: BasicGNN) -> None:
        super().__init__()
        self.gnn = gnn

    @property
    def hops(self) -> int:
        return int(self.gnn.num_layers)

    def forward(
        self,
        x: Tensor,
        edge_index: Tensor,
        degree: Tensor | None = None,
        level_sizes: Sequence[int] | None = None,
        edge_attr: Tensor | None = None,
        hop_edges: Sequence[int] | None = None,
    ) -> Tensor:
        """Logits ``[num_rows, out_dim]`` (only the first rows when ``level_sizes`` trims);
        ``degree`` and ``edge_attr`` are accepted for the served-model protocol
        (``model.served``): the presets read no edge features."""
        if level_sizes is None:
            return self.gnn(x, edge_index)
        return trimmed_forward(self.gnn, x, edge_index, level_sizes, hop_edges=hop_edges)

    def layer(
        self,
        index: int,
        x: Tensor,
        edge_index: Tensor,
        rows: int,
        degree: Tensor | None = None,
        edge_attr: Tensor | None = None,
    ) -> Tensor:
        """Layer ``index`` of the full-graph forward for the first ``rows`` rows of ``x``, as the
        next layer reads it (:func:`model.trimmed.gnn_layer`, the one rule of a layer's rows).

        ``x`` holds the layer's input for the destination rows first, then for the other
        sources of ``edge_index`` (local rows), which must hold every in-edge of each
        destination; ``degree``: full-graph in-degrees of the rows of ``x`` (GCN);
        ``edge_attr``: the edges' features, for layers built with ``edge_dim`` (a user's
        ``BasicGNN`` behind this class). Precomputed archives build every layer of every node
        with it, and refresh the rows an update reaches with it: one rule for both
        (model.precompute).
        """
        conv = self._conv(degree)
        return gnn_layer(self.gnn, index, x, rows, edge_index, edge_attr, conv_on_rows=conv)

    def _conv(self, degree: Tensor | None) -> ConvOnRows | None:
        """How a conv computes its rows (None: :func:`model.trimmed.layer_on_rows`)."""
        return None

    def forward_with_embedding(
        self,
        x: Tensor,
        edge_index: Tensor,
        degree: Tensor | None = None,
        edge_attr: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """``(output, embedding)`` per row of ``x`` from one forward pass: the embedding is the
        input of the last layer (``model.embedding``)."""
        return with_input_of(self.gnn.convs[-1], lambda: self(x, edge_index, degree=degree))

    def precompute_plan(self) -> Plan:
        """Per-layer rows, one array per layer (``model.precompute``)."""
        layers = self.hops
        return Plan(
            mode=Mode.LAYERS,
            reason=f"per-layer rows: the {type(self).__name__} preset's {layers} layers",
            hops=layers,
            stack=self,
            degree=self.reads_degree,
            stored_embedding=True,
        )

    def rows_of(self, node_type: str) -> ServedModel:
        raise ValueError(f"the {type(self).__name__} preset reads a graph of one node type")


class GCN(NodeClassifier):
    """Kipf & Welling GCN whose normalisation uses full-graph degrees when given.

    Edge ``j -> i`` has weight ``1/sqrt((deg_i+1)(deg_j+1))`` and each row a self-loop of
    weight ``1/(deg_i+1)``: exactly what ``GCNConv(normalize=True)`` computes on the whole
    graph, so an ego-graph with full neighbourhoods and full-graph ``degree`` is exact.
    """

    reads_degree = True

    def __init__(
        self, in_dim: int, hidden_dim: int, out_dim: int, num_layers: int, dropout: float
    ) -> None:
        super().__init__(
            pyg_models.GCN(
                in_dim, hidden_dim, num_layers, out_dim, dropout=dropout, normalize=False
            )
        )

    def forward(
        self,
        x: Tensor,
        edge_index: Tensor,
        degree: Tensor | None = None,
        level_sizes: Sequence[int] | None = None,
        edge_attr: Tensor | None = None,
        hop_edges: Sequence[int] | None = None,
    ) -> Tensor:
        """Logits; ``degree`` = full-graph in-degree of each row of ``x``, self-loops not counted.

        When ``degree`` is None it is the in-degree within ``edge_index`` (whole-graph use).
        As PyG's ``GCNConv``: a row's self-loops (of the graph) are replaced by one of the
        layer's own.
        """
        if level_sizes is not None:
            edge_index, edge_weight, groups = _gcn_edges_by_hop(
                edge_index, x.size(0), degree, x.dtype, level_sizes, hop_edges
            )
            return self.gnn(
                x,
                edge_index,
                edge_weight=edge_weight,
                num_sampled_nodes_per_hop=list(level_sizes),
                num_sampled_edges_per_hop=groups,
            )
        edge_index, edge_weight = gcn_norm_with_degree(edge_index, x.size(0), degree, x.dtype)
        return self.gnn(x, edge_index, edge_weight=edge_weight)

    def _conv(self, degree: Tensor | None) -> ConvOnRows:
        """``lin(sum_j w_ij x_j) + bias`` with the weights from ``degree``: the weighted sum
        first, then the linear map (equal to GCNConv's ``sum_j w_ij lin(x_j)``), so only the
        destination rows are multiplied."""

        def conv_on_rows(
            conv: torch.nn.Module,
            x: Tensor,
            rows: int,
            edge_index: Tensor,
            edge_attr: Tensor | None = None,
        ) -> Tensor:
            looped, weight = gcn_norm_with_degree(edge_index, x.size(0), degree, x.dtype)
            into = looped[1] < rows
            src, dst = looped[0][into], looped[1][into]
            if not (isinstance(conv, GCNConv) and runs_stock_propagate(conv)):
                return conv(x, looped[:, into], edge_weight=weight[into])[:rows]
            total = x.new_zeros(rows, x.size(1)).index_add_(
                0, dst, x.index_select(0, src) * weight[into].unsqueeze(1)
            )
            out = conv.lin(total)
            return out if conv.bias is None else out + conv.bias

        return conv_on_rows


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
    edge_index: Tensor,
    num_rows: int,
    degree: Tensor | None,
    dtype: torch.dtype,
    keep_loops: bool = False,
) -> tuple[Tensor, Tensor]:
    """GCN's symmetric normalisation from given in-degrees, as PyG's ``GCNConv`` computes it:
    the graph's self-loops replaced by one self-loop per row (``add_remaining_self_loops``).

    Returns ``(edge_index without its self-loops, one self-loop per row appended,
    edge_weight)``: edge ``j -> i`` weighs ``1/sqrt((deg_i+1)(deg_j+1))``, a row's self-loop
    ``1/(deg_i+1)``. ``degree``: in-degree without self-loops of each row (the store's
    ``degree_rows``); None means the in-degree within ``edge_index``, as on a whole graph.
    ``keep_loops``: the graph's self-loops stay in place with weight 0 (the same sums, and no
    shape that depends on the data, which a CUDA graph cannot capture).
    """
    is_loop = edge_index[0] == edge_index[1]
    if not keep_loops and bool(is_loop.any()):
        edge_index, is_loop = edge_index[:, ~is_loop], is_loop[~is_loop]
    if degree is None:
        deg = torch.zeros(num_rows, dtype=dtype, device=edge_index.device)
        deg.scatter_add_(0, edge_index[1], (~is_loop).to(dtype))
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
    between = inv_sqrt[src] * inv_sqrt[dst]
    if keep_loops:
        between = between.masked_fill(is_loop, 0.0)
    weight = torch.cat([between, inv_sqrt * inv_sqrt])
    return torch.cat([edge_index, torch.stack([loops, loops])], dim=1), weight


def _gcn_edges_by_hop(
    edge_index: Tensor,
    num_rows: int,
    degree: Tensor | None,
    dtype: torch.dtype,
    level_sizes: Sequence[int],
    hop_edges: Sequence[int] | None = None,
) -> tuple[Tensor, Tensor, list[int]]:
    """GCN's weighted edges with each row's self-loop placed in the hop group that is trimmed
    together with that row: group ``h`` = edges into hop ``h`` + self-loops of hop ``h+1``
    rows (group 0 also holds the seeds' self-loops). The graph's self-loops stay in their hop
    with weight 0, so every size here is known on the host given ``hop_edges``."""
    looped, weight = gcn_norm_with_degree(edge_index, num_rows, degree, dtype, keep_loops=True)
    num_edges = edge_index.size(1)
    hop_edges = known_hop_edges(edge_index, level_sizes, hop_edges)
    offsets = [0, *itertools.accumulate(level_sizes)]
    edge_starts = [0, *itertools.accumulate(hop_edges)]
    order: list[Tensor] = []
    device = edge_index.device
    for hop in range(len(hop_edges)):
        order.append(torch.arange(edge_starts[hop], edge_starts[hop + 1], device=device))
        first_level = 0 if hop == 0 else hop + 1
        order.append(
            torch.arange(
                num_edges + offsets[first_level], num_edges + offsets[hop + 2], device=device
            )
        )
    index = torch.cat(order)
    groups = [
        hop_edges[hop] + offsets[hop + 2] - offsets[0 if hop == 0 else hop + 1]
        for hop in range(len(hop_edges))
    ]
    return looped[:, index], weight[index], groups


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
