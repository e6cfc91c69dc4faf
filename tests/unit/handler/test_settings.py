"""Serving settings from the model-config YAML, and the YAML that build_mar.sh writes."""

from __future__ import annotations

import json

import pytest
import yaml

from archive_build.archive_config import main as write_archive_config
from handler.settings import ServingSettings, default_fanouts, parse_fanouts, worker_settings


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("-1,-1", (-1, -1)),
        ("25, 10", (25, 10)),
        ([5, -1, 3], (5, -1, 3)),
        ("7", (7,)),
        ([], ()),  # a model without message passing samples no hop
    ],
)
def test_fanouts_parse(given, expected):
    assert parse_fanouts(given) == expected


@pytest.mark.parametrize("given", ["", "0,5", "-2", "a,b", [1.5], None, "5,,5"])
def test_bad_fanouts_are_refused_with_the_value(given):
    with pytest.raises(ValueError, match="fanout"):
        parse_fanouts(given)


def test_default_fanouts_follow_the_layer_count():
    assert default_fanouts(0) == ()
    assert default_fanouts(1) == (25,)
    assert default_fanouts(3) == (25, 10, 10)


def test_defaults_and_overrides():
    assert ServingSettings.from_yaml_section(None) == ServingSettings()
    settings = ServingSettings.from_yaml_section({"fanouts": [3, 3], "max_ids_per_request": 5})
    assert settings.fanouts == (3, 3) and settings.max_ids_per_request == 5


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"fanout": [1]}, "unknown key"),
        ({"max_ids_per_request": 0}, "max_ids_per_request"),
        ({"max_subgraph_nodes": True}, "max_subgraph_nodes"),
        ({"verify_checksum": "yes"}, "verify_checksum"),
        ({"task": "edge"}, "task"),
        ({"max_top_k": 0}, "max_top_k"),
        ({"explain_time_budget_ms": -5}, "explain_time_budget_ms"),
        ({"sampling_seed": "1"}, "sampling_seed"),
        ({"torch_threads": -1}, "torch_threads"),
        ({"torch_threads": 1.5}, "torch_threads"),
    ],
)
def test_bad_settings_fail_the_worker_start(section, message):
    with pytest.raises(ValueError, match=message):
        ServingSettings.from_yaml_section(section)


def test_archive_yaml_sets_every_torchserve_key_but_the_workers_explicitly(tmp_path):
    model_config = tmp_path / "model_config.json"
    model_config.write_text(json.dumps({"num_layers": 2}))
    out = tmp_path / "model-config.yaml"
    assert write_archive_config(["--out", str(out), "--model-config", str(model_config)]) == 0
    config = yaml.safe_load(out.read_text())
    for key in (
        "batchSize",
        "maxBatchDelay",
        "responseTimeout",
        "startupTimeout",
        "deviceType",
    ):
        assert key in config
    assert config["deviceType"] == "cpu"  # no CUDA on the test machines
    assert ServingSettings.from_yaml_section(config["gnn"]).fanouts == (25, 10)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--fanouts=5,5,5"], "one fanout per layer"),
        (["--min-workers", "3", "--max-workers", "2"], "minWorkers"),
        (["--batch-size", "0"], "batchSize"),
    ],
)
def test_archive_yaml_refuses_inconsistent_options(tmp_path, capsys, options, message):
    model_config = tmp_path / "model_config.json"
    model_config.write_text(json.dumps({"num_layers": 2}))
    args = ["--out", str(tmp_path / "y.yaml"), "--model-config", str(model_config), *options]
    assert write_archive_config(args) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "y.yaml").exists()


def test_torch_threads_default_one_and_written_by_the_archive_yaml(tmp_path):
    assert ServingSettings().torch_threads == 1
    model_config = tmp_path / "model_config.json"
    model_config.write_text(json.dumps({"num_layers": 2}))
    out = tmp_path / "model-config.yaml"
    args = ["--out", str(out), "--model-config", str(model_config), "--torch-threads", "0"]
    assert write_archive_config(args) == 0
    assert yaml.safe_load(out.read_text())["gnn"]["torch_threads"] == 0


@pytest.mark.parametrize("value", [-1, "1", True, None])
def test_metrics_interval_must_be_seconds_at_least_zero(value):
    with pytest.raises(ValueError, match="metrics_interval_s"):
        ServingSettings.from_yaml_section({"metrics_interval_s": value})


def test_metrics_interval_defaults_to_one_second_and_accepts_zero():
    assert ServingSettings().metrics_interval_s == 1.0
    assert ServingSettings.from_yaml_section({"metrics_interval_s": 0}).metrics_interval_s == 0


def test_a_worker_refuses_explanations_that_cannot_fit_its_response_timeout():
    config = {"responseTimeout": 10, "gnn": {"explain_time_budget_ms": 2500}}
    assert worker_settings(config, batch_size=3).explain_time_budget_ms == 2500
    with pytest.raises(ValueError, match=r"reaches responseTimeout \(10 s\)"):
        worker_settings(config, batch_size=4)
    # Without responseTimeout in the YAML, TorchServe's default applies, unknown to the worker.
    assert worker_settings({"gnn": config["gnn"]}, batch_size=4).explain_time_budget_ms == 2500
