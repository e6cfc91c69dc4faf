"""Model classes written the way PyG's documentation writes them (loaded by the tests with
--model-file; the file imports nothing of ours, as a user's would not): lazy in-channels, an MLP
without message passing, HeteroConv and ``to_hetero`` over PyG's bipartite layers, HGTConv, the
relational layers of one type (RGCNConv, FastRGCNConv, RGATConv, HEATConv) on a typed graph
made homogeneous, ChebConv, and the K-hop layers."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch_geometric import nn as pyg_nn
from torch_geometric.nn import Linear, SAGEConv, to_hetero


def _fraud_inputs(hidden: int, devices: int) -> torch.nn.ModuleDict:
    """Users (8 features) and merchants (4) projected to ``hidden``; devices (featureless)
    an embedding per device, indexed by ``n_id_dict`` as PyG's examples do."""
    return torch.nn.ModuleDict(
        {
            "user": torch.nn.Linear(8, hidden),
            "merchant": torch.nn.Linear(4, hidden),
            "device": torch.nn.Embedding(devices, hidden),
        }
    )


def _fraud_embed(inputs: torch.nn.ModuleDict, x_dict: dict, n_id_dict: dict) -> dict:
    return {
        "user": inputs["user"](x_dict["user"]),
        "merchant": inputs["merchant"](x_dict["merchant"]),
        "device": inputs["device"](n_id_dict["device"]),
    }


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


# --- typed models: HeteroConv and to_hetero over bipartite layers, the relational layers ---


def bipartite_conv(name: str, hidden: int, lazy: bool = False) -> torch.nn.Module:
    """PyG layer ``name`` mapping ``(hidden, hidden)`` (or lazy ``(-1, -1)``) pairs to
    ``hidden``, as a per-relation layer takes it."""
    size: Any = (-1, -1) if lazy else (hidden, hidden)

    def mlp(width: int) -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(width, hidden), torch.nn.ReLU())

    makers: dict[str, Any] = {
        "SAGEConv": lambda: pyg_nn.SAGEConv(size, hidden),
        "GraphConv": lambda: pyg_nn.GraphConv(size, hidden),
        "GATConv": lambda: pyg_nn.GATConv(
            size, hidden, heads=2, concat=False, add_self_loops=False
        ),
        "GATv2Conv": lambda: pyg_nn.GATv2Conv(size, hidden, add_self_loops=False),
        "TransformerConv": lambda: pyg_nn.TransformerConv(size, hidden, heads=2, concat=False),
        "ResGatedGraphConv": lambda: pyg_nn.ResGatedGraphConv(size, hidden),
        "GINConv": lambda: pyg_nn.GINConv(mlp(hidden)),
        "MFConv": lambda: pyg_nn.MFConv(size, hidden),
        "LEConv": lambda: pyg_nn.LEConv(size, hidden),
        "GENConv": lambda: pyg_nn.GENConv(size, hidden),
        "GeneralConv": lambda: pyg_nn.GeneralConv(size, hidden),
        "FiLMConv": lambda: pyg_nn.FiLMConv(size, hidden),
        "CGConv": lambda: pyg_nn.CGConv((hidden, hidden)),
        "EdgeConv": lambda: pyg_nn.EdgeConv(mlp(2 * hidden)),
        "SimpleConv": lambda: pyg_nn.SimpleConv(aggr="mean", combine_root="sum"),
        "WLConvContinuous": lambda: pyg_nn.WLConvContinuous(),
    }
    return makers[name]()


class FraudHeteroConvOf(torch.nn.Module):
    """Two HeteroConv layers of ``conv`` on every relation, a Linear head on users."""

    def __init__(self, conv: str, devices: int, hidden: int, classes: int, metadata: list) -> None:
        super().__init__()
        self.inputs = _fraud_inputs(hidden, devices)
        relations = [tuple(e) for e in metadata[1]]
        self.convs = torch.nn.ModuleList(
            pyg_nn.HeteroConv({r: bipartite_conv(conv, hidden) for r in relations}, aggr="sum")
            for _ in range(2)
        )
        self.head = torch.nn.Linear(hidden, classes)

    def forward(self, x_dict: dict, edge_index_dict: dict, n_id_dict: dict) -> dict:
        h = _fraud_embed(self.inputs, x_dict, n_id_dict)
        for conv in self.convs:
            h = {**h, **{key: value.tanh() for key, value in conv(h, edge_index_dict).items()}}
        return {"user": self.head(h["user"])}


class _Two(torch.nn.Module):
    def __init__(self, conv: str, hidden: int, classes: int, lazy: bool) -> None:
        super().__init__()
        self.conv1 = bipartite_conv(conv, hidden, lazy)
        self.conv2 = bipartite_conv(conv, hidden, lazy)
        self.head = Linear(-1 if lazy else hidden, classes)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        h = self.conv1(x, edge_index).tanh()
        return self.head(self.conv2(h, edge_index).tanh())


class FraudToHeteroOf(torch.nn.Module):
    """``to_hetero`` over two layers of ``conv`` (lazy in-channels with ``lazy``)."""

    def __init__(
        self, conv: str, devices: int, hidden: int, classes: int, metadata: list, lazy: bool
    ) -> None:
        super().__init__()
        node_types, edge_types = metadata
        self.inputs = _fraud_inputs(hidden, devices)
        self.gnn = to_hetero(
            _Two(conv, hidden, classes, lazy), (node_types, [tuple(e) for e in edge_types]), "sum"
        )

    def forward(self, x_dict: dict, edge_index_dict: dict, n_id_dict: dict) -> dict:
        return self.gnn(_fraud_embed(self.inputs, x_dict, n_id_dict), edge_index_dict)


class FraudHgt(torch.nn.Module):
    """Two HGTConv layers (PyG's examples/hetero/hgt_dblp.py), a Linear head on users."""

    def __init__(self, devices: int, hidden: int, classes: int, metadata: list) -> None:
        super().__init__()
        meta = (metadata[0], [tuple(e) for e in metadata[1]])
        self.inputs = _fraud_inputs(hidden, devices)
        self.convs = torch.nn.ModuleList(
            pyg_nn.HGTConv(hidden, hidden, meta, heads=2) for _ in range(2)
        )
        self.head = torch.nn.Linear(hidden, classes)

    def forward(self, x_dict: dict, edge_index_dict: dict, n_id_dict: dict) -> dict:
        h = _fraud_embed(self.inputs, x_dict, n_id_dict)
        for conv in self.convs:
            h = {key: value.tanh() for key, value in conv(h, edge_index_dict).items()}
        return {"user": self.head(h["user"])}


class FraudRelational(torch.nn.Module):
    """A relational layer of one type (RGCNConv, FastRGCNConv, RGATConv, HEATConv) on the
    typed graph made homogeneous, as ``HeteroData.to_homogeneous`` does: every type's rows
    one after another, each edge's relation (and its source's type) as an index."""

    def __init__(self, conv: str, devices: int, hidden: int, classes: int, metadata: list) -> None:
        super().__init__()
        self.conv_name = conv
        self.node_types = list(metadata[0])
        self.relations = [tuple(e) for e in metadata[1]]
        self.inputs = _fraud_inputs(hidden, devices)
        count = len(self.relations)
        layers: dict[str, Any] = {
            "RGCNConv": lambda: pyg_nn.RGCNConv(hidden, hidden, count),
            "FastRGCNConv": lambda: pyg_nn.FastRGCNConv(hidden, hidden, count),
            "RGATConv": lambda: pyg_nn.RGATConv(hidden, hidden, count),
            "HEATConv": lambda: pyg_nn.HEATConv(
                hidden, hidden, len(self.node_types), count, 4, 1, 4, heads=2, concat=False
            ),
        }
        self.convs = torch.nn.ModuleList(layers[conv]() for _ in range(2))
        self.head = torch.nn.Linear(hidden, classes)

    def forward(self, x_dict: dict, edge_index_dict: dict, n_id_dict: dict) -> dict:
        h_dict = _fraud_embed(self.inputs, x_dict, n_id_dict)
        offsets, start = {}, 0
        for node_type in self.node_types:
            offsets[node_type] = start
            start += h_dict[node_type].size(0)
        x = torch.cat([h_dict[t] for t in self.node_types])
        node_type = torch.cat(
            [torch.full((h_dict[t].size(0),), i) for i, t in enumerate(self.node_types)]
        )
        parts, kinds = [], []
        for index, (src, rel, dst) in enumerate(self.relations):
            edges = edge_index_dict.get((src, rel, dst), torch.empty(2, 0, dtype=torch.long))
            shift = torch.tensor([[offsets[src]], [offsets[dst]]])
            parts.append(edges + shift)
            kinds.append(torch.full((edges.size(1),), index))
        edge_index, edge_type = torch.cat(parts, dim=1), torch.cat(kinds)
        for conv in self.convs:
            if self.conv_name == "HEATConv":
                ones = torch.ones(edge_index.size(1), 1)
                x = conv(x, edge_index, node_type, edge_type, ones).tanh()
            else:
                x = conv(x, edge_index, edge_type).tanh()
        users = offsets["user"]
        return {"user": self.head(x[users : users + h_dict["user"].size(0)])}


class Cheb(torch.nn.Module):
    """ChebConv(K): ``K - 1`` propagation steps (hops); ``lambda_max`` passed to forward when
    given, as PyG asks for normalisations other than 'sym'."""

    def __init__(
        self,
        in_channels: int,
        classes: int,
        normalization: str | None,
        lambda_max: float | None,
        K: int = 3,
    ) -> None:
        super().__init__()
        self.conv = pyg_nn.ChebConv(in_channels, classes, K=K, normalization=normalization)
        self.lambda_max = lambda_max

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        if self.lambda_max is None:
            return self.conv(x, edge_index)
        return self.conv(x, edge_index, lambda_max=self.lambda_max)


class KHop(torch.nn.Module):
    """A PyG layer of several propagation steps (``conv``), a Linear in front where it needs
    ``hidden`` wide input and a Linear head."""

    def __init__(self, conv: str, in_channels: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.conv_name = conv
        self.lin = torch.nn.Linear(in_channels, hidden)
        makers: dict[str, Any] = {
            "TAGConv": lambda: pyg_nn.TAGConv(hidden, hidden, K=2),
            "SSGConv": lambda: pyg_nn.SSGConv(hidden, hidden, alpha=0.1, K=2),
            "ARMAConv": lambda: pyg_nn.ARMAConv(hidden, hidden, num_stacks=2, num_layers=2),
            "GatedGraphConv": lambda: pyg_nn.GatedGraphConv(hidden, num_layers=2),
            "MixHopConv": lambda: pyg_nn.MixHopConv(hidden, hidden, powers=[0, 1, 2]),
            "AntiSymmetricConv": lambda: pyg_nn.AntiSymmetricConv(hidden, num_iters=2),
            "GCN2Conv": lambda: pyg_nn.GCN2Conv(hidden, alpha=0.2, theta=0.5, layer=1),
            "FAConv": lambda: pyg_nn.FAConv(hidden, eps=0.2),
        }
        self.conv = makers[conv]()
        width = 3 * hidden if conv == "MixHopConv" else hidden
        self.head = torch.nn.Linear(width, classes)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        h = self.lin(x).relu()
        if self.conv_name in ("GCN2Conv", "FAConv"):  # a step reads the initial rows too
            h = self.conv(self.conv(h, h, edge_index).relu(), h, edge_index)
        else:
            h = self.conv(h, edge_index)
        return self.head(h.relu())
