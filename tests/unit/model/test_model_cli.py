"""``python -m model train`` against a stand-in for ``graph_assets.stored.store.GraphStore``."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

import model.__main__ as cli
from graph_assets.schema import GraphSchema
from model.export import load_model
from tests.typed_graphs import fraud_store


def fake_store(graph, num_classes=None):
    features = graph.x.numpy()
    schema = GraphSchema.homogeneous(
        len(features), graph.edge_index.size(1), features.shape[1], [], "int"
    )
    return SimpleNamespace(
        schema=schema,
        features=features,
        labels=graph.labels.numpy(),
        edge_index=lambda: graph.edge_index.numpy(),
        num_classes=graph.num_classes if num_classes is None else num_classes,
        feature_dim=features.shape[1],
        edge_feature_dim=0,
    )


@pytest.fixture
def store(monkeypatch, labelled_graph):
    opened = []

    def open_store(path):
        opened.append(str(path))
        return fake_store(labelled_graph)

    monkeypatch.setattr(cli, "open_store", open_store)
    return opened


def test_train_exports_and_reports(tmp_path, store, capsys):
    options = "--arch gin --hidden-dim 32 --num-layers 3 --epochs 30 --lr 0.02 --quiet"
    status = cli.main(["train", "--store", "STORE", "--out", str(tmp_path), *options.split()])
    assert status == 0 and store == ["STORE"]
    line = capsys.readouterr().out.strip()
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert line.startswith(f"test accuracy {metrics['test_accuracy']:.3f} (val ")
    assert f"{metrics['epochs_run']} epochs" in line
    model, config = load_model(tmp_path)
    assert not model.training
    assert (config.arch.value, config.hidden_dim, config.num_layers) == ("gin", 32, 3)
    assert (config.in_dim, config.out_dim, config.dropout) == (16, 3, 0.5)
    assert metrics["epochs_run"] <= 30


def test_bad_option_gives_one_line_and_status_2(tmp_path, store, capsys):
    status = cli.main(["train", "--store", "S", "--out", str(tmp_path), "--num-layers", "0"])
    assert status == 2
    assert capsys.readouterr().err.strip() == ("error: num_layers must be an integer >= 1, got 0")
    assert not any(tmp_path.iterdir())


def test_preset_weights_that_are_no_weights_file_or_sparse_are_one_line(tmp_path, store, capsys):
    """--arch sage --weights F reads F as --model-class does: one line, not a traceback."""
    zeros = tmp_path / "zeros.pt"
    zeros.write_bytes(bytes(100))
    argv = ["package", "--store", "S", "--arch", "sage", "--out", str(tmp_path / "out")]
    assert cli.main([*argv, "--weights", str(zeros)]) == 2
    assert capsys.readouterr().err == (
        f"error: --weights {zeros} is not a torch or safetensors weights file (it starts with "
        f"{bytes(16)!r}; torch.save writes a zip archive); save torch.save(model.state_dict(), F) "
        "in your training script\n"
    )
    sparse = tmp_path / "sparse.pt"
    torch.save({"gnn.convs.0.lin_l.weight": torch.eye(3).to_sparse()}, sparse)
    assert cli.main([*argv, "--weights", str(sparse)]) == 2
    assert capsys.readouterr().err == (
        f"error: --weights {sparse} holds sparse tensors (gnn.convs.0.lin_l.weight: "
        "torch.sparse_coo), which no module's parameters are; save the model's own "
        "state_dict(), or each tensor's .to_dense()\n"
    )
    assert not (tmp_path / "out").exists()


def test_unlabelled_graph_is_refused(tmp_path, monkeypatch, labelled_graph, capsys):
    monkeypatch.setattr(cli, "open_store", lambda path: fake_store(labelled_graph, 0))
    assert cli.main(["train", "--store", "S", "--out", str(tmp_path)]) == 2
    assert "has 0 label classes" in capsys.readouterr().err


def test_help_names_the_defaults(capsys):
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for fragment in ("(default: sage)", "(default: 64)", "(default: 200)", "(default: 0.01)"):
        assert fragment in text


@pytest.mark.skipif(
    importlib.util.find_spec("graph_assets.__main__") is None,
    reason="graph_assets has no CLI yet (python -m graph_assets synthetic)",
)
def test_real_synthetic_store(tmp_path, capsys):
    """End to end through graph_assets' documented CLI and the real open_store."""
    store = tmp_path / "store"
    subprocess.run(
        [sys.executable, "-m", "graph_assets", "synthetic", "300", "1500", "--out", str(store)],
        check=True,
        capture_output=True,
    )
    status = cli.main(["train", "--store", str(store), "--out", str(tmp_path / "m"), "--quiet"])
    assert status == 0
    assert capsys.readouterr().out.startswith("test accuracy ")
    _, config = load_model(tmp_path / "m")
    assert (config.in_dim, config.out_dim) == (128, 8)


@pytest.mark.parametrize(("arch", "noted"), [("sage", True), ("gat", False)])
def test_a_typed_model_that_reads_no_edge_features_says_so(tmp_path, capsys, arch, noted):
    store = fraud_store(tmp_path / "store", 60, 10, 20, 150, seed=8)
    argv = ["train", "--store", str(store.path), "--arch", arch, "--epochs", "2"]
    assert cli.main([*argv, "--hidden-dim", "8", "--out", str(tmp_path / "m"), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert ("user__pays__merchant (amount, hour)" in out) is noted
    assert ("reads no edge features" in out) is noted
