"""A node embedding is the input of the last message-passing layer (or a link encoder's output)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from model import ModelConfig, build_model
from model.architectures import gcn_norm_with_degree
from model.embedding import forward_with_embedding
from model.served.factory import served_user_model
from model.user_model import UserModelConfig, import_model_class, instantiate


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


def test_the_accessor_refuses_a_model_that_names_no_embedding(small_graph):
    """``model.embedding.forward_with_embedding`` is the contract's, and a user's model whose
    build named no embedding layer has none."""
    config = UserModelConfig(
        model_class="torch_geometric.nn.models.GraphSAGE",
        model_args={"in_channels": 6, "hidden_channels": 8, "num_layers": 2, "out_channels": 3},
        in_dim=6,
        out_dim=3,
        num_layers=2,
    )
    module = instantiate(import_model_class(config.model_class, None), config.model_args)
    model = served_user_model(module.eval(), config)
    with pytest.raises(ValueError, match="no embedding was named for GraphSAGE"):
        forward_with_embedding(model, small_graph.x, small_graph.edge_index)
    named = served_user_model(module, dataclasses.replace(config, embedding="convs.1"))
    with torch.no_grad():
        rows, embedding = forward_with_embedding(named, small_graph.x, small_graph.edge_index)
        assert torch.equal(rows, module(small_graph.x, small_graph.edge_index))
    assert embedding.shape == (small_graph.x.shape[0], 8)
