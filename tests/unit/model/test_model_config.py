from __future__ import annotations

import json

import pytest

from model import Arch, ModelConfig, Task


def test_defaults_and_json_round_trip():
    config = ModelConfig(in_dim=128, out_dim=8)
    data = config.to_dict()
    assert data == {
        "task": "node",
        "arch": "sage",
        "in_dim": 128,
        "out_dim": 8,
        "hidden_dim": 64,
        "num_layers": 2,
        "heads": 4,
        "dropout": 0.5,
    }
    assert ModelConfig.from_dict(json.loads(json.dumps(data))) == config


def test_strings_become_enums_at_the_edge():
    config = ModelConfig.from_dict({"arch": " GAT ", "task": "node", "in_dim": 3, "out_dim": 2})
    assert config.arch is Arch.GAT and config.task is Task.NODE
    assert config.to_dict()["arch"] == "gat"


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"arch": "gcnn"}, ["arch", "'gcnn'", "'gcn', 'sage', 'gat', 'gin'"]),
        ({"task": "edge"}, ["task", "'edge'", "'node'"]),
        ({"in_dim": 0}, ["in_dim", ">= 1", "0"]),
        ({"out_dim": 1}, ["out_dim", ">= 2", "1"]),
        ({"hidden_dim": 16.0}, ["hidden_dim", "integer", "16.0"]),
        ({"num_layers": 0}, ["num_layers", ">= 1", "0"]),
        ({"num_layers": True}, ["num_layers", "True"]),
        ({"heads": -1}, ["heads", "-1"]),
        ({"dropout": 1.0}, ["dropout", "[0, 1)", "1.0"]),
        ({"dropout": "0.5"}, ["dropout", "'0.5'"]),
        ({"dropout": float("nan")}, ["dropout", "nan"]),
        ({"arch": "gat", "hidden_dim": 30, "heads": 4}, ["divisible", "30", "heads=4"]),
        ({"hidden": 64}, ["unknown", "'hidden'", "hidden_dim"]),
    ],
)
def test_bad_values_name_field_value_and_range(change, words):
    with pytest.raises(ValueError) as error:
        ModelConfig.from_dict({"in_dim": 4, "out_dim": 3, **change})
    for word in words:
        assert word in str(error.value)


def test_missing_dimensions_are_named():
    with pytest.raises(ValueError, match=r"missing \['out_dim'\]"):
        ModelConfig.from_dict({"in_dim": 4})


def test_non_object_is_refused():
    with pytest.raises(ValueError, match="JSON object, got list"):
        ModelConfig.from_dict([1, 2])  # type: ignore[arg-type]


def test_task_specific_keys_are_written_for_their_task_only():
    link = ModelConfig.from_dict({"task": "link", "decoder": "MLP", "in_dim": 4, "out_dim": 8})
    assert link.to_dict()["decoder"] == "mlp" and "pooling" not in link.to_dict()
    graph = ModelConfig.from_dict({"task": "graph", "pooling": "max", "in_dim": 4, "out_dim": 3})
    assert graph.to_dict()["pooling"] == "max" and "decoder" not in graph.to_dict()
    assert ModelConfig.from_dict(graph.to_dict()) == graph
    with pytest.raises(ValueError, match="'sum', 'mean', 'max'"):
        ModelConfig.from_dict({"task": "graph", "pooling": "avg", "in_dim": 4, "out_dim": 3})
