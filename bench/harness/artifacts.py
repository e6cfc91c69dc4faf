"""Graphs, weights and archives for the benchmarks, built once and cached under the work dir.

Graphs are synthetic (``python -m graph_assets synthetic``, seed 0, 128 features, 8 classes),
so the store that the FastAPI baselines load and the one ``build_mar.sh --synthetic`` packs are
the same graph (the suite checks their checksums). The model is GraphSAGE with random weights:
what is measured is the serving path, not accuracy.

``build_mar.sh`` runs once per graph; the variants (batching, fanouts, workers, threads) are
that archive unpacked into a folder of hard links with its own model-config YAML, which
TorchServe loads like a ``.mar`` without unpacking it again. Archives are cached per digest of
the code they pack, so a change to the handler rebuilds them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml

from model import build_model
from model.config import ModelConfig
from tests.servers.torchserve import BIN, ROOT

ECHO_HANDLER = ROOT / "bench" / "systems" / "echo_handler.py"
FEATURES, CLASSES = 128, 8


@dataclass(frozen=True)
class GraphSpec:
    """A synthetic graph: ``edges`` drawn over ``nodes`` (average in-degree edges/nodes)."""

    name: str
    nodes: int
    edges: int

    @property
    def feature_bytes(self) -> int:
        return self.nodes * FEATURES * 4


GRAPHS = {
    spec.name: spec
    for spec in (
        GraphSpec("100K", 10_000, 100_000),
        GraphSpec("1M", 100_000, 1_000_000),
        GraphSpec("10M", 1_000_000, 10_000_000),
        # The memory benchmark's graph: 2.2M x 128 float32 = 1.13 GB of features.
        GraphSpec("mem", 2_200_000, 10_000_000),
    )
}


@dataclass(frozen=True)
class ArchiveSpec:
    """One GNN archive: its graph, fanouts and TorchServe batching."""

    graph: str
    fanouts: tuple[int, ...] = (10, 10)
    batch_size: int = 16
    max_batch_delay_ms: int = 5
    torch_threads: int = 1
    workers: int = 1
    updates: bool = False

    @property
    def name(self) -> str:
        fanouts = "x".join(str(f) for f in self.fanouts)
        name = f"gnn_{self.graph}_f{fanouts}_b{self.batch_size}_d{self.max_batch_delay_ms}"
        if self.torch_threads != 1:
            name += f"_t{self.torch_threads}"
        if self.updates:
            name += "_live"
        return name if self.workers == 1 else f"{name}_w{self.workers}"


def _run(command: list[str], log: Path) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"  $ {' '.join(command)}", flush=True)
    with log.open("ab") as out:
        subprocess.run(command, cwd=ROOT, check=True, stdout=out, stderr=out, timeout=1800)


def code_digest() -> str:
    """Digest of the code an archive packs: archives built from other code are not reused."""
    digest = hashlib.sha256()
    files = [
        file
        for package in ("graph_assets", "model", "handler", "archive_build")
        for file in sorted((ROOT / package).rglob("*.py"))
    ]
    for file in [*files, ECHO_HANDLER, ROOT / "build_mar.sh"]:
        digest.update(str(file.relative_to(ROOT)).encode() + file.read_bytes())
    return digest.hexdigest()[:12]


class Artifacts:
    """Builds what the suite needs under ``work`` on first use."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.archives = work / "archives" / code_digest()
        self.logs = work / "logs"
        # Archives of other code are never used again, and each set holds a few GB.
        for stale in self.archives.parent.glob("*"):
            if stale.is_dir() and stale != self.archives:
                shutil.rmtree(stale)

    def store(self, graph: str) -> Path:
        """The graph store of ``graph`` (generated once)."""
        spec = GRAPHS[graph]
        path = self.work / "graphs" / graph
        if not (path / "meta.json").is_file():
            _run(
                [
                    *(str(BIN / "python"), "-m", "graph_assets", "synthetic"),
                    *(str(spec.nodes), str(spec.edges), "--out", str(path)),
                ],
                self.logs / "build.log",
            )
        return path

    def checksum(self, graph: str) -> str:
        return str(json.loads((self.store(graph) / "meta.json").read_text())["checksum"])

    def model_dir(self) -> Path:
        """Random GraphSAGE weights (seed 0) for 128 features and 8 classes."""
        path = self.work / "model"
        if not (path / "model.pt").is_file():
            path.mkdir(parents=True, exist_ok=True)
            config = ModelConfig(in_dim=FEATURES, out_dim=CLASSES)
            torch.manual_seed(0)
            torch.save(build_model(config).state_dict(), path / "model.pt")
            (path / "model_config.json").write_text(json.dumps(config.to_dict()))
        return path

    def base_archive(self, graph: str) -> Path:
        """``build_mar.sh --synthetic`` for ``graph`` with the random weights, unpacked."""
        spec = GRAPHS[graph]
        return self.built(
            f"base_{graph}",
            [
                *("--synthetic", str(spec.nodes), str(spec.edges)),
                *("--weights", str(self.model_dir() / "model.pt"), "--device", "cpu"),
            ],
        )

    def built(self, name: str, build_args: list[str]) -> Path:
        """The folder archive ``name``: ``build_mar.sh`` with ``build_args``, unpacked (built
        once per code digest)."""
        folder = self.archives / name
        if not (folder / "MAR-INF" / "MANIFEST.json").is_file():
            command = [str(ROOT / "build_mar.sh"), *build_args, "--name", name]
            _run([*command, "--export-path", str(self.archives)], self.logs / "build.log")
            mar = self.archives / f"{name}.mar"
            staging = self.archives / f".{name}.tmp"
            shutil.rmtree(staging, ignore_errors=True)
            with zipfile.ZipFile(mar) as archive:
                archive.extractall(staging)
            mar.unlink()
            shutil.rmtree(folder, ignore_errors=True)
            staging.rename(folder)
        return folder

    def gnn_archive(self, spec: ArchiveSpec) -> Path:
        """The folder archive ``spec.name``: the graph's base archive with its own YAML."""

        def configure(config: dict[str, Any]) -> None:
            config.update(
                batchSize=spec.batch_size,
                maxBatchDelay=spec.max_batch_delay_ms,
                minWorkers=spec.workers,
                maxWorkers=spec.workers,
            )
            config["gnn"].update(fanouts=list(spec.fanouts), torch_threads=spec.torch_threads)
            if spec.updates:
                config["gnn"]["updates_enabled"] = True

        return self.variant(self.base_archive(spec.graph), spec.name, configure)

    def variant(self, base: Path, name: str, configure: Callable[[dict[str, Any]], None]) -> Path:
        """The folder archive ``name``: the unpacked archive ``base`` in hard links, with its
        model-config YAML changed by ``configure`` (built once)."""
        folder = self.archives / name
        if not folder.is_dir():
            staging = self.archives / f".{name}.tmp"
            shutil.rmtree(staging, ignore_errors=True)
            shutil.copytree(base, staging, copy_function=os.link)
            config_file = staging / "model-config.yaml"
            config = yaml.safe_load(config_file.read_text())
            configure(config)
            config_file.unlink()  # a hard link to the base's file: replace, never write through
            config_file.write_text(yaml.safe_dump(config, sort_keys=False))
            staging.rename(folder)
        return folder

    def echo_archive(self, batch_size: int, max_batch_delay_ms: int, workers: int = 1) -> Path:
        """The echo archive with the given batching and workers."""
        name = f"echo_b{batch_size}_d{max_batch_delay_ms}" + (f"_w{workers}" if workers > 1 else "")
        mar = self.archives / f"{name}.mar"
        if not mar.is_file():
            self.archives.mkdir(parents=True, exist_ok=True)
            config = self.archives / f"{name}.yaml"
            config.write_text(
                yaml.safe_dump(
                    {
                        "batchSize": batch_size,
                        "maxBatchDelay": max_batch_delay_ms,
                        "minWorkers": workers,
                        "maxWorkers": workers,
                        "responseTimeout": 60,
                        "deviceType": "cpu",
                    }
                )
            )
            _run(
                [
                    *(str(BIN / "torch-model-archiver"), "--model-name", name, "--version", "1.0"),
                    *("--handler", str(ECHO_HANDLER)),
                    *("--config-file", str(config), "--export-path", str(self.archives), "--force"),
                ],
                self.logs / "build.log",
            )
        return mar
