"""The user's graph-level model behind the graph protocol: one row per graph, the graph
embedding (a named method, else the input of the last Linear layer on one row per graph, else
none), and the build's probe and refusals."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor
from torch_geometric.nn import SAGEConv, global_mean_pool

from model.graph_level import GraphModel
from model.served_graph import UserGraphModel, check_graph_forward, probe_graph
from model.user_model import UserModelConfig
from tests.unit.archive_build import user_models


def adapter(module: torch.nn.Module, embedding: str) -> UserGraphModel:
    config = UserModelConfig(
        task="graph",
        model_class=type(module).__name__,
        in_dim=8,
        out_dim=4,
        num_layers=3,
        embedding=embedding,
    )
    return UserGraphModel(module.eval(), config).eval()


def two_graphs() -> tuple[Tensor, Tensor, Tensor]:
    torch.manual_seed(1)
    x = torch.randn(9, 8)
    edge_index = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 0, 5, 6, 7, 8]])
    return x, edge_index, torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 1])


def test_the_default_embedding_is_the_input_of_the_last_linear_layer_on_graph_rows():
    torch.manual_seed(0)
    module = user_models.GinGraph(8, 16, 4)
    assert probe_graph(module, 8, None).last_linear == "head2"
    model = adapter(module, "head2")
    assert isinstance(model, GraphModel) and model.has_embedding and model.in_dim == 8
    x, edge_index, batch = two_graphs()
    with torch.no_grad():
        rows, embedding = model.forward_with_embedding(x, edge_index, batch)
        assert torch.equal(rows, module(x, edge_index, batch))
        expected = module.head1(module.embed(x, edge_index, batch)).relu()
    assert embedding is not None and torch.allclose(embedding, expected)


def test_a_named_method_is_the_embedding():
    torch.manual_seed(0)
    module = user_models.GinGraph(8, 16, 4)
    assert probe_graph(module, 8, "embed").out_dim == 4
    x, edge_index, batch = two_graphs()
    with torch.no_grad():
        _, embedding = adapter(module, "method:embed").forward_with_embedding(x, edge_index, batch)
        assert embedding is not None
        assert torch.equal(embedding, module.embed(x, edge_index, batch))


def test_a_model_whose_linear_layers_see_only_node_rows_names_no_embedding():
    torch.manual_seed(0)
    module = user_models.PooledConv(8, 4)
    seen = probe_graph(module, 8, None)
    assert seen.last_linear == "" and seen.steps == 1
    model = adapter(module, seen.last_linear)
    x, edge_index, batch = two_graphs()
    with torch.no_grad():
        rows, embedding = model.forward_with_embedding(x, edge_index, batch)
    assert not model.has_embedding and embedding is None and rows.shape == (2, 4)


class NoBatch(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = SAGEConv(8, 4)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        return self.conv(x, edge_index)


class NeedsEdgeAttr(NoBatch):
    def forward(self, x: Tensor, edge_index: Tensor, batch: Tensor, edge_attr: Tensor) -> Tensor:
        return global_mean_pool(self.conv(x, edge_index), batch)


class NodeRows(NoBatch):
    def forward(self, x: Tensor, edge_index: Tensor, batch: Tensor) -> Tensor:
        return self.conv(x, edge_index)


@pytest.mark.parametrize(
    ("module", "says"),
    [
        (NoBatch(), "NoBatch.forward takes 2 argument(s); a graph model's forward is forward("),
        (NeedsEdgeAttr(), "requires edge_attr: inline graphs carry x, edge_index and edge_attr"),
        (NodeRows(), "one row per graph ([num_graphs, C]); on two graphs it returned a tensor of "
                     "shape [12, 4]"),
    ],
)  # fmt: skip
def test_a_forward_that_is_not_graph_level_is_refused_in_one_line(module, says):
    with pytest.raises(ValueError) as error:
        probe_graph(module, 8, None)
    assert says in str(error.value) and "\n" not in str(error.value)


def test_an_edge_attr_with_a_default_is_accepted():
    check_graph_forward(user_models.PooledConv(8, 4))


def test_the_adapter_refuses_rows_that_are_not_one_per_graph():
    model = adapter(NodeRows(), "")
    x, edge_index, batch = two_graphs()
    with pytest.raises(ValueError, match=r"one row per graph, a \[2, C\] tensor"):
        model(x, edge_index, batch)
