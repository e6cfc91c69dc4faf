"""TypedLayout: rows and edges of a typed ego-graph in PyG's per-type form; the one-type case
is the homogeneous graph itself."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import HeteroData
from torch_geometric.nn import GCNConv, SAGEConv, to_hetero

from model.hetero_recipes import (
    DegreeGCNConv,
    HeteroArch,
    HeteroSpec,
    build_hetero_model,
    inv_sqrt_in_degree,
)
from model.served_hetero import UserHeteroModel, answer_seeds
from model.typed_batch import HeteroInput, TypedLayout, inputs_from_hetero_data, take_rows
from tests.unit.model.conftest import random_graph
from tests.unit.model.hetero_graphs import answer_on_ego, ego_graph

NODE_TYPES = ["user", "item"]
EDGE_TYPES = [("user", "rates", "item"), ("item", "rated_by", "user"), ("user", "knows", "user")]


def small_layout() -> TypedLayout:
    # rows: 0 user, 1 item, 2 user, 3 item, 4 user
    row_type = torch.tensor([0, 1, 0, 1, 0])
    edge_index = torch.tensor([[3, 2, 1, 4, 0], [0, 1, 0, 2, 3]])
    edge_type = torch.tensor([1, 0, 1, 2, 0])
    return TypedLayout.build(row_type, edge_index, edge_type, NODE_TYPES, EDGE_TYPES)


def test_layout_splits_rows_and_edges_by_type():
    layout = small_layout()
    assert layout.rows["user"].tolist() == [0, 2, 4]
    assert layout.rows["item"].tolist() == [1, 3]
    assert layout.position.tolist() == [0, 0, 1, 1, 2]
    assert layout.edges[EDGE_TYPES[0]].tolist() == [1, 4]
    assert layout.edge_index_dict[EDGE_TYPES[0]].tolist() == [[1, 0], [0, 1]]
    assert layout.edge_index_dict[EDGE_TYPES[1]].tolist() == [[1, 0], [0, 0]]
    assert layout.edge_index_dict[EDGE_TYPES[2]].tolist() == [[2], [1]]
    ids = torch.tensor([10, 11, 12, 13, 14])
    assert layout.split_edges(ids)[EDGE_TYPES[1]].tolist() == [10, 12]
    assert layout.split_rows(ids)["item"].tolist() == [11, 13]


@pytest.mark.parametrize(
    "device",
    [
        "meta",
        pytest.param(
            "cuda",
            marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
        ),
    ],
)
def test_a_layout_moves_every_tensor_and_keeps_its_values(device):
    layout = small_layout()
    assert layout.to(torch.device("cpu")) is layout
    moved = layout.to(torch.device(device))
    tensors = [moved.position, *moved.rows.values(), *moved.edge_index_dict.values()]
    tensors += list(moved.edges.values())
    assert all(t.device.type == device for t in tensors)
    assert (moved.node_types, moved.edge_types) == (layout.node_types, layout.edge_types)
    if device != "meta":
        assert torch.equal(moved.position.cpu(), layout.position)
        for key, index in layout.edge_index_dict.items():
            assert torch.equal(moved.edge_index_dict[key].cpu(), index)


def test_layout_refuses_an_edge_between_the_wrong_types():
    with pytest.raises(ValueError, match=r"relation \('user', 'rates', 'item'\) has a source"):
        TypedLayout.build(
            torch.tensor([0, 1]),
            torch.tensor([[1], [1]]),
            torch.tensor([0]),
            NODE_TYPES,
            EDGE_TYPES,
        )
    with pytest.raises(ValueError, match=r"edge_type must hold values in \[0, 3\)"):
        TypedLayout.build(
            torch.tensor([0, 1]),
            torch.tensor([[0], [1]]),
            torch.tensor([5]),
            NODE_TYPES,
            EDGE_TYPES,
        )


def test_inputs_checks_row_counts_and_gives_boundary_rows_a_real_index():
    layout = small_layout()
    features = {"user": torch.zeros(3, 2), "item": torch.zeros(2, 0)}
    n_id = {"user": torch.tensor([4, 0, -1]), "item": torch.tensor([1, 2])}
    inputs = layout.inputs(features, n_id, {})
    assert inputs.n_id_dict["user"].tolist() == [4, 0, 0]
    with pytest.raises(ValueError, match=r"features\['item'\] must have 2 rows; got \[3, 0\]"):
        layout.inputs({**features, "item": torch.zeros(3, 0)}, n_id, {})


def test_take_rows_gives_zeros_for_boundary_rows():
    table = torch.arange(6.0).view(3, 2) + 1
    assert take_rows(table, torch.tensor([2, -1, 0])).tolist() == [[5, 6], [0, 0], [1, 2]]
    assert take_rows(torch.empty(3, 0), torch.tensor([-1, 1])).shape == (2, 0)


def test_one_type_layout_is_the_graph_itself():
    graph = random_graph(num_nodes=20, num_edges=50, num_isolated=2, seed=0)
    layout = TypedLayout.build(
        torch.zeros(20, dtype=torch.long),
        graph.edge_index,
        torch.zeros(graph.edge_index.size(1), dtype=torch.long),
        ["node"],
        [("node", "to", "node")],
    )
    assert layout.homogeneous
    assert layout.edge_index_dict[("node", "to", "node")] is graph.edge_index
    assert layout.split_rows(graph.x)["node"] is graph.x
    n_id = {"node": torch.arange(20)}
    inputs = layout.inputs({"node": graph.x}, n_id, {})
    assert inputs.x_dict["node"] is graph.x and inputs.n_id_dict["node"] is n_id["node"]


class _Homogeneous(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = SAGEConv(6, 8)
        self.conv2 = SAGEConv(8, 3)

    def forward(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


def one_type_input(graph) -> tuple[TypedLayout, HeteroInput]:
    n = graph.x.size(0)
    layout = TypedLayout.build(
        torch.zeros(n, dtype=torch.long),
        graph.edge_index,
        torch.zeros(graph.edge_index.size(1), dtype=torch.long),
        ["node"],
        [("node", "to", "node")],
    )
    return layout, layout.inputs({"node": graph.x}, {"node": torch.arange(n)}, {})


def test_one_type_user_model_equals_the_homogeneous_model(small_graph):
    torch.manual_seed(0)
    module = _Homogeneous().eval()
    hetero = to_hetero(module, (["node"], [("node", "to", "node")]))  # one type: same weights
    model = UserHeteroModel(hetero, "node").eval()
    layout, inputs = one_type_input(small_graph)
    with torch.no_grad():
        expected = module(small_graph.x, small_graph.edge_index)
        assert torch.equal(model(inputs), expected)
        answer, _ = answer_seeds(
            model, layout, inputs.x_dict, inputs.n_id_dict, {}, num_seeds=small_graph.x.size(0)
        )
        assert torch.equal(answer, expected)


def test_degree_gcn_conv_is_gcn_conv_without_self_loops_on_one_type(small_graph):
    torch.manual_seed(0)
    ours = DegreeGCNConv(6, 4)
    torch.nn.init.normal_(ours.bias)
    stock = GCNConv(6, 4, add_self_loops=False)
    stock.lin.weight.data.copy_(ours.lin.weight)
    stock.bias.data.copy_(ours.bias)
    _, inputs = one_type_input(small_graph)
    norm = inv_sqrt_in_degree(inputs)["node"]
    expected = stock(small_graph.x, small_graph.edge_index)
    assert torch.allclose(ours(small_graph.x, small_graph.edge_index, norm), expected, atol=1e-6)


@pytest.mark.parametrize("arch", list(HeteroArch))
def test_recipe_on_one_type_is_exact_on_ego_graphs(small_graph, arch):
    """The homogeneous graph as the one-type case: the same exactness, through the layout's
    no-copy path."""
    data = HeteroData()
    data["node"].x = small_graph.x
    data["node", "to", "node"].edge_index = small_graph.edge_index
    spec = HeteroSpec(
        node_types=("node",),
        edge_types=(("node", "to", "node"),),
        in_dims={"node": 6},
        target="node",
        num_classes=3,
        hidden_dim=8,
    )
    torch.manual_seed(0)
    model = build_hetero_model(arch, spec).eval()
    seeds = [0, 7, 12, 39]
    boundary = model.serving_needs.boundary_degrees
    with torch.no_grad():
        full = model(inputs_from_hetero_data(data))[seeds]
        ego, _ = answer_on_ego(model, data, ego_graph(data, seeds, 2, boundary, target="node"))
    assert (ego - full).abs().max().item() <= 1e-5


def test_answer_seeds_refuses_seeds_of_another_type():
    layout = small_layout()
    spec = HeteroSpec(
        node_types=tuple(NODE_TYPES),
        edge_types=tuple(EDGE_TYPES),
        in_dims={"user": 2, "item": 0},
        num_nodes={"item": 4},
        target="item",
        num_classes=2,
        hidden_dim=4,
    )
    model = build_hetero_model("sage", spec)
    features = {"user": torch.zeros(3, 2), "item": torch.zeros(2, 0)}
    n_id = {"user": torch.tensor([0, 1, 2]), "item": torch.tensor([0, 1])}
    with pytest.raises(ValueError, match="first 1 rows must be seeds of the model's target"):
        answer_seeds(model, layout, features, n_id, {}, num_seeds=1)


def test_spec_asks_for_the_node_count_of_a_featureless_type():
    with pytest.raises(ValueError, match="'item' has no features: give its node count"):
        HeteroSpec(
            node_types=tuple(NODE_TYPES),
            edge_types=tuple(EDGE_TYPES),
            in_dims={"user": 2},
            target="user",
            num_classes=2,
        )
