"""Build-time verification cannot be passed without being correct: node, link and graph models
that keep state between calls, whose answer depends on its batch, that give NaN or that read
out-neighbours are each refused in one line naming the cause; the table of modules known not to
be local names the first offender with its path (HANConv in a typed model too)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch_geometric.nn import HANConv, LayerNorm, SAGEConv
from torch_geometric.nn.norm import InstanceNorm

from archive_build import own_model
from archive_build import verify as verification
from graph_assets import GraphStore
from graph_assets.input.graph_dataset import (
    generate_graph_dataset,
    open_graph_dataset,
    write_graph_dataset,
)
from handler.settings import ServingSettings
from tests.edge_graph import CLASSES, FEATURES, edge_feature_store
from tests.typed_graphs import fraud_store
from tests.unit.archive_build import user_models
from tests.unit.archive_build.test_own_model import package_and_verify
from tests.unit.archive_build.test_own_model_tasks import (
    GRAPH_ARGS,
    LINK_ARGS,
    package,
    verify_link,
)
from tests.unit.archive_build.test_own_model_typed import DEVICES, METADATA

ARGS = {"in_channels": FEATURES, "classes": CLASSES}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> GraphStore:
    return edge_feature_store(tmp_path_factory.mktemp("verify"))


def refused(tmp_path: Path, store: GraphStore, name: str, args: dict) -> verification.Verification:
    torch.manual_seed(0)
    result = package_and_verify(tmp_path, store, getattr(user_models, name)(**args), name, args)
    assert isinstance(result, verification.Verification)
    assert not result.passed, result
    assert result.cause and "\n" not in result.cause
    return result


def test_a_statistic_cached_on_the_first_call_is_refused(store, tmp_path):
    """The full-graph forward runs on a copy of its own: it cannot prime the served model."""
    result = refused(tmp_path, store, "CachedCentre", ARGS)
    assert result.worst_abs_diff > 1e-3
    assert result.cause.startswith("the model keeps state between calls")


def test_an_answer_that_depends_on_the_row_count_is_refused(store, tmp_path):
    result = refused(tmp_path, store, "RowCountScaled", ARGS)
    assert result.cause.startswith("the model is not local: an answer depends on the other nodes")


def test_nan_answers_are_refused_naming_them(store, tmp_path, capsys):
    result = refused(tmp_path, store, "LogOfConv", ARGS)
    assert result.worst_abs_diff == float("inf")
    assert result.cause.startswith("the model gives NaN or inf in its full-graph forward")
    yaml = tmp_path / "model-config.yaml"
    yaml.write_text("gnn:\n  fanouts: [-1]\n")
    argv = ["--store", str(store.path), "--model-dir", str(tmp_path / "model")]
    argv += ["--model-config-yaml", str(yaml), "--out", str(tmp_path / "verification.json")]
    capsys.readouterr()
    assert verification.main(argv) == 1
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 1 and "likely cause: the model gives NaN" in errors[0], errors
    written = json.loads((tmp_path / "verification.json").read_text())
    assert written["passed"] is False and written["cause"] == result.cause


def test_a_forward_that_flips_edge_index_is_refused_naming_the_layer(store, tmp_path):
    args = {"in_channels": FEATURES, "hidden": 8, "classes": CLASSES}
    result = refused(tmp_path, store, "FlippedSecondLayer", args)
    assert "SAGEConv at conv2 reads out-neighbours" in result.cause


def test_the_table_names_the_first_non_local_module_with_its_path() -> None:
    model = torch.nn.ModuleDict(
        {
            "conv": SAGEConv(4, 4),
            "local": torch.nn.ModuleList(
                [LayerNorm(4, mode="node"), InstanceNorm(4, track_running_stats=True)]
            ),
            "norms": torch.nn.ModuleList([LayerNorm(4), LayerNorm(4)]),
        }
    )
    assert verification.non_local_module(model) == (
        "LayerNorm(mode='graph') at norms.0 normalises over the whole graph"
    )
    han = HANConv(4, 4, metadata=(["a"], [("a", "to", "a")]))
    assert verification.non_local_module(torch.nn.Sequential(han)).startswith("HANConv at 0 ")
    assert verification.non_local_module(model["local"]) == ""


def test_a_link_model_caching_a_statistic_is_refused(store, tmp_path):
    """Pairs are served alone and in two batch compositions on a copy apart from the one
    that gives decode(encode(whole graph))."""
    torch.manual_seed(0)
    module = user_models.CachedCentreLink(**LINK_ARGS)
    assert package(tmp_path, "link", store.path, module, LINK_ARGS) == 0
    result = verify_link(tmp_path, store)
    assert not result.passed and result.worst_abs_diff > 1e-3
    assert result.cause.startswith("the model keeps state between calls"), result.cause


def test_a_graph_model_giving_nan_is_refused_naming_the_graph(tmp_path):
    path = tmp_path / "dataset"
    write_graph_dataset(generate_graph_dataset(40, seed=3), path)
    args = {"in_channels": GRAPH_ARGS["in_channels"], "classes": GRAPH_ARGS["classes"]}
    torch.manual_seed(0)
    assert package(tmp_path, "graph", path, user_models.LogGraph(**args), args) == 0
    result = verification.verify_graphs(
        tmp_path / "model", open_graph_dataset(path), ServingSettings(task="graph"), 1e-5
    )
    assert not result.passed and result.worst_abs_diff == float("inf")
    assert result.cause.startswith(f"the model gives NaN or inf for graph {result.worst_graph}")


def test_a_link_encoder_on_reversed_edges_is_refused_naming_the_layer(store, tmp_path):
    torch.manual_seed(0)
    module = user_models.FlippedLink(**LINK_ARGS)
    assert package(tmp_path, "link", store.path, module, LINK_ARGS) == 0
    result = verify_link(tmp_path, store)
    assert not result.passed
    assert "SAGEConv at encoder.convs.0 reads out-neighbours" in result.cause, result.cause


def test_a_typed_model_with_hanconv_is_refused_naming_it(tmp_path):
    store = fraud_store(tmp_path / "store", 100, 20, DEVICES, 300, 5)
    args = {"devices": DEVICES, "hidden": 8, "classes": 2, "metadata": METADATA}
    torch.manual_seed(0)
    torch.save(user_models.FraudHan(**args).state_dict(), tmp_path / "weights.pt")
    argv = [
        "--store", str(store.path), "--model-class", "FraudHan", "--model-file",
        user_models.__file__, "--model-args", json.dumps(args), "--weights",
        str(tmp_path / "weights.pt"), "--out", str(tmp_path / "model"),
    ]  # fmt: skip
    assert own_model.main(argv) == 0
    result = verification.verify(tmp_path / "model", store, ServingSettings(fanouts=(-1,)), 1e-5)
    assert not result.passed
    assert "HANConv at han weighs" in result.cause, result.cause
