"""The user's own link and graph models: packaged by archive_build.own_model (--task link|graph)
and verified by archive_build.verify: link pair scores on ego-graphs and top-k over the stored
embeddings against decode(encode(whole graph)), graph answers in batches against each graph
alone; presets of both tasks through the same checks; refusals in one line."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from archive_build import own_model
from archive_build.verify import (
    GraphVerification,
    LinkVerification,
    summary,
    verify,
    verify_graphs,
)
from graph_assets import GraphStore
from graph_assets.input.graph_dataset import (
    GraphDataset,
    generate_graph_dataset,
    open_graph_dataset,
    write_graph_dataset,
)
from handler.explain.ego_explain import ExplainEngine
from handler.settings import ServingSettings
from handler.tasks.graph.engine import GraphEngine
from handler.tasks.graph.explain import GraphExplanation
from model import ModelConfig, build_model
from model import __main__ as model_cli
from model.export import load_model, write_model_files
from model.graph_level import CLASSES_FILE
from model.link_assets import LINK_DIR, open_link_assets, write_link_assets
from tests.edge_graph import EDGE_DIM, FEATURES, edge_feature_store
from tests.unit.archive_build import user_models

MODEL_FILE = Path(user_models.__file__)
LINK_ARGS = {"in_channels": FEATURES, "hidden": 16, "out_channels": 8}
GRAPH_ARGS = {"in_channels": 8, "hidden": 16, "classes": 4}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> GraphStore:
    return edge_feature_store(tmp_path_factory.mktemp("own_link"))


@pytest.fixture(scope="module")
def dataset_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("own_graph") / "dataset"
    write_graph_dataset(generate_graph_dataset(90, seed=3), path)
    return path


@pytest.fixture(scope="module")
def dataset(dataset_path: Path) -> GraphDataset:
    return open_graph_dataset(dataset_path)


GRAPH_EDGE_DIM = 3
GINE_ARGS = {**GRAPH_ARGS, "edge_dim": GRAPH_EDGE_DIM}


@pytest.fixture(scope="module")
def edge_dataset_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The synthetic graphs with three random edge features per edge."""
    plain = generate_graph_dataset(90, seed=3)
    rng = np.random.default_rng(4)
    edge_attr = rng.normal(size=(plain.edge_index.shape[1], GRAPH_EDGE_DIM)).astype(np.float32)
    names = [f"e{i}" for i in range(GRAPH_EDGE_DIM)]
    path = tmp_path_factory.mktemp("own_graph_edges") / "dataset"
    write_graph_dataset(
        dataclasses.replace(plain, edge_attr=edge_attr, edge_feature_names=names), path
    )
    return path


@pytest.fixture(scope="module")
def edge_dataset(edge_dataset_path: Path) -> GraphDataset:
    return open_graph_dataset(edge_dataset_path)


def package(
    tmp_path: Path,
    task: str,
    source: Path,
    module: torch.nn.Module,
    model_args: dict[str, Any],
    *extra: str,
) -> int:
    torch.save(module.state_dict(), tmp_path / "weights.pt")
    argv = [
        "--task", task, "--store" if task == "link" else "--dataset", str(source),
        "--model-class", type(module).__name__, "--model-file", str(MODEL_FILE),
        "--model-args", json.dumps(model_args), "--weights", str(tmp_path / "weights.pt"),
        "--out", str(tmp_path / "model"), *extra,
    ]  # fmt: skip
    return own_model.main(argv)


def verify_link(tmp_path: Path, store: GraphStore) -> LinkVerification:
    hops = json.loads((tmp_path / "model" / "model_config.json").read_text())["num_layers"]
    result = verify(
        tmp_path / "model", store, ServingSettings(task="link", fanouts=(5,) * hops), 1e-5
    )
    assert isinstance(result, LinkVerification)
    return result


LINK_MODELS = {
    "SageLink": (user_models.SageLink, LINK_ARGS, 2),
    "ChebLink": (user_models.ChebLink, {"in_channels": FEATURES, "out_channels": 8}, 2),
    "EdgeGatLink": (
        user_models.EdgeGatLink,
        {"in_channels": FEATURES, "hidden": 16, "edge_dim": EDGE_DIM},
        3,
    ),
}


@pytest.mark.parametrize("name", sorted(LINK_MODELS))
def test_a_link_model_is_served_exactly(name, store, tmp_path, capsys):
    cls, args, hops = LINK_MODELS[name]
    torch.manual_seed(0)
    module = cls(**args).eval()
    assert package(tmp_path, "link", store.path, module, args) == 0
    config = json.loads((tmp_path / "model" / "model_config.json").read_text())
    assert config["task"] == "link" and config["num_layers"] == hops and config["out_dim"] > 0
    assert config["edge_input"] == ("edge_attr" if name == "EdgeGatLink" else "none")
    result = verify_link(tmp_path, store)
    assert result.passed and result.worst_abs_diff <= 1e-5, result
    assert result.pairs == 256 + 32 and result.top_k_pairs == 16 * 10
    assert "verified 288 pairs" in summary(result)[0]
    # The stored embeddings are encode's on the whole graph, with its edge features.
    stored = open_link_assets(tmp_path / "model" / LINK_DIR, store).embeddings
    extra = []
    if name == "EdgeGatLink":
        extra = [torch.from_numpy(np.array(store.edge_features))]
    with torch.no_grad():
        z = module.encode(
            torch.from_numpy(np.array(store.features)), torch.from_numpy(store.edge_index()), *extra
        )
    assert np.array_equal(np.asarray(stored), z.numpy())
    assert "embeddings of 90 nodes" in capsys.readouterr().out


def test_a_precomputed_link_model_is_verified_from_its_stored_rows(store, tmp_path, capsys):
    """--precompute on a link class: encode's embeddings are stored (every node's output)
    and the verification reads pair scores and top-k from them, as the archive answers."""
    cls, args, hops = LINK_MODELS["EdgeGatLink"]
    torch.manual_seed(0)
    assert package(tmp_path, "link", store.path, cls(**args).eval(), args) == 0
    model_dir, rows = tmp_path / "model", tmp_path / "precomputed"
    argv = ["precompute", "--store", str(store.path), "--model-dir", str(model_dir)]
    assert model_cli.main([*argv, "--out", str(rows), "--quiet"]) == 0
    assert "every node's output: EdgeGatLink is a link model" in capsys.readouterr().out
    settings = ServingSettings(task="link", fanouts=(5,) * hops)
    result = verify(model_dir, store, settings, 1e-5, precomputed_dir=rows)
    assert isinstance(result, LinkVerification)
    assert result.passed and result.worst_abs_diff <= 1e-5, result


def test_pygs_gae_is_served_with_output_probabilities_and_a_note_otherwise(store, tmp_path, capsys):
    torch.manual_seed(0)
    module = user_models.SageGae(**LINK_ARGS)
    given, default = tmp_path / "probabilities", tmp_path / "logits"
    given.mkdir(), default.mkdir()
    assert package(given, "link", store.path, module, LINK_ARGS, "--output", "probabilities") == 0
    assert "note:" not in capsys.readouterr().out
    assert verify_link(given, store).passed
    assert package(default, "link", store.path, module, LINK_ARGS) == 0
    assert "build with --output probabilities" in capsys.readouterr().out


def test_a_link_model_without_decode_is_refused_in_one_line(store, tmp_path, capsys):
    args = {"in_channels": FEATURES, "hidden": 8}
    assert package(tmp_path, "link", store.path, user_models.EncodeOnly(**args), args) == 1
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 1 and "EncodeOnly has no decode method" in errors[0]
    assert "encode(x, edge_index[, edge_attr]) -> z" in errors[0]
    assert not (tmp_path / "model").exists()


def test_a_decode_that_is_not_per_pair_is_refused_by_verification(store, tmp_path):
    torch.manual_seed(0)
    module = user_models.PairNormLink(**LINK_ARGS)
    assert package(tmp_path, "link", store.path, module, LINK_ARGS) == 0
    result = verify_link(tmp_path, store)
    assert not result.passed and result.worst_abs_diff > 1e-3
    assert "decode is not per pair" in result.cause


def test_too_few_hops_for_a_link_model_are_refused_naming_the_fix(store, tmp_path):
    cls, args, _ = LINK_MODELS["EdgeGatLink"]
    torch.manual_seed(0)
    assert package(tmp_path, "link", store.path, cls(**args), args, "--num-hops", "2") == 0
    result = verify_link(tmp_path, store)
    assert not result.passed and "--num-hops 3" in result.cause


def test_a_preset_link_archive_is_verified_the_same_way(store, tmp_path):
    config = {"task": "link", "arch": "gcn", "in_dim": FEATURES, "out_dim": 8, "decoder": "mlp"}
    torch.manual_seed(0)
    model = build_model(config).eval()
    write_model_files(model.state_dict(), ModelConfig.from_dict(config), {}, tmp_path / "model")
    write_link_assets(model, store, tmp_path / "model" / LINK_DIR)
    result = verify_link(tmp_path, store)
    assert result.passed and result.worst_abs_diff <= 1e-5, result


GRAPH_MODELS = {
    "GinGraph": (user_models.GinGraph, (), "head2"),
    "GinGraph-embed": (user_models.GinGraph, ("--embedding-method", "embed"), "method:embed"),
    "PooledConv": (user_models.PooledConv, (), ""),
}


@pytest.mark.parametrize("case", sorted(GRAPH_MODELS))
def test_a_graph_model_answers_batched_graphs_as_alone(case, dataset, dataset_path, tmp_path):
    cls, extra, embedding = GRAPH_MODELS[case]
    args = {"in_channels": 8, "classes": 4} if cls is user_models.PooledConv else GRAPH_ARGS
    torch.manual_seed(0)
    assert package(tmp_path, "graph", dataset_path, cls(**args), args, *extra) == 0
    model_dir = tmp_path / "model"
    config = json.loads((model_dir / "model_config.json").read_text())
    assert config["task"] == "graph" and config["embedding"] == embedding
    assert json.loads((model_dir / CLASSES_FILE).read_text())["class_names"] == dataset.class_names
    metrics = json.loads((model_dir / "metrics.json").read_text())
    assert 0 <= metrics["labelled_accuracy"] <= 1
    result = verify_graphs(model_dir, dataset, ServingSettings(task="graph"), 1e-5)
    assert result.passed and result.worst_abs_diff <= 1e-5, result
    assert result.graphs == 64 and result.batch_size == 8


def test_a_graph_model_reading_edge_attr_answers_batched_graphs_as_alone(
    edge_dataset, edge_dataset_path, tmp_path
):
    torch.manual_seed(0)
    module = user_models.GineGraph(**GINE_ARGS).eval()
    assert package(tmp_path, "graph", edge_dataset_path, module, GINE_ARGS) == 0
    model_dir = tmp_path / "model"
    config = json.loads((model_dir / "model_config.json").read_text())
    assert config["edge_input"] == "edge_attr" and config["edge_dim"] == GRAPH_EDGE_DIM
    result = verify_graphs(model_dir, edge_dataset, ServingSettings(task="graph"), 1e-5)
    assert result.passed and result.worst_abs_diff <= 1e-5, result
    # Served: eight graphs with their edge_attr in one batch, each against the module alone.
    model, _ = load_model(model_dir)
    engine = GraphEngine(model, None, ServingSettings(task="graph"), torch.device("cpu"), "1")
    payloads = []
    for g in range(8):
        x, edge_index = edge_dataset.graph(g)
        edge_attr = edge_dataset.graph_edge_attr(g)
        graph = {"x": x.tolist(), "edge_index": edge_index.tolist()}
        payloads.append({"body": {"graph": {**graph, "edge_attr": edge_attr.tolist()}}})
    responses = engine.handle(payloads)
    for g, response in enumerate(responses):
        x, edge_index = edge_dataset.graph(g)
        with torch.no_grad():
            rows = module(
                torch.tensor(x),
                torch.tensor(edge_index),
                torch.zeros(len(x), dtype=torch.long),
                torch.tensor(edge_dataset.graph_edge_attr(g)),
            )
        assert response.status == 200
        expected = torch.softmax(rows, -1)[0].numpy()
        assert np.allclose(response.body["probabilities"], expected, atol=1e-6)
    x, edge_index = edge_dataset.graph(0)
    graph = {"x": x.tolist(), "edge_index": edge_index.tolist()}
    narrow = [[1.0, 2.0]] * edge_index.shape[1]
    refused = engine.handle(
        [{"body": {"graph": graph}}, {"body": {"graph": {**graph, "edge_attr": narrow}}}]
    )
    assert [r.status for r in refused] == [400, 400]
    assert "graph.edge_attr is required" in refused[0].body["error"]
    assert f"[{edge_index.shape[1]}, {GRAPH_EDGE_DIM}]" in refused[1].body["error"]
    # Explained with its edge_attr: Captum hands it to the forward after batch.
    explainer = ExplainEngine(GraphExplanation(engine), "1")
    [explained] = explainer.handle([payloads[0]])
    assert explained.status == 200, explained.body
    assert explained.body["predicted_class"] == responses[0].body["predicted_class"]


@pytest.mark.parametrize(
    ("cls", "says"),
    [
        (user_models.BatchStatsGraph, "depends on the other graphs of its batch"),
        (user_models.DropoutGraph, "not deterministic"),
    ],
)
def test_batch_statistics_and_randomness_are_refused_by_verification(
    cls, says, dataset, dataset_path, tmp_path
):
    torch.manual_seed(0)
    assert package(tmp_path, "graph", dataset_path, cls(**GRAPH_ARGS), GRAPH_ARGS) == 0
    result = verify_graphs(tmp_path / "model", dataset, ServingSettings(task="graph"), 1e-5)
    assert isinstance(result, GraphVerification)
    assert not result.passed and result.worst_abs_diff > 1e-3 and says in result.cause


def test_a_preset_graph_archive_is_verified_the_same_way(dataset, tmp_path):
    config = {"task": "graph", "arch": "gin", "in_dim": 8, "out_dim": 4}
    torch.manual_seed(0)
    model = build_model(config).eval()
    write_model_files(model.state_dict(), ModelConfig.from_dict(config), {}, tmp_path / "model")
    result = verify_graphs(tmp_path / "model", dataset, ServingSettings(task="graph"), 1e-5)
    assert result.passed and result.worst_abs_diff <= 1e-5, result


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (("--num-hops", "2"), "--num-hops goes with node and link archives"),
        (("--edge-input", "edge_attr"), "--edge-input edge_attr: the graph has no edge features"),
        (("--embedding-method", "missing"), "GinGraph has no such method"),
        (("--model-args", json.dumps({**GRAPH_ARGS, "classes": 3})),
         "returns 3 values per graph but the dataset has 4 classes"),
    ],
)  # fmt: skip
def test_bad_graph_options_are_refused_in_one_line(
    extra, says, dataset, dataset_path, tmp_path, capsys
):
    torch.manual_seed(0)
    args = json.loads(extra[1]) if extra[0] == "--model-args" else GRAPH_ARGS
    module = user_models.GinGraph(**args)
    options = () if extra[0] == "--model-args" else extra
    assert package(tmp_path, "graph", dataset_path, module, args, *options) == 1
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 1 and says in errors[0], errors


def test_a_forward_requiring_edge_attr_is_refused_on_a_dataset_without_them(
    dataset_path, tmp_path, capsys
):
    module = user_models.GineGraph(**GINE_ARGS)
    assert package(tmp_path, "graph", dataset_path, module, GINE_ARGS) == 1
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 1 and "GineGraph.forward requires edge_attr" in errors[0], errors


def test_the_embedding_method_is_refused_for_link_archives(store, tmp_path, capsys):
    module = user_models.SageLink(**LINK_ARGS)
    assert (
        package(tmp_path, "link", store.path, module, LINK_ARGS, "--embedding-method", "encode")
        == 1
    )
    assert "a link archive's embeddings are what encode returns" in capsys.readouterr().err
