"""The user's own model: packaged by archive_build.own_model and verified by
archive_build.verify against its full-graph forward, for the models and layers PyG ships, on a
graph with edge features, self-loops and parallel edges."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch_geometric.nn import models as pyg
from torch_geometric.utils import degree

from archive_build import own_model
from archive_build.verify import verify
from graph_assets import GraphStore
from handler.settings import ServingSettings
from tests.edge_graph import CLASSES, EDGE_DIM, FEATURES, edge_feature_store
from tests.unit.archive_build import user_models

MODEL_FILE = Path(user_models.__file__)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> GraphStore:
    return edge_feature_store(tmp_path_factory.mktemp("own_model"))


def pna_degree_histogram(store: GraphStore) -> list[int]:
    in_degree = degree(torch.from_numpy(store.edge_index()[1]), store.num_nodes, dtype=torch.long)
    return torch.bincount(in_degree).tolist()


def package_and_verify(
    tmp_path: Path,
    store: GraphStore,
    module: torch.nn.Module,
    model_class: str,
    model_args: dict[str, Any],
    *extra: str,
) -> Any:
    torch.save(module.state_dict(), tmp_path / "weights.pt")
    argv = [
        "--store", str(store.path), "--model-class", model_class,
        "--model-args", json.dumps(model_args), "--weights", str(tmp_path / "weights.pt"),
        "--out", str(tmp_path / "model"), *extra,
    ]  # fmt: skip
    if "." not in model_class:
        argv += ["--model-file", str(MODEL_FILE)]
    if model_class.endswith(".GCN"):  # trained without the graph's edge features as weights
        argv += ["--edge-input", "none"]
    assert own_model.main(argv) == 0
    config = json.loads((tmp_path / "model" / "model_config.json").read_text())
    settings = ServingSettings(fanouts=(5,) * config["num_layers"])
    return verify(tmp_path / "model", store, settings, tolerance=1e-5)


BASIC = "torch_geometric.nn.models."
F, H, C = FEATURES, 16, CLASSES
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "gcn": ("GCN", {"in_channels": F, "hidden_channels": H, "num_layers": 2, "out_channels": C}),
    "gcn-3-layers-tanh-jk": (
        "GCN",
        {
            "in_channels": F,
            "hidden_channels": H,
            "num_layers": 3,
            "out_channels": C,
            "act": "tanh",
            "jk": "cat",
        },
    ),
    "sage-max-tanh-3": (
        "GraphSAGE",
        {
            "in_channels": F,
            "hidden_channels": H,
            "num_layers": 3,
            "out_channels": C,
            "aggr": "max",
            "act": "tanh",
        },
    ),
    "sage-sum-batchnorm": (
        "GraphSAGE",
        {
            "in_channels": F,
            "hidden_channels": H,
            "num_layers": 2,
            "out_channels": C,
            "aggr": "sum",
            "norm": "batch_norm",
        },
    ),
    "sage-std-elu-jk-max": (
        "GraphSAGE",
        {
            "in_channels": F,
            "hidden_channels": H,
            "num_layers": 2,
            "out_channels": C,
            "aggr": "std",
            "act": "elu",
            "jk": "max",
        },
    ),
    "gin": ("GIN", {"in_channels": F, "hidden_channels": H, "num_layers": 3, "out_channels": C}),
    "gat": (
        "GAT",
        {"in_channels": F, "hidden_channels": H, "num_layers": 2, "out_channels": C, "heads": 2},
    ),
    "gatv2": (
        "GAT",
        {"in_channels": F, "hidden_channels": H, "num_layers": 2, "out_channels": C, "v2": True},
    ),
    "gat-edge-dim": (
        "GAT",
        {
            "in_channels": F,
            "hidden_channels": H,
            "num_layers": 2,
            "out_channels": C,
            "edge_dim": EDGE_DIM,
        },
    ),
    "gatv2-edge-dim-batchnorm": (
        "GAT",
        {
            "in_channels": F,
            "hidden_channels": H,
            "num_layers": 2,
            "out_channels": C,
            "v2": True,
            "edge_dim": EDGE_DIM,
            "norm": "batch_norm",
        },
    ),
    "edgecnn": (
        "EdgeCNN",
        {"in_channels": F, "hidden_channels": H, "num_layers": 2, "out_channels": C},
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_pyg_basic_models_are_served_exactly(case: str, store: GraphStore, tmp_path: Path) -> None:
    name, args = CASES[case]
    torch.manual_seed(0)
    module = getattr(pyg, name)(**args)
    result = package_and_verify(tmp_path, store, module, BASIC + name, args)
    assert result.passed, result
    assert result.worst_abs_diff <= 1e-5
    assert result.class_agreement == 1.0


def test_pna_with_edge_features_is_served_exactly(store: GraphStore, tmp_path: Path) -> None:
    args = {
        "in_channels": F, "hidden_channels": H, "num_layers": 2, "out_channels": C,
        "aggregators": ["mean", "min", "max", "std"],
        "scalers": ["identity", "amplification", "attenuation"],
        "deg": {"tensor": pna_degree_histogram(store)}, "edge_dim": EDGE_DIM,
    }  # fmt: skip
    torch.manual_seed(0)
    module = pyg.PNA(**{**args, "deg": torch.tensor(pna_degree_histogram(store))})
    result = package_and_verify(tmp_path, store, module, BASIC + "PNA", args)
    assert result.passed and result.worst_abs_diff <= 1e-5, result


CUSTOM: dict[str, dict[str, Any]] = {
    "SkipSage": {"in_channels": F, "hidden": H, "classes": C},
    "EdgeMix": {"in_channels": F, "hidden": H, "classes": C, "edge_dim": EDGE_DIM},
    "GatedGraphConv": {"in_channels": F, "hidden": H, "classes": C},
    "Sgc": {"in_channels": F, "classes": C, "k": 2},
    "Appnp": {"in_channels": F, "hidden": H, "classes": C, "k": 3},
}


@pytest.mark.parametrize("name", sorted(CUSTOM))
def test_custom_modules_from_a_model_file_are_served_exactly(
    name: str, store: GraphStore, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    module = getattr(user_models, name)(**CUSTOM[name])
    result = package_and_verify(tmp_path, store, module, name, CUSTOM[name])
    assert result.passed and result.worst_abs_diff <= 1e-5, result
    config = json.loads((tmp_path / "model" / "model_config.json").read_text())
    expected_hops = {"Sgc": 2, "Appnp": 3}.get(name, 2 if name != "EdgeMix" else 3)
    assert config["num_layers"] == expected_hops
    assert (tmp_path / "model" / "user_model" / MODEL_FILE.name).is_file()


def test_edge_weight_is_never_guessed(store: GraphStore, tmp_path: Path) -> None:
    """GCN takes edge_weight: whether it was trained with the graph's edge features as weights
    is the user's to say; auto refuses, naming both choices."""
    from model.served import choose_edge_input

    module = pyg.GCN(F, H, 2, C)
    with pytest.raises(ValueError, match=r"--edge-input edge_weight .* or --edge-input none"):
        choose_edge_input(module, EDGE_DIM, "auto")
    assert choose_edge_input(module, EDGE_DIM, "none").value == "none"
    assert choose_edge_input(module, 0, "auto").value == "none"
    with pytest.raises(ValueError, match="exactly one edge feature"):
        choose_edge_input(module, EDGE_DIM, "edge_weight")
    assert choose_edge_input(module, 1, "edge_weight").value == "edge_weight"


def test_a_model_that_is_not_local_is_refused(store: GraphStore, tmp_path: Path) -> None:
    torch.manual_seed(0)
    args = {"in_channels": F, "classes": C}
    result = package_and_verify(
        tmp_path, store, user_models.GlobalCentre(**args), "GlobalCentre", args
    )
    assert not result.passed
    assert result.worst_abs_diff > 1e-3
    assert "not local" in result.cause


def test_graph_wide_layer_norm_is_refused_as_not_local(store: GraphStore, tmp_path: Path) -> None:
    args = {
        "in_channels": F,
        "hidden_channels": H,
        "num_layers": 2,
        "out_channels": C,
        "norm": "layer_norm",
    }
    torch.manual_seed(0)
    result = package_and_verify(tmp_path, store, pyg.GraphSAGE(**args), BASIC + "GraphSAGE", args)
    assert not result.passed and "not local" in result.cause


def test_too_few_hops_are_refused_naming_the_fix(store: GraphStore, tmp_path: Path) -> None:
    name, args = CASES["sage-max-tanh-3"]
    torch.manual_seed(0)
    module = pyg.GraphSAGE(**args)
    result = package_and_verify(tmp_path, store, module, BASIC + name, args, "--num-hops", "2")
    assert not result.passed
    assert "--num-hops 3" in result.cause


@pytest.mark.parametrize(("arch", "plain"), [("gcn", "GCN"), ("sage", "GraphSAGE"), ("gat", "GAT")])
def test_presets_equal_the_plain_pyg_model_with_self_loops_and_parallel_edges(
    store: GraphStore, arch: str, plain: str
) -> None:
    """Weights saved from the plain PyG model load into the preset (no renaming), and the
    preset's served answer is that plain model's full-graph forward on the graph as given."""
    from model import build_model
    from model.served.factory import preset_keys

    torch.manual_seed(0)
    extra = {"heads": 4} if arch == "gat" else {}
    module = getattr(pyg, plain)(F, H, 2, C, **extra).eval()
    preset = build_model({"arch": arch, "in_dim": F, "hidden_dim": H, "out_dim": C, **extra})
    preset.load_state_dict(preset_keys(preset, module.state_dict()))
    x = torch.from_numpy(np.array(store.features))
    edge_index = torch.from_numpy(store.edge_index())
    with torch.no_grad():
        expected = module(x, edge_index)
        assert float((preset.eval()(x, edge_index) - expected).abs().max()) <= 1e-5
    from handler.tasks.node.engine import NodeClassificationEngine

    engine = NodeClassificationEngine.create(
        store, preset, ServingSettings(fanouts=(-1, -1)), torch.device("cpu"), "1"
    )
    ids = store.external_ids(np.arange(store.num_nodes))
    answer = engine.handle([{"body": {"node_ids": ids}}])[0].body["predictions"]
    served = torch.tensor([p["probabilities"] for p in answer])
    assert float((served - torch.softmax(expected, dim=-1)).abs().max()) <= 1e-5


@pytest.mark.parametrize("case", ["gcn", "gat-edge-dim"])
def test_a_graph_too_large_is_checked_on_the_nodes_in_neighbourhoods(
    case: str, store: GraphStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Above WHOLE_GRAPH_EDGES the reference is the forward of the subgraph the sampled nodes'
    (hops + 1)-hop in-neighbourhood induces: the same answers for them as the whole graph's."""
    from archive_build import verify as verification
    from model.export import load_model

    name, args = CASES[case]
    torch.manual_seed(0)
    result = package_and_verify(tmp_path, store, getattr(pyg, name)(**args), BASIC + name, args)
    assert result.passed
    model, _ = load_model(tmp_path / "model")
    nodes = verification.verification_nodes(store)[:40]
    whole = verification.reference_rows(model, store, nodes, 2)
    monkeypatch.setattr(verification, "WHOLE_GRAPH_EDGES", 0)
    closure = verification.reference_rows(model, store, nodes, 2)
    assert float((closure - whole).abs().max()) <= 1e-6
    from model.in_closure import in_closure, store_in_edges

    assert len(in_closure(store_in_edges(store), nodes[:1], 1).nodes) < store.num_nodes


def test_a_precomputed_archive_is_verified_from_its_stored_rows(
    store: GraphStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stored rows are what a --precompute archive answers from: the build compares them,
    and rows that are not the model's forward are refused."""
    import dataclasses

    from archive_build import verify as verification
    from model.export import load_model
    from model.precompute import open_precomputed, precompute, weights_digest

    name, args = CASES["sage-max-tanh-3"]
    torch.manual_seed(0)
    assert package_and_verify(tmp_path, store, pyg.GraphSAGE(**args), BASIC + name, args).passed
    model_dir = tmp_path / "model"
    model, _ = load_model(model_dir)
    rows = tmp_path / "precomputed"
    precompute(model, store, rows, weights_digest(model_dir / "model.pt"), progress=False)
    settings = ServingSettings(fanouts=(5, 5, 5))
    assert verify(model_dir, store, settings, 1e-5, precomputed_dir=rows).passed

    def shifted(*opened: Any) -> Any:
        stored = open_precomputed(*opened)
        return dataclasses.replace(
            stored, layers=[*stored.layers[:-1], stored.layers[-1] * 2.0]
        )  # not a shift: softmax ignores those

    monkeypatch.setattr(verification, "open_precomputed", shifted)
    result = verify(model_dir, store, settings, 1e-5, precomputed_dir=rows)
    assert not result.passed and "precomputed rows" in result.cause
