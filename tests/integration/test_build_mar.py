"""build_mar.sh as a user runs it: options, errors, archive contents."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
import yaml

from .archives import ROOT

pytestmark = pytest.mark.integration
SCRIPT = ROOT / "build_mar.sh"
DESIGN_OPTIONS = [
    "--graph",
    "--task",
    "--arch",
    "--fanouts",
    "--undirected",
    "--weights",
    "--name",
    "--version",
    "--export-path",
    "--synthetic",
    "--feature-dim",
    "--num-classes",
    "--batch-size",
    "--max-batch-delay",
    "--min-workers",
    "--max-workers",
    "--response-timeout",
    "--startup-timeout",
    "--device",
]


def run(*options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), *options],
        capture_output=True,
        text=True,
        env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
        timeout=600,
        check=False,
    )


def test_help_documents_every_option():
    result = run("--help")
    assert result.returncode == 0
    for option in DESIGN_OPTIONS:
        assert option in result.stdout, option


@pytest.mark.parametrize(
    ("options", "words"),
    [
        (["--task", "nonsense"], "--task must be node, link or graph"),
        (["--task", "link", "--synthetic-graphs", "10"], "goes with --task graph"),
        (["--task", "graph", "--synthetic", "10", "20"], "give --graph DIR or --synthetic-graphs"),
        (["--task", "graph", "--precompute"], "--precompute goes with --task node or link"),
        (["--task", "link", "--enable-updates"], "a link archive needs --precompute"),
    ],
)
def test_task_options_that_do_not_fit_are_refused_with_a_reason(tmp_path, options, words):
    result = run(*options, "--export-path", str(tmp_path))
    assert result.returncode == 2
    assert words in result.stderr
    assert not list(tmp_path.iterdir())


def test_bad_graph_fails_naming_file_row_and_problem(tmp_path):
    graph = tmp_path / "graph"
    graph.mkdir()
    (graph / "nodes.csv").write_text("id,f0,label\n1,0.5,a\n2,nan,b\n")
    (graph / "edges.csv").write_text("src,dst\n1,2\n")
    result = run("--graph", str(graph), "--export-path", str(tmp_path / "store"))
    assert result.returncode != 0
    assert "nodes.csv row 2" in result.stderr and "NaN" in result.stderr
    assert not list((tmp_path / "store").glob("*.mar"))


def test_a_graph_in_redis_without_its_store_is_refused_before_any_work(tmp_path):
    """Without --store (or --graph/--synthetic) the demo graph would be trained on, then
    refused by the checksum at the end."""
    result = run("--graph-location", "redis://127.0.0.1:1/fraud", "--export-path", str(tmp_path))
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        "build_mar.sh: error: --graph-location redis://127.0.0.1:1/fraud needs the graph loaded "
        "there: give --store DIR, the store you loaded with python -m graph_assets load-redis "
        "(or --graph DIR / --synthetic NODES EDGES to build it again)\n"
    )
    assert not list(tmp_path.iterdir())


def test_unknown_option_is_refused(tmp_path):
    result = run("--fanout", "5,5", "--export-path", str(tmp_path))
    assert result.returncode == 2 and "unknown option '--fanout'" in result.stderr


def archive_yaml(mar: Path) -> dict:
    return yaml.safe_load(zipfile.ZipFile(mar).read("model-config.yaml"))


@pytest.mark.parametrize("form", [["--fanouts", "-1,-1"], ["--fanouts=-1,-1"]])
def test_synthetic_archive_with_both_fanout_spellings(tmp_path, form):
    result = run(
        "--synthetic",
        "300",
        "1500",
        "--feature-dim",
        "16",
        "--num-classes",
        "3",
        "--arch",
        "gin",
        "--epochs",
        "2",
        "--version",
        "2.0",
        "--name",
        "syn",
        "--batch-size",
        "4",
        "--max-batch-delay",
        "20",
        "--min-workers",
        "2",
        "--max-workers",
        "3",
        "--response-timeout",
        "30",
        "--startup-timeout",
        "90",
        "--device",
        "cpu",
        "--export-path",
        str(tmp_path),
        *form,
    )
    assert result.returncode == 0, result.stderr
    assert "test accuracy" in result.stdout
    mar = tmp_path / "syn_v2.0.mar"
    config = archive_yaml(mar)
    assert config["gnn"]["fanouts"] == [-1, -1]
    expected = {
        "batchSize": 4,
        "maxBatchDelay": 20,
        "minWorkers": 2,
        "maxWorkers": 3,
        "responseTimeout": 30,
        "startupTimeout": 90,
        "deviceType": "cpu",
    }
    assert {key: config[key] for key in expected} == expected
    archive = zipfile.ZipFile(mar)
    names = set(archive.namelist())
    assert {
        "model.pt",
        "model_config.json",
        "metrics.json",
        "build_info.json",
        "gnn_handler.py",
        "graph/meta.json",
        "graph/features.0.npy",
        "handler/tasks/node/engine.py",
        "model/architectures.py",
        "graph_assets/stored/store.py",
    } <= names
    manifest = json.loads(archive.read("MAR-INF/MANIFEST.json"))
    assert manifest["model"]["modelVersion"] == "2.0"
    info = json.loads(archive.read("build_info.json"))
    meta = json.loads(archive.read("graph/meta.json"))
    assert info["version"] == "2.0" and info["graph"]["checksum"] == meta["checksum"]
    assert info["model"]["arch"] == "gin" and "test_accuracy" in info["metrics"]
    assert meta["num_nodes"] == 300 and meta["node_types"][0]["feature_dim"] == 16


def test_given_weights_are_packaged_not_retrained(tmp_path):
    first = run(
        "--synthetic",
        "200",
        "1000",
        "--feature-dim",
        "8",
        "--num-classes",
        "3",
        "--arch",
        "gcn",
        "--hidden-dim",
        "16",
        "--epochs",
        "3",
        "--export-path",
        str(tmp_path),
    )
    assert first.returncode == 0, first.stderr
    archive = zipfile.ZipFile(tmp_path / "gnn.mar")
    weights_dir = tmp_path / "weights"
    weights_dir.mkdir()
    (weights_dir / "trained.pt").write_bytes(archive.read("model.pt"))
    (weights_dir / "model_config.json").write_bytes(archive.read("model_config.json"))
    second = run(
        "--synthetic",
        "200",
        "1000",
        "--feature-dim",
        "8",
        "--num-classes",
        "3",
        "--weights",
        str(weights_dir / "trained.pt"),
        "--name",
        "packaged",
        "--export-path",
        str(tmp_path),
    )
    assert second.returncode == 0, second.stderr
    assert "accuracy on the labelled nodes" in second.stdout
    packaged = zipfile.ZipFile(tmp_path / "packaged.mar")
    (tmp_path / "shipped.pt").write_bytes(packaged.read("model.pt"))
    original = torch.load(weights_dir / "trained.pt", weights_only=True)
    shipped = torch.load(tmp_path / "shipped.pt", weights_only=True)
    assert original.keys() == shipped.keys()
    assert all(torch.equal(original[k], shipped[k]) for k in original)
    assert "labelled_accuracy" in json.loads(packaged.read("metrics.json"))


def test_weights_that_do_not_fit_are_refused(tmp_path):
    weights = tmp_path / "wrong.pt"
    torch.save({"gnn.convs.0.lin.weight": torch.zeros(3, 3)}, weights)
    result = run(
        "--synthetic",
        "100",
        "400",
        "--feature-dim",
        "8",
        "--num-classes",
        "3",
        "--weights",
        str(weights),
        "--export-path",
        str(tmp_path / "out"),
    )
    assert result.returncode != 0
    assert "do not match" in result.stderr
    assert not list((tmp_path / "out").glob("*.mar"))


def served_modules(entry: str) -> set[str]:
    """Every module of ours that ``entry`` can import, directly or through others (imports
    inside functions included): what a worker may need from the archive."""
    import ast

    ours = ("graph_assets", "model", "handler")
    found: set[str] = set()
    pending = [entry]
    while pending:
        name = pending.pop()
        if name in found:
            continue
        path = ROOT / name.replace(".", "/")
        file = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        if not file.exists():
            continue  # a name imported from a module, not a module
        found.add(name)
        package = name if file.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.Import):
                pending += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    base = f"{parent}.{base}" if base else parent
                pending += [base, *(f"{base}.{alias.name}" for alias in node.names)]
        pending = [n for n in pending if n.split(".")[0] in ours]
        for parent in range(1, name.count(".") + 1):  # importing a.b.c runs a and a.b too
            pending.append(name.rsplit(".", parent)[0])
    return found


def test_the_archive_holds_every_module_the_handler_can_import(model_store):
    with zipfile.ZipFile(model_store / "gnn.mar") as archive:
        packed = {name for name in archive.namelist() if name.endswith(".py")}
    needed = {
        str((ROOT / m.replace(".", "/")).relative_to(ROOT))
        + ("/__init__.py" if (ROOT / m.replace(".", "/")).is_dir() else ".py")
        for m in served_modules("handler.gnn_handler")
    }
    assert len(needed) > 20 and "handler/gnn_handler.py" in needed
    assert needed <= packed, f"missing from the archive: {sorted(needed - packed)}"
    source = {
        str(path.relative_to(ROOT))
        for package in ("graph_assets", "model", "handler")
        for path in (ROOT / package).rglob("*.py")
        if "__pycache__" not in path.parts
    }
    assert source <= packed  # subpackages too, not only each package's top-level files
    assert not any(name.startswith("archive_build/") for name in packed)  # build time only
