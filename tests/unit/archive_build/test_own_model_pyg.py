"""Users' own models as PyG's documentation writes them, packaged by archive_build.own_model
and verified by archive_build.verify against their own full-graph forward (<= 1e-5 with full
neighbourhoods): lazy in-channels (``to_hetero`` over ``SAGEConv((-1, -1))``,
``Linear(-1, ...)``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from archive_build import own_model
from archive_build.verify import Verification, verify
from graph_assets import GraphStore
from handler.settings import ServingSettings
from model.served_hetero import small_typed_input
from tests.edge_graph import CLASSES, FEATURES, edge_feature_store
from tests.typed_graphs import fraud_store
from tests.unit.archive_build import pyg_user_models

MODEL_FILE = Path(pyg_user_models.__file__)
DEVICES = 40


@pytest.fixture(scope="module")
def typed(tmp_path_factory: pytest.TempPathFactory) -> GraphStore:
    return fraud_store(tmp_path_factory.mktemp("pyg_typed") / "store", 100, 20, DEVICES, 300, 5)


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> GraphStore:
    return edge_feature_store(tmp_path_factory.mktemp("pyg_plain"))


def metadata(store: GraphStore) -> list[Any]:
    return [
        list(store.schema.node_type_names),
        [list(r.edge_type.triple) for r in store.schema.relations],
    ]


def typed_sample(store: GraphStore) -> Any:
    """A small typed graph of the store's types, to initialise lazy layers as PyG's docs do."""
    schema = store.schema
    return small_typed_input(
        {t.name: t.feature_dim for t in schema.node_types},
        {r.edge_type.triple: r.edge_feature_dim for r in schema.relations},
    )


def build(
    tmp_path: Path, store: GraphStore, module: torch.nn.Module, name: str, args: dict, *extra: str
) -> int:
    torch.save(module.state_dict(), tmp_path / "weights.pt")
    argv = [
        "--store", str(store.path), "--model-class", name, "--model-file", str(MODEL_FILE),
        "--model-args", json.dumps(args), "--weights", str(tmp_path / "weights.pt"),
        "--out", str(tmp_path / "model"), "--edge-input", "none", *extra,
    ]  # fmt: skip
    return own_model.main(argv)


def verified(tmp_path: Path, store: GraphStore) -> Verification:
    config = json.loads((tmp_path / "model" / "model_config.json").read_text())
    settings = ServingSettings(fanouts=(3,) * max(1, config["num_layers"]))
    result = verify(tmp_path / "model", store, settings, 1e-5)
    assert isinstance(result, Verification)
    return result


def test_to_hetero_over_lazy_layers_builds_and_serves_exactly(typed, tmp_path, capsys):
    args = {"devices": DEVICES, "hidden": 8, "classes": 2, "metadata": metadata(typed)}
    torch.manual_seed(0)
    module = pyg_user_models.FraudLazyToHetero(**args)
    sample = typed_sample(typed)
    with torch.no_grad():  # PyG's docs: one forward initialises the lazy layers
        module(sample.x_dict, sample.edge_index_dict, sample.n_id_dict)
    assert build(tmp_path, typed, module, "FraudLazyToHetero", args) == 0
    assert "2 hops (inferred: 2 calls of one relation's layers" in capsys.readouterr().out
    result = verified(tmp_path, typed)
    assert result.passed and result.worst_abs_diff <= 1e-5, result


def test_lazy_linear_on_a_graph_of_one_type_builds_and_serves_exactly(plain, tmp_path):
    args = {"hidden": 16, "classes": CLASSES}
    torch.manual_seed(0)
    module = pyg_user_models.LazyMlpSage(**args)
    with torch.no_grad():
        module(torch.randn(4, FEATURES), torch.tensor([[0, 1], [1, 2]]))
    assert build(tmp_path, plain, module, "LazyMlpSage", args) == 0
    result = verified(tmp_path, plain)
    assert result.passed and result.worst_abs_diff <= 1e-5, result
    assert result.lines()[0].startswith("  verified 90 nodes (every node answered for) with full")


@pytest.mark.parametrize(
    ("checked", "said"),
    [
        (255, "255 nodes (every node answered for)"),
        (256, "256 nodes (256 random and the 16 highest in-degree, 16 of them among the random"),
        (265, "265 nodes (256 random and the 16 highest in-degree, 7 of them among the random"),
        (272, "272 nodes (256 random and the 16 highest in-degree) with"),
    ],
)
def test_the_verified_line_counts_the_nodes_it_checked(checked: int, said: str) -> None:
    result = Verification(
        passed=True, tolerance=1e-5, worst_abs_diff=0.0, seconds=0.1, nodes=checked,
        worst_node=1, class_agreement=None, sampled_class_agreement=None,
        boundary_degrees=False,
    )  # fmt: skip
    assert f"  verified {said}" in result.lines()[0]


def test_weights_of_another_width_are_refused_in_one_line(plain, tmp_path, capsys):
    """A lazy layer takes the saved shape; one saved for another feature width is refused when
    the build runs the model on the graph, not with a traceback."""
    args = {"hidden": 16, "classes": CLASSES}
    torch.manual_seed(0)
    module = pyg_user_models.LazyMlpSage(**args)
    with torch.no_grad():
        module(torch.randn(4, FEATURES + 3), torch.tensor([[0, 1], [1, 2]]))
    assert build(tmp_path, plain, module, "LazyMlpSage", args) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: LazyMlpSage.forward(x, edge_index) failed on a small graph")
    assert f"with {FEATURES} node features" in err and "Traceback" not in err
