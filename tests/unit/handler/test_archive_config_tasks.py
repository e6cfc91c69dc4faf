"""The archive YAML of link and graph archives: task, limits, explanation budget."""

from __future__ import annotations

import json

import yaml

from handler.archive_config import main as write_archive_config
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
    assert written(tmp_path / "b", "--task", "link", "--enable-updates")[0] == 2
    assert "node archives only" in capsys.readouterr().err
