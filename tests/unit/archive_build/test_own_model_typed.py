"""The user's own model of a graph of several node types: PyG's ``forward(x_dict,
edge_index_dict[, edge_attr_dict][, n_id_dict])`` (a HeteroConv stack reading edge features, a
``to_hetero`` model) packaged by archive_build.own_model, hops inferred per relation, and
verified exact against its full-graph forward; a link model of one relation (``encode`` and
``decode(z_dict, edge_label_index)``) verified against decode(encode(whole graph))."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from archive_build import own_model
from archive_build.verify import LinkVerification, Verification, verify
from graph_assets import GraphStore
from handler.settings import ServingSettings
from model.export import load_model
from model.served_hetero import UserHeteroModel
from model.served_hetero_link import UserHeteroLinkModel
from tests.typed_graphs import fraud_store
from tests.unit.archive_build import user_models

DEVICES = 40
METADATA = [
    ["user", "device", "merchant"],
    [
        ["user", "pays", "merchant"],
        ["merchant", "rev_pays", "user"],
        ["user", "uses", "device"],
        ["device", "rev_uses", "user"],
    ],
]
MODELS: dict[str, dict[str, Any]] = {
    "FraudHeteroConv": {"devices": DEVICES, "hidden": 8, "classes": 2, "edge_dim": 2},
    "FraudToHetero": {"devices": DEVICES, "hidden": 8, "classes": 2, "metadata": METADATA},
}
LINK_MODELS = {"FraudPaysLink": {"devices": DEVICES, "hidden": 8, "edge_dim": 2}}
PAYS = ("user", "pays", "merchant")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> GraphStore:
    return fraud_store(tmp_path_factory.mktemp("own_typed") / "store", 100, 20, DEVICES, 300, 5)


def package(tmp_path: Path, store: GraphStore, name: str, *extra: str) -> int:
    torch.manual_seed(0)
    arguments = {**MODELS, **LINK_MODELS}[name]
    module = getattr(user_models, name)(**arguments)
    with torch.no_grad():  # payments' amounts are ~100: keep the attention from saturating
        for sub in module.modules():
            if isinstance(getattr(sub, "lin_edge", None), torch.nn.Module):
                sub.lin_edge.weight.mul_(1e-3)
    torch.save(module.state_dict(), tmp_path / "weights.pt")
    argv = [
        "--store", str(store.path), "--model-class", name, "--model-file",
        user_models.__file__, "--model-args", json.dumps(arguments), "--weights",
        str(tmp_path / "weights.pt"), "--out", str(tmp_path / "model"), *extra,
    ]  # fmt: skip
    return own_model.main(argv)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_typed_user_model_is_packaged_and_verified(name, store, tmp_path, capsys):
    assert package(tmp_path, store, name) == 0
    out = capsys.readouterr().out
    assert "2 hops (inferred: 2 calls of one relation's layers" in out
    model, config = load_model(tmp_path / "model")
    assert isinstance(model, UserHeteroModel) and model.target == "user"
    assert config.hetero is not None and config.hetero["target"] == "user"
    reads = name == "FraudHeteroConv"
    assert (config.edge_input.value == "edge_attr") is reads
    settings = ServingSettings(fanouts=(3, 3))
    result = verify(tmp_path / "model", store, settings, 1e-5)
    assert isinstance(result, Verification)
    assert result.passed and result.worst_abs_diff <= 1e-5, result
    assert result.nodes == 100


def test_too_few_hops_are_refused_by_verification(store, tmp_path):
    assert package(tmp_path, store, "FraudHeteroConv", "--num-hops", "1") == 0
    result = verify(tmp_path / "model", store, ServingSettings(fanouts=(-1,)), 1e-5)
    assert isinstance(result, Verification)
    assert not result.passed and "--num-hops 2" in result.cause


def test_a_typed_link_model_needs_the_relation_and_encode_and_decode(store, tmp_path, capsys):
    assert package(tmp_path, store, "FraudToHetero", "--task", "link") == 1
    err = capsys.readouterr().err
    assert "--task link on a graph of several node types" in err
    assert "give --target-edge-type, one of user__pays__merchant, " in err
    pays = ("--task", "link", "--target-edge-type", "user__pays__merchant")
    assert package(tmp_path, store, "FraudToHetero", *pays) == 1
    assert "FraudToHetero has no encode or decode method" in capsys.readouterr().err
    assert (
        package(tmp_path, store, "FraudPaysLink", "--target-edge-type", "user__pays__merchant") == 1
    )
    assert "--target-edge-type goes with --task link" in capsys.readouterr().err
    wrong = ("--task", "link", "--target-edge-type", "user__buys__item")
    assert package(tmp_path, store, "FraudPaysLink", *wrong) == 1
    assert "no such relation; its relations are user__pays__merchant" in capsys.readouterr().err


def test_a_typed_user_link_model_is_packaged_and_verified(store, tmp_path, capsys):
    pays = ("--task", "link", "--target-edge-type", "user__pays__merchant")
    assert package(tmp_path, store, "FraudPaysLink", *pays) == 0
    out = capsys.readouterr().out
    assert "2 hops (inferred: 2 calls of one relation's layers" in out
    assert "FraudPaysLink.decode scores user__pays__merchant pairs of 8-wide embeddings" in out
    model, config = load_model(tmp_path / "model")
    assert isinstance(model, UserHeteroLinkModel) and model.edge_type == PAYS
    assert config.hetero is not None and config.hetero["target_edge_type"] == "user__pays__merchant"
    assert config.edge_input.value == "edge_attr"
    result = verify(tmp_path / "model", store, ServingSettings(fanouts=(3, 3), task="link"), 1e-5)
    assert isinstance(result, LinkVerification)
    assert result.passed and result.worst_abs_diff <= 1e-5, result
    assert result.target_edge_type == "user__pays__merchant"
    assert isinstance(result.worst_pair[0], str) and isinstance(result.worst_pair[1], int)
