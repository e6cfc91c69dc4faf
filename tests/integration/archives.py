"""Archives for the integration tests: a small graph on disk and build_mar.sh run on it."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from typing import TypeVar

import numpy as np
import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[2]
# The models of conftest's tasks_store, as `torchserve --models` takes them.
TASK_MODELS = "gnn=gnn.mar,link=link.mar,graphs=graphs.mar"
T = TypeVar("T")
# The update key the shared server's workers inherit (conftest's shared_server).
SHARED_UPDATE_SECRET = "shared-server-update-secret-42"


def build_mar(*options: str) -> subprocess.CompletedProcess[str]:
    """``./build_mar.sh OPTIONS`` with this interpreter and a minimal PATH, output captured;
    the caller checks the return code (a refusal is a result too)."""
    return subprocess.run(
        [str(ROOT / "build_mar.sh"), *options],
        capture_output=True,
        text=True,
        env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
        timeout=600,
        check=False,
    )


def built(*options: str) -> None:
    """:func:`build_mar` that must succeed (its stderr in the failure)."""
    result = build_mar(*options)
    assert result.returncode == 0, result.stderr[-4000:]


def python_m(*argv: str) -> None:
    """``python -m ARGV`` with this interpreter from the repository root; raises on failure."""
    subprocess.run([sys.executable, "-m", *argv], check=True, cwd=ROOT, timeout=300)


def write_small_graph(directory: Path) -> Path:
    """120 accounts with string IDs, named labels and class signal in the features."""
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 3, 120)
    features = rng.normal(size=(120, 8)) + np.eye(3, 8)[labels] * 2
    nodes = pd.DataFrame(features, columns=[f"f{i}" for i in range(8)])
    nodes.insert(0, "id", [f"acct_{i}" for i in range(120)])
    nodes["label"] = np.array(["fraud", "legit", "review"])[labels]
    src = rng.integers(0, 110, 600)
    dst = rng.integers(0, 110, 600)
    edges = pd.DataFrame({"src": [f"acct_{i}" for i in src], "dst": [f"acct_{i}" for i in dst]})
    directory.mkdir(parents=True)
    nodes.to_csv(directory / "nodes.csv", index=False)
    edges.to_csv(directory / "edges.csv", index=False)
    return directory


def build_archive(export_path: Path, graph: Path, *options: str) -> Path:
    subprocess.run(
        [
            str(ROOT / "build_mar.sh"),
            "--graph",
            str(graph),
            "--export-path",
            str(export_path),
            *options,
        ],
        check=True,
        env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
        timeout=600,
    )
    return export_path


def build_next_version(model_store: Path, log: list[str], work: Path) -> str:
    """Compacts 1.0's graph and its log (``["--log", FILE]`` or ``["--log-url", URL]``), then
    builds gnn_v2.0.mar from it (same weights, updates on); returns the new graph's checksum."""
    with zipfile.ZipFile(model_store / "gnn.mar") as archive:
        archive.extractall(work / "v1")
    compacted = work / "v2_graph"
    compact = [sys.executable, "-m", "graph_assets.compact", "--store", str(work / "v1" / "graph")]
    subprocess.run([*compact, *log, "--out", str(compacted)], check=True, cwd=ROOT, timeout=300)
    config = yaml.safe_load((work / "v1" / "model-config.yaml").read_text())
    state = config["gnn"].get("update_state_dir")
    serving = "--fanouts -1,-1 --batch-size 1 --min-workers 1 --max-workers 1 --enable-updates"
    build = [str(ROOT / "build_mar.sh"), "--store", str(compacted), "--version", "2.0"]
    weights = ["--weights", str(work / "v1" / "model.pt"), "--arch", "gcn"]
    paths = ["--export-path", str(model_store), *(["--update-state-dir", state] if state else [])]
    subprocess.run(
        [*build, *weights, *serving.split(), *paths],
        check=True,
        env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
        timeout=600,
    )
    return str(json.loads((compacted / "meta.json").read_text())["checksum"])


def concurrently(*builds: Callable[[], T], workers: int = 2) -> list[T]:
    """Runs independent builds side by side (each ``build_mar.sh`` is one busy process, so two
    at a time use a 2-core machine's second core), returning their results in order; the first
    failure is raised once all have ended."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(build) for build in builds]
        wait(futures)
    return [future.result() for future in futures]
