"""``python -m model link`` and ``python -m model graph``: train or package, then export."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import model.__main__ as cli
from graph_assets import open_store, read_graph_dir, write_store
from graph_assets.input.graph_dataset import generate_graph_dataset, write_graph_dataset
from model import ModelConfig
from model.export import load_model
from model.link_assets import open_link_assets


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory):
    from tests.unit.handler.conftest import write_graph_csv

    root = tmp_path_factory.mktemp("link_graph")
    write_store(read_graph_dir(write_graph_csv(root / "input", string_ids=True)), root / "store")
    return root / "store"


def test_link_trains_reports_and_writes_the_candidate_embeddings(tmp_path, store_dir, capsys):
    out = tmp_path / "model"
    argv = ["link", "--store", str(store_dir), "--out", str(out), "--decoder", "mlp"]
    assert cli.main([*argv, "--epochs", "3", "--embedding-dim", "4", "--quiet"]) == 0
    summary = capsys.readouterr().out
    assert "test AUC" in summary and "hits@10" in summary
    metrics = json.loads((out / "metrics.json").read_text())
    assert {"test_auc", "test_hits@10", "test_hits@50", "test_mrr"} <= set(metrics)
    model, config = load_model(out)
    assert config.to_dict()["decoder"] == "mlp" and "pooling" not in config.to_dict()
    store = open_store(store_dir)
    assets = open_link_assets(out / "link", store)
    x = torch.from_numpy(np.array(store.features))
    with torch.no_grad():
        z = model(x, torch.from_numpy(store.edge_index()))
    assert np.allclose(assets.embeddings, z.numpy(), atol=1e-6)
    again = tmp_path / "again"
    weights = ["--weights", str(out / "model.pt")]
    assert cli.main(["link", "--store", str(store_dir), "--out", str(again), *weights]) == 0
    assert json.loads((again / "metrics.json").read_text())["weights"] == "model.pt"


def test_graph_trains_on_a_dataset_store_and_keeps_class_names(tmp_path):
    write_graph_dataset(generate_graph_dataset(40, feature_dim=3), tmp_path / "dataset")
    out = tmp_path / "model"
    argv = ["graph", "--dataset", str(tmp_path / "dataset"), "--out", str(out)]
    assert cli.main([*argv, "--epochs", "2", "--pooling", "mean", "--quiet"]) == 0
    _, config = load_model(out)
    assert config == ModelConfig.from_dict(
        {"task": "graph", "arch": "gin", "pooling": "mean", "in_dim": 3, "out_dim": 4}
    )
    classes = json.loads((out / "classes.json").read_text())["class_names"]
    assert classes == ["cycle", "star", "wheel", "ladder"]


def test_weights_of_another_task_are_refused(tmp_path, store_dir, capsys):
    (tmp_path / "model_config.json").write_text(json.dumps({"in_dim": 6, "out_dim": 3}))
    torch.save({}, tmp_path / "w.pt")
    argv = ["link", "--store", str(store_dir), "--out", str(tmp_path / "o")]
    assert cli.main([*argv, "--weights", str(tmp_path / "w.pt")]) == 2
    assert "task 'node', not 'link'" in capsys.readouterr().err
