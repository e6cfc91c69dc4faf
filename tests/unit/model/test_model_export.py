from __future__ import annotations

import json

import pytest
import torch

from model import ModelConfig, build_model
from model.export import export_model, load_model
from model.train import train_node_classifier


@pytest.fixture(scope="module")
def trained(labelled_graph):
    g = labelled_graph
    config = ModelConfig(in_dim=16, out_dim=3, arch="gcn", hidden_dim=32)
    result = train_node_classifier(g.x, g.edge_index, g.labels, config, epochs=20, progress=False)
    return config, result


def test_round_trip_gives_the_same_answers(tmp_path, trained, labelled_graph):
    config, result = trained
    export_model(result, config, tmp_path / "out")
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == [
        "metrics.json",
        "model.pt",
        "model_config.json",
    ]
    assert json.loads((out / "model_config.json").read_text()) == config.to_dict()
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["arch"] == "gcn"
    assert metrics["test_accuracy"] == result.test_accuracy
    assert metrics["epochs_run"] == result.epochs_run
    state_dict = torch.load(out / "model.pt", weights_only=True)
    assert state_dict.keys() == result.state_dict.keys()

    model, loaded_config = load_model(out)
    assert loaded_config == config and not model.training
    reference = build_model(config).eval()
    reference.load_state_dict(result.state_dict)
    g = labelled_graph
    assert torch.equal(model(g.x, g.edge_index), reference(g.x, g.edge_index))


def test_build_model_from_the_json_file(tmp_path, trained):
    """The archive contract: build_model(json.load(open("model_config.json")))."""
    config, result = trained
    export_model(result, config, tmp_path)
    with open(tmp_path / "model_config.json") as f:
        model = build_model(json.load(f))
    model.load_state_dict(torch.load(tmp_path / "model.pt", weights_only=True))


def test_weights_that_do_not_match_the_config_are_refused(tmp_path, trained):
    config, result = trained
    export_model(result, config, tmp_path)
    wider = ModelConfig.from_dict({**config.to_dict(), "hidden_dim": 16})
    (tmp_path / "model_config.json").write_text(json.dumps(wider.to_dict()))
    with pytest.raises(ValueError) as error:
        load_model(tmp_path)
    message = str(error.value)
    assert "model.pt" in message
    assert "gnn.convs.0.lin.weight (32, 16) (the model has (16, 16))" in message


def test_weights_of_another_arch_are_refused(tmp_path, trained):
    config, result = trained
    export_model(result, config, tmp_path)
    other = ModelConfig.from_dict({**config.to_dict(), "arch": "sage"})
    (tmp_path / "model_config.json").write_text(json.dumps(other.to_dict()))
    with pytest.raises(ValueError, match=r"missing keys gnn.convs.0.lin_l.bias.*unexpected keys"):
        load_model(tmp_path)


def test_export_refuses_weights_of_another_config(tmp_path, trained):
    config, result = trained
    other = ModelConfig.from_dict({**config.to_dict(), "num_layers": 3})
    with pytest.raises(ValueError, match=r"missing keys gnn.convs.2"):
        export_model(result, other, tmp_path)
    assert not any(tmp_path.iterdir())


def test_bad_config_file_is_named(tmp_path, trained):
    config, result = trained
    export_model(result, config, tmp_path)
    (tmp_path / "model_config.json").write_text(json.dumps({**config.to_dict(), "arch": "mlp"}))
    with pytest.raises(ValueError, match=r"model_config.json: arch must be one of"):
        load_model(tmp_path)


def test_missing_files_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"model_config\.json not found"):
        load_model(tmp_path)
