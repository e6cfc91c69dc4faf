"""A node embedding is the input of the last message-passing layer (or a link encoder's output)."""

from __future__ import annotations

import pytest
import torch

from model import ModelConfig, build_model
from model.architectures import gcn_norm_with_degree


@pytest.mark.parametrize("arch", ["gcn", "sage", "gat", "gin"])
def test_embedding_is_the_last_layers_input(small_graph, arch):
    torch.manual_seed(0)
    config = {"arch": arch, "in_dim": 6, "out_dim": 3, "hidden_dim": 8, "num_layers": 3}
    model = build_model(ModelConfig.from_dict(config)).eval()
    x, edge_index = small_graph.x, small_graph.edge_index
    with torch.no_grad():
        logits, hidden = model.forward_with_embedding(x, edge_index)
        assert torch.equal(logits, model(x, edge_index))
        # Rebuilt by hand: the first L-1 layers, each followed by the ReLU (eval: no dropout).
        kwargs = {}
        if arch == "gcn":
            edge_index, kwargs["edge_weight"] = gcn_norm_with_degree(
                edge_index, x.shape[0], None, x.dtype
            )
        expected = x
        for conv in model.gnn.convs[:-1]:
            expected = model.gnn.act(conv(expected, edge_index, **kwargs))
    assert hidden.shape == (x.shape[0], 8)
    assert torch.allclose(hidden, expected, atol=1e-6)


def test_one_layer_embeds_the_input_features(small_graph):
    model = build_model(ModelConfig(in_dim=6, out_dim=3, num_layers=1)).eval()
    with torch.no_grad():
        _, hidden = model.forward_with_embedding(small_graph.x, small_graph.edge_index)
    assert torch.equal(hidden, small_graph.x)


def test_a_link_predictor_embeds_with_its_encoder(small_graph):
    model = build_model({"task": "link", "in_dim": 6, "out_dim": 4}).eval()
    with torch.no_grad():
        z, embedding = model.forward_with_embedding(small_graph.x, small_graph.edge_index)
    assert z is embedding and z.shape == (small_graph.x.shape[0], 4)


def test_a_graph_classifiers_embedding_is_its_graphs(small_graph):
    model = build_model({"task": "graph", "in_dim": 6, "out_dim": 3, "hidden_dim": 8}).eval()
    with torch.no_grad():
        rows, embedding = model.forward_with_embedding(small_graph.x, small_graph.edge_index)
    assert rows.shape == (1, 3) and embedding.shape == (1, 8)
