"""Link predictor module, edge split and training."""

from __future__ import annotations

import pytest
import torch

from model import ModelConfig, build_model
from model.link import LinkPredictor
from model.link_train import split_edges, train_link_predictor
from model.metrics import pair_keys

from .conftest import homophilous_graph


def link_config(**changes) -> ModelConfig:
    return ModelConfig.from_dict({"task": "link", "in_dim": 16, "out_dim": 8, **changes})


@pytest.mark.parametrize("decoder", ["dot", "mlp"])
def test_scores_are_symmetric_and_score_against_matches_pairwise(decoder):
    torch.manual_seed(0)
    model = build_model(link_config(decoder=decoder)).eval()
    assert isinstance(model, LinkPredictor)
    z = torch.randn(30, 8)
    with torch.no_grad():
        assert torch.allclose(model.score(z[:5], z[5:10]), model.score(z[5:10], z[:5]))
        against = model.score_against(z[3], z)
        assert torch.allclose(against, model.score(z[3].expand_as(z), z), atol=1e-6)


def test_state_dict_keys_name_encoder_and_decoder():
    keys = build_model(link_config(decoder="mlp")).state_dict().keys()
    assert all(k.startswith(("encoder.gnn.", "decoder.mlp.")) for k in keys)
    assert any(k.startswith("decoder.") for k in keys)


def test_split_holds_out_whole_pairs_and_draws_true_negatives():
    graph = homophilous_graph(num_nodes=200)
    n, edges = 200, graph.edge_index
    split = split_edges(edges, n, val_fraction=0.1, test_fraction=0.1, seed=1)
    held = torch.cat([split.val_pos, split.test_pos], dim=1)
    held_keys = pair_keys(held.min(0).values, held.max(0).values, n)
    train_keys = pair_keys(split.train.min(0).values, split.train.max(0).values, n)
    assert not torch.isin(train_keys, held_keys).any()  # neither direction leaks
    all_keys = pair_keys(*torch.cat([edges, edges.flip(0)], dim=1), n)
    negatives = torch.cat([split.val_neg, split.test_neg], dim=1)
    assert not torch.isin(pair_keys(*negatives, n), all_keys).any()
    assert (negatives[0] != negatives[1]).all()
    assert split.val_neg.shape == split.val_pos.shape
    again = split_edges(edges, n, val_fraction=0.1, test_fraction=0.1, seed=1)
    assert torch.equal(again.test_neg, split.test_neg) and torch.equal(again.train, split.train)


def test_training_beats_chance_and_is_repeatable():
    graph = homophilous_graph(num_nodes=150)
    config = link_config(hidden_dim=16, dropout=0.0)
    first = train_link_predictor(graph.x, graph.edge_index, config, epochs=12, progress=False)
    assert first.metrics["test_auc"] > 0.6
    for key in ("test_hits@10", "test_hits@50", "test_mrr", "val_auc", "train_edges"):
        assert key in first.metrics
    second = train_link_predictor(graph.x, graph.edge_index, config, epochs=12, progress=False)
    assert second.metrics["test_auc"] == first.metrics["test_auc"]


def test_too_few_edges_to_split_is_explained():
    with pytest.raises(ValueError, match="too few to hold out"):
        split_edges(torch.tensor([[0, 1], [1, 2]]), 3)
