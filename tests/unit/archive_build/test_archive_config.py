"""The archive YAML: workers, the task of link and graph archives, limits, explanation budget."""

from __future__ import annotations

import json

import pytest
import yaml

from archive_build import archive_config
from archive_build.archive_config import main as write_archive_config
from graph_assets import generate_synthetic
from handler.settings import ServingSettings


def written(tmp_path, *options: str) -> tuple[int, dict | None]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    model_config = tmp_path / "model_config.json"
    model_config.write_text(json.dumps({"num_layers": 2}))
    out = tmp_path / "model-config.yaml"
    code = write_archive_config(["--out", str(out), "--model-config", str(model_config), *options])
    return code, yaml.safe_load(out.read_text()) if out.exists() else None


def test_task_settings_reach_the_gnn_section(tmp_path):
    options = ["--task", "link", "--max-top-k", "50", "--explain-steps", "8"]
    code, config = written(tmp_path, *options, "--explain-budget-ms", "500")
    assert code == 0 and config is not None
    settings = ServingSettings.from_yaml_section(config["gnn"])
    assert (settings.task, settings.max_top_k, settings.explain_steps) == ("link", 50, 8)
    assert settings.explain_time_budget_ms == 500


def test_graph_archives_take_no_fanouts_and_no_updates(tmp_path, capsys):
    assert written(tmp_path, "--task", "graph", "--max-graph-nodes", "30")[0] == 0
    assert written(tmp_path / "a", "--task", "graph", "--fanouts", "5,5")[0] == 2
    assert "a graph archive samples none" in capsys.readouterr().err
    assert written(tmp_path / "b", "--task", "graph", "--enable-updates")[0] == 2
    assert "applies to node and link archives" in capsys.readouterr().err
    assert written(tmp_path / "c", "--task", "link", "--enable-updates")[0] == 0


def test_workers_are_left_to_torchserve_unless_the_builder_names_them(tmp_path):
    code, config = written(tmp_path)
    assert code == 0 and config is not None
    assert "minWorkers" not in config and "maxWorkers" not in config
    code, config = written(tmp_path / "named", "--min-workers", "2", "--max-workers", "3")
    assert code == 0 and config is not None
    assert (config["minWorkers"], config["maxWorkers"]) == (2, 3)


@pytest.mark.parametrize("option", ["--min-workers", "--max-workers"])
def test_one_worker_option_alone_is_refused(tmp_path, capsys, option):
    assert written(tmp_path, option, "2") == (2, None)
    assert "give --min-workers and --max-workers together" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("timeout", "code"),
    [("16", 2), ("17", 0)],  # 8 requests x 2000 ms = 16 s: not below 16 s
)
def test_a_batch_of_explanations_must_fit_in_the_response_timeout(tmp_path, capsys, timeout, code):
    options = ["--batch-size", "8", "--explain-budget-ms", "2000", "--response-timeout", timeout]
    assert written(tmp_path, *options)[0] == code
    if code:
        error = capsys.readouterr().err
        assert "16000 ms, which reaches responseTimeout (16 s)" in error
        assert "--explain-budget-ms) below 2000" in error and "above 16 s" in error


def test_a_graph_location_is_written_with_the_stores_checksum(tmp_path, monkeypatch, capsys):
    store = tmp_path / "volume" / "graph"
    meta = generate_synthetic(20, 40, store, feature_dim=4, num_classes=2)
    monkeypatch.chdir(tmp_path / "volume")
    code, config = written(tmp_path / "a", "--graph-location", "graph", "--no-verify-checksum")
    assert code == 0 and config is not None
    assert config["gnn"]["graph_location"] == str(store)  # absolute: workers start elsewhere
    assert config["gnn"]["graph_checksum"] == meta["checksum"]
    assert config["gnn"]["verify_checksum"] is False
    code, config = written(tmp_path / "b")
    assert code == 0 and config is not None
    assert (config["gnn"]["graph_location"], config["gnn"]["verify_checksum"]) == ("", True)
    assert written(tmp_path / "c", "--graph-location", str(tmp_path / "c"))[0] == 2
    assert "is not a graph store" in capsys.readouterr().err
    assert written(tmp_path / "d", "--task", "graph", "--graph-location", str(store))[0] == 2
    assert "a graph archive serves no stored graph" in capsys.readouterr().err


def test_the_read_your_writes_wait_reaches_the_gnn_section(tmp_path):
    code, config = written(tmp_path, "--enable-updates", "--min-version-wait", "250")
    assert code == 0 and config is not None
    assert ServingSettings.from_yaml_section(config["gnn"]).min_version_wait_ms == 250


def test_gpu_archives_batch_more_and_take_the_gpu_settings(tmp_path, capsys):
    code, config = written(tmp_path / "cpu", "--device", "cpu")
    assert code == 0 and config is not None
    assert (config["batchSize"], config["maxBatchDelay"], config["deviceType"]) == (8, 5, "cpu")
    options = ["--device", "gpu", "--gpu-feature-fraction", "0.25", "--no-cuda-graphs"]
    code, config = written(tmp_path / "gpu", *options)
    assert code == 0 and config is not None
    assert (config["batchSize"], config["maxBatchDelay"], config["deviceType"]) == (16, 2, "gpu")
    settings = ServingSettings.from_yaml_section(config["gnn"])
    assert (settings.sampling_device, settings.gpu_feature_fraction) == ("cpu", 0.25)
    assert settings.cuda_graphs is False
    code, config = written(tmp_path / "named", "--device", "gpu", "--batch-size", "4")
    assert code == 0 and config is not None and config["batchSize"] == 4
    assert written(tmp_path / "bad", "--gpu-feature-fraction", "2")[0] == 2
    assert "gpu_feature_fraction must be a share" in capsys.readouterr().err


def test_gpu_archives_ask_for_workers_per_gpu_of_the_build_machine(tmp_path, monkeypatch):
    monkeypatch.setattr(archive_config, "local_gpu_count", lambda: 2)
    code, config = written(tmp_path / "two", "--device", "gpu")
    assert code == 0 and config is not None
    expected = 2 * archive_config.WORKERS_PER_GPU
    assert (config["minWorkers"], config["maxWorkers"]) == (expected, expected)
    code, config = written(
        tmp_path / "named", "--device", "gpu", *("--min-workers", "1"), *("--max-workers", "1")
    )
    assert config is not None and (config["minWorkers"], config["maxWorkers"]) == (1, 1)
    monkeypatch.setattr(archive_config, "local_gpu_count", lambda: 0)
    code, config = written(tmp_path / "none", "--device", "gpu")
    assert config is not None and "minWorkers" not in config
