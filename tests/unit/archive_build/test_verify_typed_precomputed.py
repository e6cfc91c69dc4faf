"""The build's check of a precomputed archive of a graph of several node types
(archive_build.verify): its stored rows are what it answers from (a node archive's users, a
link archive's users and merchants), compared with the model's forward on the whole typed
graph; rows that are not are refused as a bug."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from archive_build import verify as verification
from graph_assets import GraphStore
from handler.settings import ServingSettings
from model import __main__ as model_cli
from model.precompute import open_precomputed
from tests.typed_graphs import fraud_store, node_recipe


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> GraphStore:
    return fraud_store(tmp_path_factory.mktemp("verify_typed") / "store", 80, 15, 30, 250, 6)


def test_stored_rows_are_verified_and_wrong_ones_refused(
    store: GraphStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model_dir, rows = tmp_path / "model", tmp_path / "precomputed"
    train = ["train", "--store", str(store.path), "--arch", "gat", "--out", str(model_dir)]
    assert model_cli.main([*train, "--epochs", "1", "--hidden-dim", "8", "--quiet"]) == 0
    argv = ["precompute", "--store", str(store.path), "--model-dir", str(model_dir)]
    assert model_cli.main([*argv, "--out", str(rows), "--quiet"]) == 0
    settings = ServingSettings(fanouts=(2, 2))
    result = verification.verify(model_dir, store, settings, 1e-5, precomputed_dir=rows)
    assert result.passed and result.worst_abs_diff <= 1e-5, result

    def doubled(*opened: Any) -> Any:  # not a shift: softmax ignores those
        stored = open_precomputed(*opened)
        return dataclasses.replace(stored, layers=[stored.layers[0] * 2.0])

    monkeypatch.setattr(verification, "open_precomputed", doubled)
    result = verification.verify(model_dir, store, settings, 1e-5, precomputed_dir=rows)
    assert not result.passed and "precomputed rows" in result.cause


def test_a_typed_link_archives_stored_embeddings_are_verified(
    store: GraphStore, tmp_path: Path
) -> None:
    """Pair scores and the hubs' top-k from the stored user and merchant embeddings, against
    decode(encode(whole typed graph))."""
    model_dir, rows = tmp_path / "model", tmp_path / "precomputed"
    train = ["link", "--store", str(store.path), "--arch", "rgcn", "--out", str(model_dir)]
    relation = ["--target-edge-type", "user__pays__merchant", "--embedding-dim", "8"]
    assert model_cli.main([*train, *relation, "--epochs", "1", "--hidden-dim", "8"]) == 0
    argv = ["precompute", "--store", str(store.path), "--model-dir", str(model_dir)]
    assert model_cli.main([*argv, "--out", str(rows), "--quiet"]) == 0
    settings = ServingSettings(fanouts=(2, 2))
    result = verification.verify(model_dir, store, settings, 1e-5, precomputed_dir=rows)
    assert result.passed and result.worst_abs_diff <= 1e-5, result


@pytest.mark.parametrize("arch", ["gcn", "gat", "hgt"])
def test_a_typed_graph_too_large_is_checked_on_the_nodes_in_neighbourhoods(
    store: GraphStore, arch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Above WHOLE_GRAPH_EDGES a typed model's reference is its forward on the checked users'
    (hops + 1)-hop in-neighbourhood over every relation: the whole graph's answers for them
    (gcn: the sources' degrees; gat: edge features)."""
    model = node_recipe(store, arch)
    nodes = verification.verification_nodes(store)[:25]
    whole = verification.reference_rows(model, store, nodes, 2)
    monkeypatch.setattr(verification, "WHOLE_GRAPH_EDGES", 0)
    closure = verification.reference_rows(model, store, nodes, 2)
    assert float((closure - whole).abs().max()) <= 1e-6
