"""Model classes a user might ship in a model file (loaded by the tests with --model-file)."""

from __future__ import annotations

import torch
from torch import Tensor
from torch_geometric.nn import (
    APPNP,
    GATv2Conv,
    GINEConv,
    GraphConv,
    ResGatedGraphConv,
    SAGEConv,
    SGConv,
    TransformerConv,
)


class SkipSage(torch.nn.Module):
    """Two SAGEConv layers, a skip connection from the input and a Linear head."""

    def __init__(self, in_channels: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.conv1 = SAGEConv(in_channels, hidden)
        self.conv2 = SAGEConv(hidden, hidden, aggr="max")
        self.skip = torch.nn.Linear(in_channels, hidden)
        self.head = torch.nn.Linear(hidden, classes)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        h = self.conv1(x, edge_index).relu()
        h = self.conv2(h, edge_index) + self.skip(x)
        return self.head(h.relu())


class EdgeMix(torch.nn.Module):
    """Layers that read edge features, mixed: GINEConv, TransformerConv, GATv2Conv."""

    def __init__(self, in_channels: int, hidden: int, classes: int, edge_dim: int) -> None:
        super().__init__()
        mlp = torch.nn.Sequential(torch.nn.Linear(in_channels, hidden), torch.nn.ReLU())
        self.gine = GINEConv(mlp, edge_dim=edge_dim)
        self.transformer = TransformerConv(hidden, hidden, heads=2, concat=False, edge_dim=edge_dim)
        self.gatv2 = GATv2Conv(hidden, classes, edge_dim=edge_dim)

    def forward(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor) -> Tensor:
        h = self.gine(x, edge_index, edge_attr).relu()
        h = self.transformer(h, edge_index, edge_attr).relu()
        return self.gatv2(h, edge_index, edge_attr)


class GatedGraphConv(torch.nn.Module):
    """GraphConv then ResGatedGraphConv, tanh between."""

    def __init__(self, in_channels: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.first = GraphConv(in_channels, hidden)
        self.second = ResGatedGraphConv(hidden, classes)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        return self.second(self.first(x, edge_index).tanh(), edge_index)


class Sgc(torch.nn.Module):
    """SGConv: K propagation steps, one linear map (K hops)."""

    def __init__(self, in_channels: int, classes: int, k: int) -> None:
        super().__init__()
        self.conv = SGConv(in_channels, classes, K=k)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        return self.conv(x, edge_index)


class Appnp(torch.nn.Module):
    """An MLP, then APPNP's K personalised-PageRank steps (K hops)."""

    def __init__(self, in_channels: int, hidden: int, classes: int, k: int) -> None:
        super().__init__()
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(in_channels, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, classes)
        )
        self.propagate = APPNP(K=k, alpha=0.1)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        return self.propagate(self.mlp(x), edge_index)


class GlobalCentre(torch.nn.Module):
    """Not local: subtracts the whole graph's mean before a SAGEConv."""

    def __init__(self, in_channels: int, classes: int) -> None:
        super().__init__()
        self.conv = SAGEConv(in_channels, classes)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        return self.conv(x - x.mean(dim=0, keepdim=True), edge_index)
