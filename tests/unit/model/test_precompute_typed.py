"""Precomputed rows of a graph of several node types (model.precompute): every user node's
output, built from its whole in-neighbourhood over every relation, equals the model's forward
on the whole typed graph for every recipe and a user's HeteroConv model reading edge features,
whether the graph is run whole or in chunks, and a link model's ``encode`` embeddings of both
ends of its relation; the plan says so."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graph_assets import GraphStore, StoreError
from model import ModelConfig
from model import __main__ as model_cli
from model.config import Task
from model.export import load_model
from model.hetero_link import HeteroLinkPredictor
from model.link_assets import full_graph_embeddings
from model.precompute import (
    Mode,
    open_precomputed,
    plan_for,
    precompute,
    weights_digest,
)
from model.served_hetero import UserHeteroModel
from model.typed_graph import hetero_section, whole_graph_input
from tests.typed_graphs import fraud_store, hetero_conv_model, node_recipe

ARCHS = ["sage", "gat", "gcn", "gin", "rgcn", "hgt"]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> GraphStore:
    return fraud_store(tmp_path_factory.mktemp("precompute_typed") / "store", 80, 15, 30, 250, 6)


def stored_against_whole_graph(
    model: torch.nn.Module, store: GraphStore, directory, chunk_edges: int
) -> float:
    precompute(model, store, directory, "weights", chunk_edges, progress=False)
    rows = open_precomputed(directory, store, "weights")
    with torch.no_grad():
        expected = model(whole_graph_input(store))
    stored = torch.from_numpy(np.array(rows.layers[0]))
    assert stored.shape == expected.shape == (store.schema.target_type.num_nodes, 2)
    return float((stored - expected).abs().max())


@pytest.mark.parametrize("arch", ARCHS)
def test_every_recipes_stored_outputs_are_its_full_graph_forward(store, tmp_path, arch):
    """In chunks of 64 edges: many in-neighbourhoods, each over every relation."""
    model = node_recipe(store, arch, hidden=8)
    assert stored_against_whole_graph(model, store, tmp_path / "p", 64) <= 1e-5


def test_a_user_heteroconv_model_reading_edge_features_whole_and_in_chunks(store, tmp_path):
    model = hetero_conv_model(store)
    assert stored_against_whole_graph(model, store, tmp_path / "whole", 1 << 21) <= 1e-5
    assert stored_against_whole_graph(model, store, tmp_path / "chunks", 64) <= 1e-5


def test_the_plan_is_every_target_nodes_output(store):
    plan = plan_for(node_recipe(store, "gcn", hidden=8))
    assert plan.mode is Mode.OUTPUT and plan.hops == 2 and plan.degree
    assert "every user node's output" in plan.reason and "every relation" in plan.reason
    assert not plan_for(node_recipe(store, "sage", hidden=8)).degree
    assert "FraudHeteroConv reads a graph of several" in plan_for(hetero_conv_model(store)).reason


def test_a_typed_model_without_its_hops_is_refused(store):
    """An adapter built before its hops are known (a build's probe) has no plan."""
    probing = UserHeteroModel(hetero_conv_model(store).module, store.schema.target)
    with pytest.raises(ValueError, match=r"FraudHeteroConv must be given .*num_layers.*got 0"):
        plan_for(probing)


@pytest.mark.parametrize("arch", ["sage", "gat"])
def test_a_typed_link_models_rows_are_both_ends_encode_embeddings(store, tmp_path, arch):
    """A link model of user__pays__merchant stores every user's and merchant's ``encode``
    embedding at their global indices (the devices, after them, are not stored), as
    decode(encode(whole graph)) reads them."""
    torch.manual_seed(0)
    section = hetero_section(store.schema, "user__pays__merchant")
    config = ModelConfig(
        arch=arch, task=Task.LINK, in_dim=store.feature_dim, out_dim=8, hidden_dim=8,
        heads=2, hetero=section,
    )  # fmt: skip
    model = HeteroLinkPredictor(config).eval()
    plan = plan_for(model)
    assert plan.types == ("user", "merchant")
    assert plan.reason.startswith("every user and merchant node's embedding (encode)")
    precompute(model, store, tmp_path / "p", "weights", 64, progress=False)
    rows = np.array(open_precomputed(tmp_path / "p", store, "weights").layers[0])
    expected = full_graph_embeddings(model, store)
    assert rows.shape == (store.schema.node_type("merchant").stop, 8)
    assert float(np.abs(rows - expected[: len(rows)]).max()) <= 1e-5


def test_rows_of_another_graph_are_refused(store, tmp_path):
    model = node_recipe(store, "sage", hidden=8)
    precompute(model, store, tmp_path / "p", "weights", progress=False)
    rows = open_precomputed(tmp_path / "p", store, "weights")
    assert rows.hops == 2
    other = fraud_store(tmp_path / "other", 81, 15, 30, 250, 6)
    with pytest.raises(StoreError, match="rebuild the archive"):
        open_precomputed(tmp_path / "p", other, "weights")


def test_the_model_cli_precomputes_a_typed_archive(store, tmp_path, capsys):
    """``python -m model precompute`` (what build_mar.sh --precompute runs) on a typed
    recipe's model directory: the config's hops, the target's node count."""
    model_dir = tmp_path / "model"
    argv = ["train", "--store", str(store.path), "--arch", "rgcn", "--out", str(model_dir)]
    assert model_cli.main([*argv, "--epochs", "1", "--hidden-dim", "8", "--quiet"]) == 0
    out = tmp_path / "precomputed"
    argv = ["precompute", "--store", str(store.path), "--model-dir", str(model_dir)]
    assert model_cli.main([*argv, "--out", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "every user node's output" in printed and "of 80 user nodes" in printed
    model, _ = load_model(model_dir)
    rows = open_precomputed(out, store, weights_digest(model_dir / "model.pt"))
    with torch.no_grad():
        expected = model(whole_graph_input(store))
    assert float((torch.from_numpy(np.array(rows.layers[0])) - expected).abs().max()) <= 1e-5
