"""Link prediction on a relation of a graph of several node types, the model side: the relation
is required (and checked) on a typed graph and refused on a graph of one; training is seeded
and holds its pairs out of the message-passing graph in both directions; ``python -m model
link`` writes the ends' embeddings and the relation's out-lists."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from graph_assets import GraphStore, open_store, write_store
from graph_assets.input.synthetic_typed import fraud_graph
from graph_assets.schema import GraphSchema
from model import ModelConfig
from model.__main__ import main
from model.typed_graph import hetero_section, target_relation, whole_graph_input
from model.typed_link_train import split_relation, train_typed_link_predictor
from tests.typed_graphs import with_reverses

PAYS = ("user", "pays", "merchant")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> GraphStore:
    path = tmp_path_factory.mktemp("typed_link_model") / "store"
    write_store(with_reverses(fraud_graph(60, 10, 20, 200, seed=2)), path)
    return open_store(path)


def config(store: GraphStore, relation: str | None, **extra: object) -> ModelConfig:
    return ModelConfig(
        **{"task": "link", **extra},
        in_dim=store.feature_dim,
        out_dim=8,
        hidden_dim=8,
        hetero=hetero_section(store.schema, relation),
    )


def test_the_relation_is_required_checked_and_refused_on_one_type(store):
    one_type = GraphSchema.homogeneous(4, 3, 2, [], "int")
    assert target_relation(store.schema, "user__pays__merchant").triple == PAYS
    with pytest.raises(ValueError, match="give --target-edge-type, one of user__pays__merchant"):
        target_relation(store.schema, None)
    with pytest.raises(ValueError, match="no such relation; its relations are user__pays"):
        target_relation(store.schema, "user__buys__item")
    with pytest.raises(ValueError, match="has one node type and one relation \\(node__to__node\\)"):
        target_relation(one_type, "node__to__node")
    assert target_relation(one_type, None) is None
    with pytest.raises(ValueError, match="target_edge_type must be one of user__pays__merchant"):
        config(store, None)
    with pytest.raises(ValueError, match="graph classification of typed graphs"):
        config(store, "user__pays__merchant", task="graph")


def test_held_out_pairs_leave_the_relation_and_its_reverse(store):
    inputs = whole_graph_input(store)
    split = split_relation(inputs, PAYS, seed=0)
    held = {tuple(p) for p in torch.cat([split.val_pos, split.test_pos], 1).t().tolist()}
    kept = {tuple(p) for p in split.message.edge_index_dict[PAYS].t().tolist()}
    reverse = split.message.edge_index_dict[("merchant", "rev_pays", "user")]
    assert held and not held & kept and not held & {tuple(p) for p in reverse.flip(0).t().tolist()}
    attr = split.message.edge_attr_dict[PAYS]
    assert attr.size(0) == split.message.edge_index_dict[PAYS].size(1)
    linked = {tuple(p) for p in inputs.edge_index_dict[PAYS].t().tolist()}
    assert not {tuple(p) for p in split.test_neg.t().tolist()} & linked


def test_training_is_seeded(store):
    inputs = whole_graph_input(store)
    first, again = (
        train_typed_link_predictor(
            inputs, config(store, "user__pays__merchant", arch="gin"), epochs=3, progress=False
        )
        for _ in range(2)
    )
    assert all(torch.equal(first.state_dict[k], again.state_dict[k]) for k in first.state_dict)
    assert first.metrics["target_edge_type"] == "user__pays__merchant"
    assert (
        0.0 <= first.metrics["test_auc"] <= 1.0 and first.metrics["test_ranking_candidates"] == 10
    )


def test_the_cli_writes_the_ends_embeddings_and_the_relations_out_lists(store, tmp_path, capsys):
    out = tmp_path / "model"
    base = ["link", "--store", str(store.path), "--out", str(out), "--quiet", "--epochs", "2"]
    assert main(base) == 2
    assert "give --target-edge-type" in capsys.readouterr().err
    assert main([*base, "--target-edge-type", "user__pays__merchant", "--arch", "hgt"]) == 0
    meta = json.loads((out / "link" / "meta.json").read_text())
    assert meta["target_edge_type"] == "user__pays__merchant"
    assert meta["files"]["out_indices.npy"]["shape"] == [200]  # the payments only
    embeddings = np.load(out / "link" / "embeddings.npy")
    devices = store.schema.node_type("device")
    assert not embeddings[devices.offset : devices.stop].any()  # not an end of the relation
    assert embeddings[: store.schema.node_type("merchant").stop].any(axis=1).all()
    recorded = json.loads((out / "model_config.json").read_text())
    assert recorded["hetero"]["target_edge_type"] == "user__pays__merchant"
