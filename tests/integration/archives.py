"""Archives for the integration tests: a small graph on disk and build_mar.sh run on it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[2]


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
