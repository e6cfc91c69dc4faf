"""Model classes written the way PyG's documentation writes them (loaded by the tests with
--model-file)."""

from __future__ import annotations

import torch
from torch import Tensor
from torch_geometric.nn import Linear, SAGEConv, to_hetero

from tests.unit.archive_build.user_models import _fraud_embed, _fraud_inputs


class _LazySage(torch.nn.Module):
    """PyG's heterogeneous recipe: ``SAGEConv((-1, -1), ...)`` and ``Linear(-1, ...)``, sizes
    taken from the first forward."""

    def __init__(self, hidden: int, classes: int) -> None:
        super().__init__()
        self.conv1 = SAGEConv((-1, -1), hidden)
        self.conv2 = SAGEConv((-1, -1), hidden)
        self.head = Linear(-1, classes)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        h = self.conv1(x, edge_index).relu()
        return self.head(self.conv2(h, edge_index).relu())


class FraudLazyToHetero(torch.nn.Module):
    """``to_hetero`` over lazy layers, on the fraud graph's per-type inputs."""

    def __init__(self, devices: int, hidden: int, classes: int, metadata: list) -> None:
        super().__init__()
        node_types, edge_types = metadata
        self.inputs = _fraud_inputs(hidden, devices)
        self.gnn = to_hetero(
            _LazySage(hidden, classes), (node_types, [tuple(e) for e in edge_types]), aggr="sum"
        )

    def forward(self, x_dict: dict, edge_index_dict: dict, n_id_dict: dict) -> dict:
        return self.gnn(_fraud_embed(self.inputs, x_dict, n_id_dict), edge_index_dict)


class LazyMlpSage(torch.nn.Module):
    """A graph of one type with lazy layers: ``Linear(-1, ...)`` then a lazy SAGEConv."""

    def __init__(self, hidden: int, classes: int) -> None:
        super().__init__()
        self.lin = Linear(-1, hidden)
        self.conv = SAGEConv(-1, classes)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        return self.conv(self.lin(x).relu(), edge_index)


class Mlp(torch.nn.Module):
    """A baseline without message passing: each node's answer is its own features'."""

    def __init__(self, in_channels: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(in_channels, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, classes)
        )

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        return self.mlp(x)
