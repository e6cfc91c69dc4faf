from __future__ import annotations

import pytest
import torch
from torch_geometric.nn import models as pyg_models

from model import ModelConfig, build_model
from model.architectures import (
    GAT,
    GCN,
    GIN,
    GraphSAGE,
    gcn_norm_with_degree,
)
from model.trimmed import layer_on_rows, runs_stock_propagate

ARCH_CLASSES = {"gcn": GCN, "sage": GraphSAGE, "gat": GAT, "gin": GIN}


@pytest.mark.parametrize("num_layers", [1, 2, 3])
@pytest.mark.parametrize("arch", sorted(ARCH_CLASSES))
def test_build_model_gives_logits_per_row(small_graph, arch, num_layers):
    config = {"arch": arch, "in_dim": 6, "out_dim": 3, "hidden_dim": 8, "num_layers": num_layers}
    model = build_model(config).eval()
    assert isinstance(model, ARCH_CLASSES[arch])
    assert isinstance(build_model(ModelConfig.from_dict(config)), ARCH_CLASSES[arch])
    logits = model(small_graph.x, small_graph.edge_index)
    assert logits.shape == (40, 3)
    degree = torch.bincount(small_graph.edge_index[1], minlength=40)
    assert torch.equal(model(small_graph.x, small_graph.edge_index, degree), logits)
    assert len(model.gnn.convs) == num_layers


def test_gcn_equals_pyg_gcn_on_the_whole_graph(small_graph):
    """With degree=None our GCN is PyG's GCN (GCNConv normalize=True) with the same weights."""
    torch.manual_seed(0)
    model = build_model({"arch": "gcn", "in_dim": 6, "out_dim": 3, "num_layers": 3}).eval()
    reference = pyg_models.GCN(6, 64, 3, 3).eval()
    for p in model.parameters():
        p.data.add_(0.1 * torch.randn_like(p))
    reference.load_state_dict(model.gnn.state_dict())
    expected = reference(small_graph.x, small_graph.edge_index)
    got = model(small_graph.x, small_graph.edge_index)
    assert torch.allclose(got, expected, atol=1e-6)


def test_gcn_weights_follow_given_degrees():
    edge_index = torch.tensor([[1], [0]])
    degree = torch.tensor([3, 8])
    edges, weight = gcn_norm_with_degree(edge_index, 2, degree, torch.float32)
    assert edges.tolist() == [[1, 0, 1], [0, 0, 1]]
    assert torch.allclose(weight, torch.tensor([1 / 6, 1 / 4, 1 / 9]))


def test_gcn_refuses_a_degree_of_the_wrong_length(small_graph):
    model = build_model({"arch": "gcn", "in_dim": 6, "out_dim": 3})
    with pytest.raises(ValueError, match=r"shape \(40,\), got shape \(39,\)"):
        model(small_graph.x, small_graph.edge_index, torch.ones(39))


def test_gat_concatenates_heads_on_hidden_layers():
    model = build_model({"arch": "gat", "in_dim": 6, "out_dim": 3, "hidden_dim": 16, "heads": 4})
    first, last = model.gnn.convs
    assert (first.heads, first.out_channels, first.concat) == (4, 4, True)
    assert last.concat is False


def test_dropout_only_in_training(small_graph):
    model = build_model({"arch": "sage", "in_dim": 6, "out_dim": 3, "dropout": 0.5})
    model.train()
    a = model(small_graph.x, small_graph.edge_index)
    b = model(small_graph.x, small_graph.edge_index)
    assert not torch.equal(a, b)
    model.eval()
    assert torch.equal(
        model(small_graph.x, small_graph.edge_index), model(small_graph.x, small_graph.edge_index)
    )


@pytest.mark.parametrize("arch", ["sage", "gin"])
def test_direct_layers_equal_pyg_propagate(small_graph, arch):
    """SAGE and GIN compute a trimmed layer from the conv's own weights, without PyG's
    propagate; each layer gives exactly what the PyG conv gives on the same bipartite input."""
    torch.manual_seed(1)
    model = build_model({"arch": arch, "in_dim": 6, "out_dim": 3, "hidden_dim": 8}).eval()
    x, edge_index = small_graph.x, small_graph.edge_index
    rows = 25
    into_rows = edge_index[:, edge_index[1] < rows]
    with torch.no_grad():
        for conv in model.gnn.convs:
            direct = layer_on_rows(conv, x, rows, into_rows)
            assert torch.equal(direct, conv((x, x[:rows]), into_rows))
            x = torch.relu(conv(x, edge_index))


def test_a_conv_with_hooks_or_an_explainer_takes_pyg_propagate(small_graph):
    """Hooks and explainer masks live in PyG's propagate: such a conv is never bypassed."""
    model = build_model({"arch": "sage", "in_dim": 6, "out_dim": 3}).eval()
    conv = model.gnn.convs[0]
    assert runs_stock_propagate(conv)
    calls = []
    conv.register_propagate_forward_hook(lambda *args: calls.append(1))
    into_rows = small_graph.edge_index[:, small_graph.edge_index[1] < 25]
    with torch.no_grad():
        layer_on_rows(conv, small_graph.x, 25, into_rows)
    assert calls == [1]
    explained = build_model({"arch": "sage", "in_dim": 6, "out_dim": 3}).gnn.convs[0]
    explained.explain = True
    assert not runs_stock_propagate(explained)
