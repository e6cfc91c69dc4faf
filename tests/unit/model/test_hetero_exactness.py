"""A seed's answer on its sampled heterogeneous ego-graph equals the full-graph forward: for
every recipe and for the user's ``to_hetero`` and ``HeteroConv`` models, with the boundary hop
where the model asks for it (the product's promise on typed graphs)."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import HeteroData
from torch_geometric.nn import GATConv, GCNConv, GINEConv, HeteroConv, SAGEConv, to_hetero
from torch_geometric.nn.dense import Linear
from torch_geometric.nn.models import MLP

from model.hetero_recipes import HeteroArch, HeteroSpec, build_hetero_model
from model.served_hetero import HeteroNodeModel, UserHeteroModel
from model.typed_batch import inputs_from_hetero_data
from tests.unit.model.hetero_graphs import (
    COUNTS,
    EDGE_WIDTHS,
    FOLLOWS,
    RELATIONS,
    SEEDS,
    SOURCE_ONLY_RELATIONS,
    TARGET,
    WIDTHS,
    answer_on_ego,
    ego_graph,
    random_hetero_graph,
)

TOLERANCE = 1e-5


def spec_for(data: HeteroData, num_layers: int) -> HeteroSpec:
    node_types, edge_types = data.metadata()
    return HeteroSpec(
        node_types=tuple(node_types),
        edge_types=tuple(edge_types),
        in_dims=WIDTHS,
        num_nodes={"device": COUNTS["device"]},
        edge_dims={key: width for key, width in EDGE_WIDTHS.items() if key in edge_types},
        target=TARGET,
        num_classes=3,
        hidden_dim=16,
        num_layers=num_layers,
    )


def difference(
    model: HeteroNodeModel, data: HeteroData, hops: int, boundary: bool, embedding: bool = False
) -> float:
    """Max |ego - full| over the seeds' output rows (and embeddings with ``embedding``)."""
    model.eval()
    with torch.no_grad():
        if embedding:
            full, full_emb = model.forward_with_embedding(inputs_from_hetero_data(data))
        else:
            full, full_emb = model(inputs_from_hetero_data(data)), None
        ego, ego_emb = answer_on_ego(
            model, data, ego_graph(data, SEEDS, hops, boundary), embedding=embedding
        )
    diff = (ego - full[SEEDS]).abs().max().item()
    if full_emb is not None and ego_emb is not None:
        diff = max(diff, (ego_emb - full_emb[SEEDS]).abs().max().item())
    return diff


@pytest.mark.parametrize("relations", [RELATIONS, SOURCE_ONLY_RELATIONS], ids=["all", "src-only"])
@pytest.mark.parametrize("num_layers", [1, 2, 3])
@pytest.mark.parametrize("arch", list(HeteroArch))
def test_recipe_ego_answer_equals_full_graph_answer(arch, num_layers, relations):
    data = random_hetero_graph(seed=1, relations=relations)
    torch.manual_seed(0)
    model = build_hetero_model(arch, spec_for(data, num_layers))
    boundary = model.serving_needs.boundary_degrees
    assert difference(model, data, num_layers, boundary, embedding=True) <= TOLERANCE


def test_only_gcn_needs_boundary_degrees():
    data = random_hetero_graph()
    needs = {
        arch: build_hetero_model(arch, spec_for(data, 2)).serving_needs.boundary_degrees
        for arch in HeteroArch
    }
    assert needs == {arch: arch is HeteroArch.GCN for arch in HeteroArch}


def test_gcn_without_boundary_is_not_exact():
    """The deepest hop's in-degrees are truncated without the boundary hop."""
    data = random_hetero_graph(seed=1)
    torch.manual_seed(0)
    model = build_hetero_model("gcn", spec_for(data, 2))
    assert difference(model, data, hops=2, boundary=False) > 1e-3


@pytest.mark.parametrize("arch", list(HeteroArch))
def test_one_hop_too_few_changes_answers(arch):
    """The comparison is sensitive: an ego-graph one hop short of the layers is not exact."""
    data = random_hetero_graph(seed=1)
    torch.manual_seed(0)
    model = build_hetero_model(arch, spec_for(data, 2))
    assert difference(model, data, hops=1, boundary=True) > 1e-3


class _SmallGNN(torch.nn.Module):
    """A user's homogeneous model, made heterogeneous with ``to_hetero``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = SAGEConv((-1, -1), 16)
        self.conv2 = SAGEConv((-1, -1), 3)

    def forward(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


class _ToHeteroUserModel(torch.nn.Module):
    """PyG's pattern for a featureless type: an embedding indexed by ``n_id``."""

    def __init__(self, metadata) -> None:
        super().__init__()
        self.device = torch.nn.Embedding(COUNTS["device"], 4)
        self.gnn = to_hetero(_SmallGNN(), metadata, aggr="sum")

    def forward(self, x_dict, edge_index_dict, n_id_dict):
        x_dict = {**x_dict, "device": self.device(n_id_dict["device"])}
        return self.gnn(x_dict, edge_index_dict)


class _HeteroConvUserModel(torch.nn.Module):
    """A ``HeteroConv`` stack reading ``edge_attr_dict`` (GATConv and GINEConv with edge_dim on
    the relations with edge features) after a Linear per type."""

    def __init__(self, edge_types, gcn_on_follows: bool = False) -> None:
        super().__init__()
        self.gcn_on_follows = gcn_on_follows
        self.lins = torch.nn.ModuleDict({"user": Linear(-1, 16), "merchant": Linear(-1, 16)})
        self.device = torch.nn.Embedding(COUNTS["device"], 16)
        self.convs = torch.nn.ModuleList()
        for out in (16, 3):
            convs = {}
            for key in edge_types:
                if key == FOLLOWS:
                    convs[key] = (
                        GCNConv(16, out, add_self_loops=False)
                        if gcn_on_follows
                        else GATConv(16, out, add_self_loops=False, edge_dim=2)
                    )
                elif key in EDGE_WIDTHS:
                    convs[key] = GINEConv(MLP([16, 16, out], norm=None), edge_dim=2, train_eps=True)
                else:
                    convs[key] = SAGEConv(16, out)
            self.convs.append(HeteroConv(convs, aggr="sum"))

    def forward(self, x_dict, edge_index_dict, edge_attr_dict, n_id_dict):
        x_dict = {key: lin(x_dict[key]) for key, lin in self.lins.items()}
        x_dict["device"] = self.device(n_id_dict["device"])
        if self.gcn_on_follows:  # GCNConv takes no edge_attr
            edge_attr_dict = {k: v for k, v in edge_attr_dict.items() if k != FOLLOWS}
        for i, conv in enumerate(self.convs):
            out = conv(x_dict, edge_index_dict, edge_attr_dict=edge_attr_dict)
            x_dict = {**x_dict, **{k: v.relu() if i == 0 else v for k, v in out.items()}}
        return x_dict


def _initialised(module: torch.nn.Module, data: HeteroData) -> torch.nn.Module:
    """Lazy layers get their shapes from one forward on the whole graph."""
    with torch.no_grad():
        UserHeteroModel(module, TARGET)(inputs_from_hetero_data(data))
    return module


def test_user_to_hetero_model_is_exact():
    data = random_hetero_graph(seed=2)
    torch.manual_seed(0)
    module = _initialised(_ToHeteroUserModel(data.metadata()), data)
    for relation in ("user__follows__user", "merchant__sells_to__user"):
        model = UserHeteroModel(module, TARGET, embedding=f"gnn.conv2.{relation}")
        assert not model.serving_needs.boundary_degrees
        assert difference(model, data, hops=2, boundary=False, embedding=True) <= TOLERANCE


def test_user_hetero_conv_model_reads_edge_features_exactly():
    data = random_hetero_graph(seed=3)
    torch.manual_seed(0)
    module = _initialised(_HeteroConvUserModel(data.edge_types), data)
    model = UserHeteroModel(module, TARGET, embedding="convs.1")
    assert model.serving_needs.edge_input.value == "edge_attr"
    assert not model.serving_needs.boundary_degrees
    assert difference(model, data, hops=2, boundary=False, embedding=True) <= TOLERANCE
    unused = {key: value * 0 for key, value in data.edge_attr_dict.items()}
    zeroed = data.clone()
    for key, value in unused.items():
        zeroed[key].edge_attr = value
    with torch.no_grad():
        assert not torch.allclose(
            model(inputs_from_hetero_data(data)), model(inputs_from_hetero_data(zeroed))
        )


def test_user_gcn_model_asks_for_the_boundary_and_is_exact_with_it():
    data = random_hetero_graph(seed=4)
    torch.manual_seed(0)
    module = _initialised(_HeteroConvUserModel(data.edge_types, gcn_on_follows=True), data)
    model = UserHeteroModel(module, TARGET)
    assert model.serving_needs.boundary_degrees
    assert difference(model, data, hops=2, boundary=True) <= TOLERANCE
    assert difference(model, data, hops=2, boundary=False) > 1e-4
