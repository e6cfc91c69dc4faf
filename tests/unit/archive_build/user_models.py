"""Model classes a user might ship in a model file (loaded by the tests with --model-file): node
models, GAE-style link models (encode and decode), graph-level models, and node and link models of
a graph of several node types."""

from __future__ import annotations

import torch
from torch import Tensor
from torch_geometric.nn import (
    APPNP,
    ChebConv,
    GATConv,
    GATv2Conv,
    GCNConv,
    GINEConv,
    GraphConv,
    HANConv,
    HeteroConv,
    ResGatedGraphConv,
    SAGEConv,
    SGConv,
    TransformerConv,
    global_add_pool,
    global_mean_pool,
    to_hetero,
)
from torch_geometric.nn.models import GAE, GIN, GraphSAGE


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


class SageLink(torch.nn.Module):
    """GAE-style: a stock GraphSAGE encoder and a dot-product decode (scores are logits)."""

    def __init__(self, in_channels: int, hidden: int, out_channels: int) -> None:
        super().__init__()
        self.encoder = GraphSAGE(in_channels, hidden, num_layers=2, out_channels=out_channels)

    def encode(self, x: Tensor, edge_index: Tensor) -> Tensor:
        return self.encoder(x, edge_index)

    def decode(self, z: Tensor, edge_label_index: Tensor) -> Tensor:
        return (z[edge_label_index[0]] * z[edge_label_index[1]]).sum(dim=-1)


class ChebLink(torch.nn.Module):
    """GAE-style with a ChebConv(K=3) encoder without normalisation nor lambda_max: its
    Laplacian reads each node's out-degree and the graph's largest."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv = ChebConv(in_channels, out_channels, K=3, normalization=None)

    def encode(self, x: Tensor, edge_index: Tensor) -> Tensor:
        return self.conv(x, edge_index)

    def decode(self, z: Tensor, edge_label_index: Tensor) -> Tensor:
        return (z[edge_label_index[0]] * z[edge_label_index[1]]).sum(dim=-1)


class EdgeGatLink(torch.nn.Module):
    """An encoder that reads edge features (GATConv with edge_dim, 3 hops with a SAGEConv) and
    an MLP decode on the element-wise product."""

    def __init__(self, in_channels: int, hidden: int, edge_dim: int) -> None:
        super().__init__()
        self.gat = GATConv(in_channels, hidden, heads=2, concat=False, edge_dim=edge_dim)
        self.sage = SAGEConv(hidden, hidden)
        self.gcn = GCNConv(hidden, hidden)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(hidden, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1)
        )

    def encode(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor) -> Tensor:
        h = self.gat(x, edge_index, edge_attr).relu()
        h = self.sage(h, edge_index).relu()
        return self.gcn(h, edge_index)

    def decode(self, z: Tensor, edge_label_index: Tensor) -> Tensor:
        return self.mlp(z[edge_label_index[0]] * z[edge_label_index[1]]).squeeze(-1)


class SageGae(GAE):
    """PyG's own GAE around a GraphSAGE encoder: its decode returns sigmoid probabilities."""

    def __init__(self, in_channels: int, hidden: int, out_channels: int) -> None:
        super().__init__(GraphSAGE(in_channels, hidden, num_layers=2, out_channels=out_channels))


class EncodeOnly(torch.nn.Module):
    """An encoder without a decode."""

    def __init__(self, in_channels: int, hidden: int) -> None:
        super().__init__()
        self.conv = SAGEConv(in_channels, hidden)

    def encode(self, x: Tensor, edge_index: Tensor) -> Tensor:
        return self.conv(x, edge_index)


class PairNormLink(SageLink):
    """Not per pair: decode normalises the scores over every pair it is given."""

    def decode(self, z: Tensor, edge_label_index: Tensor) -> Tensor:
        scores = super().decode(z, edge_label_index)
        return scores - scores.mean()


class GinGraph(torch.nn.Module):
    """Graph classification as PyG's examples write it: GIN layers, sum pooling, an MLP head;
    ``embed`` is the pooled vector."""

    def __init__(self, in_channels: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.gin = GIN(in_channels, hidden, num_layers=3)
        self.head1 = torch.nn.Linear(hidden, hidden)
        self.head2 = torch.nn.Linear(hidden, classes)

    def embed(self, x: Tensor, edge_index: Tensor, batch: Tensor) -> Tensor:
        return global_add_pool(self.gin(x, edge_index).relu(), batch)

    def forward(self, x: Tensor, edge_index: Tensor, batch: Tensor) -> Tensor:
        return self.head2(self.head1(self.embed(x, edge_index, batch)).relu())


class GineGraph(torch.nn.Module):
    """Graph classification that reads edge features (molecules' bonds): GINEConv layers, sum
    pooling, a Linear head."""

    def __init__(self, in_channels: int, hidden: int, classes: int, edge_dim: int) -> None:
        super().__init__()
        first = torch.nn.Sequential(torch.nn.Linear(in_channels, hidden), torch.nn.ReLU())
        second = torch.nn.Sequential(torch.nn.Linear(hidden, hidden), torch.nn.ReLU())
        self.conv1 = GINEConv(first, edge_dim=edge_dim)
        self.conv2 = GINEConv(second, edge_dim=edge_dim)
        self.head = torch.nn.Linear(hidden, classes)

    def forward(self, x: Tensor, edge_index: Tensor, batch: Tensor, edge_attr: Tensor) -> Tensor:
        h = self.conv1(x, edge_index, edge_attr).relu()
        h = self.conv2(h, edge_index, edge_attr)
        return self.head(global_add_pool(h, batch))


class PooledConv(torch.nn.Module):
    """A SAGEConv to class scores, mean-pooled: no Linear layer sees one row per graph."""

    def __init__(self, in_channels: int, classes: int) -> None:
        super().__init__()
        self.conv = SAGEConv(in_channels, classes)

    def forward(
        self, x: Tensor, edge_index: Tensor, batch: Tensor, edge_attr: Tensor | None = None
    ) -> Tensor:
        return global_mean_pool(self.conv(x, edge_index), batch)


class BatchStatsGraph(torch.nn.Module):
    """Batch statistics: BatchNorm1d without running stats normalises over every node of the
    batch, in eval mode too."""

    def __init__(self, in_channels: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.conv = GraphConv(in_channels, hidden)
        self.norm = torch.nn.BatchNorm1d(hidden, track_running_stats=False)
        self.head = torch.nn.Linear(hidden, classes)

    def forward(self, x: Tensor, edge_index: Tensor, batch: Tensor) -> Tensor:
        h = self.norm(self.conv(x, edge_index)).relu()
        return self.head(global_mean_pool(h, batch))


class DropoutGraph(BatchStatsGraph):
    """Randomness in eval mode: dropout with training=True."""

    def forward(self, x: Tensor, edge_index: Tensor, batch: Tensor) -> Tensor:
        h = torch.nn.functional.dropout(self.conv(x, edge_index), p=0.5, training=True)
        return self.head(global_mean_pool(h.relu(), batch))


# --- models of a graph of several node types (the generated fraud graph with its reverses) --


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


class FraudHeteroConv(torch.nn.Module):
    """Two HeteroConv layers on the fraud graph: GATConv reading the payments' edge features,
    SAGEConv on device use; a Linear head on users."""

    def __init__(self, devices: int, hidden: int, classes: int, edge_dim: int) -> None:
        super().__init__()
        self.inputs = _fraud_inputs(hidden, devices)
        self.convs = torch.nn.ModuleList(
            HeteroConv(
                {
                    ("user", "pays", "merchant"): GATConv(
                        hidden, hidden, edge_dim=edge_dim, add_self_loops=False
                    ),
                    ("merchant", "rev_pays", "user"): GATConv(
                        hidden, hidden, edge_dim=edge_dim, add_self_loops=False
                    ),
                    ("user", "uses", "device"): SAGEConv(hidden, hidden),
                    ("device", "rev_uses", "user"): SAGEConv(hidden, hidden),
                },
                aggr="sum",
            )
            for _ in range(2)
        )
        self.head = torch.nn.Linear(hidden, classes)

    def forward(
        self, x_dict: dict, edge_index_dict: dict, edge_attr_dict: dict, n_id_dict: dict
    ) -> dict:
        x_dict = self.encode(x_dict, edge_index_dict, edge_attr_dict, n_id_dict)
        return {"user": self.head(x_dict["user"])}

    def encode(
        self, x_dict: dict, edge_index_dict: dict, edge_attr_dict: dict, n_id_dict: dict
    ) -> dict:
        x_dict = _fraud_embed(self.inputs, x_dict, n_id_dict)
        for conv in self.convs:
            x_dict = {
                **x_dict,
                **{
                    key: value.relu()
                    for key, value in conv(
                        x_dict, edge_index_dict, edge_attr_dict=edge_attr_dict
                    ).items()
                },
            }
        return x_dict


class FraudPaysLink(FraudHeteroConv):
    """A user's link model of user__pays__merchant in PyG's heterogeneous link convention:
    ``FraudHeteroConv``'s encoder, and ``decode(z_dict, edge_label_index)`` an MLP on the
    pair's user and merchant rows (``examples/hetero/movie_lens_sage.py``'s EdgeDecoder)."""

    def __init__(self, devices: int, hidden: int, edge_dim: int) -> None:
        super().__init__(devices, hidden, 1, edge_dim)
        self.pair = torch.nn.Sequential(
            torch.nn.Linear(2 * hidden, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1)
        )

    def decode(self, z_dict: dict, edge_label_index: Tensor) -> Tensor:
        row, col = edge_label_index
        z = torch.cat([z_dict["user"][row], z_dict["merchant"][col]], dim=-1)
        return self.pair(z).view(-1)


class _FraudSage(torch.nn.Module):
    def __init__(self, hidden: int, classes: int) -> None:
        super().__init__()
        self.conv1 = SAGEConv(hidden, hidden)
        self.conv2 = SAGEConv(hidden, classes)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


class FraudToHetero(torch.nn.Module):
    """A homogeneous two-layer GraphSAGE made heterogeneous with PyG's ``to_hetero``."""

    def __init__(self, devices: int, hidden: int, classes: int, metadata: list) -> None:
        super().__init__()
        node_types, edge_types = metadata
        self.inputs = _fraud_inputs(hidden, devices)
        self.gnn = to_hetero(
            _FraudSage(hidden, classes), (node_types, [tuple(e) for e in edge_types]), aggr="sum"
        )

    def forward(self, x_dict: dict, edge_index_dict: dict, n_id_dict: dict) -> dict:
        return self.gnn(_fraud_embed(self.inputs, x_dict, n_id_dict), edge_index_dict)


# --- models that a build must refuse, each for a cause it names ---


class CachedCentre(torch.nn.Module):
    """State kept between calls: centres every input on the mean of its first call's input."""

    def __init__(self, in_channels: int, classes: int) -> None:
        super().__init__()
        self.conv = SAGEConv(in_channels, classes)
        self.centre: Tensor | None = None

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        if self.centre is None:
            self.centre = x.mean(dim=0, keepdim=True)
        return self.conv(x - self.centre, edge_index)


class RowCountScaled(torch.nn.Module):
    """An answer that depends on the input's row count (its scores divided by it)."""

    def __init__(self, in_channels: int, classes: int) -> None:
        super().__init__()
        self.conv = SAGEConv(in_channels, classes)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        return self.conv(x, edge_index) * (100.0 / x.size(0))


class LogOfConv(torch.nn.Module):
    """NaN answers: the log of a SAGEConv's output, negative for some nodes."""

    def __init__(self, in_channels: int, classes: int) -> None:
        super().__init__()
        self.conv = SAGEConv(in_channels, classes)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        return torch.log(self.conv(x, edge_index))


class FlippedSecondLayer(torch.nn.Module):
    """Reads out-neighbours: the second SAGEConv runs on the reversed edges."""

    def __init__(self, in_channels: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.conv1 = SAGEConv(in_channels, hidden)
        self.conv2 = SAGEConv(hidden, classes)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index.flip(0))


class CachedCentreLink(SageLink):
    """State kept between calls, in a link model: encode centres every input on the mean of
    its first call's input."""

    def __init__(self, in_channels: int, hidden: int, out_channels: int) -> None:
        super().__init__(in_channels, hidden, out_channels)
        self.centre: Tensor | None = None

    def encode(self, x: Tensor, edge_index: Tensor) -> Tensor:
        if self.centre is None:
            self.centre = x.mean(dim=0, keepdim=True)
        return super().encode(x - self.centre, edge_index)


class LogGraph(PooledConv):
    """NaN answers for a graph: the log of mean-pooled SAGEConv scores, negative for some."""

    def forward(
        self, x: Tensor, edge_index: Tensor, batch: Tensor, edge_attr: Tensor | None = None
    ) -> Tensor:
        return torch.log(super().forward(x, edge_index, batch))


class FlippedLink(SageLink):
    """Reads out-neighbours, in a link model: encode runs on the reversed edges."""

    def encode(self, x: Tensor, edge_index: Tensor) -> Tensor:
        return super().encode(x, edge_index.flip(0))


class FraudHan(torch.nn.Module):
    """Not local: HANConv weighs the relations into users by an attention averaged over all
    users of its input."""

    def __init__(self, devices: int, hidden: int, classes: int, metadata: list) -> None:
        super().__init__()
        node_types, edge_types = metadata
        self.inputs = _fraud_inputs(hidden, devices)
        self.han = HANConv(hidden, hidden, (node_types, [tuple(e) for e in edge_types]), heads=2)
        self.head = torch.nn.Linear(hidden, classes)

    def forward(self, x_dict: dict, edge_index_dict: dict, n_id_dict: dict) -> dict:
        h = self.han(_fraud_embed(self.inputs, x_dict, n_id_dict), edge_index_dict)
        return {"user": self.head(h["user"])}
