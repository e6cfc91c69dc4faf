"""A corrupt or mismatched archive: the worker refuses to start with ONE log line that names the
file and the problem, and a corrupt graph never reaches the shared graph cache.

tests/integration/test_faults.py registers such an archive with a real TorchServe too.
"""

from __future__ import annotations

import json
import logging
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from graph_assets.stored.store import combined_checksum, file_digests
from handler.gnn_handler import GNNHandler
from model import build_model
from model.config import ModelConfig

from .conftest import MockContext


def model_config(store, **changes) -> dict:
    config = {
        "task": "node",
        "arch": "gcn",
        "in_dim": store.feature_dim,
        "out_dim": store.num_classes,
        "hidden_dim": 16,
        "num_layers": 2,
    }
    return {**config, **changes}


def save_weights(directory: Path, config: dict) -> None:
    torch.manual_seed(0)
    model = build_model(ModelConfig.from_dict(config))
    torch.save(model.state_dict(), directory / "model.pt")


@pytest.fixture()
def archive(tmp_path: Path, int_store) -> Path:
    """A good unpacked archive (graph/, model.pt, model_config.json) that each test breaks."""
    directory = tmp_path / "archive"
    shutil.copytree(int_store.path, directory / "graph")
    config = model_config(int_store)
    save_weights(directory, config)
    (directory / "model_config.json").write_text(json.dumps(config))
    return directory


def start(archive: Path, cache: Path, share_graph: bool) -> GNNHandler:
    gnn = {"fanouts": [-1, -1], "share_graph": share_graph, "graph_cache_dir": str(cache)}
    handler = GNNHandler()
    handler.initialize(MockContext(archive, {"gnn": gnn}, 1))
    return handler


def rewrite_array(graph: Path, name: str, array: np.ndarray) -> None:
    """Replaces one array and updates meta.json to match it, checksums included, so that only
    the format's own dtype/shape rules can catch it."""
    np.save(graph / name, array)
    meta = json.loads((graph / "meta.json").read_text())
    meta["files"][name].update(
        dtype=array.dtype.str,
        shape=list(array.shape),
        bytes=(graph / name).stat().st_size,
        **file_digests(graph / name),
    )
    meta["checksum"] = combined_checksum({n: e["sha256"] for n, e in meta["files"].items()})
    (graph / "meta.json").write_text(json.dumps(meta))


def truncate(path: Path, keep: int = -8) -> None:
    path.write_bytes(path.read_bytes()[:keep])


def flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


class Pickled:
    """Not a tensor: weights_only=True must refuse to unpickle it."""


def breakers(store) -> dict[str, tuple[Callable[[Path], None], str, str]]:
    """name -> (how to break the archive, the file the log line names, the problem it states)."""
    wider = model_config(store, in_dim=store.feature_dim + 2)
    gat = model_config(store, arch="gat")

    def write_config(config: dict) -> Callable[[Path], None]:
        return lambda a: (a / "model_config.json").write_text(json.dumps(config))

    def wider_model(a: Path) -> None:
        write_config(wider)(a)
        save_weights(a, wider)

    return {
        "truncated-array": (
            lambda a: truncate(a / "graph" / "indices.npy"),
            "indices.npy",
            "the file was truncated",
        ),
        "wrong-dtype": (
            lambda a: rewrite_array(a / "graph", "labels.npy", np.zeros(80, dtype=np.int32)),
            "labels.npy",
            "format version 3 needs <i8 [80]",
        ),
        "checksum-mismatch": (
            lambda a: flip_last_byte(a / "graph" / "features.0.npy"),
            "features.0.npy",
            "the file is corrupt or was changed",
        ),
        "missing-graph-file": (
            lambda a: (a / "graph" / "labels.npy").unlink(),
            "labels.npy",
            "is missing",
        ),
        "garbled-meta": (
            lambda a: (a / "graph" / "meta.json").write_text("{not json"),
            "meta.json",
            "cannot read it as JSON",
        ),
        "missing-weights": (lambda a: (a / "model.pt").unlink(), "model.pt", "not found"),
        "missing-model-config": (
            lambda a: (a / "model_config.json").unlink(),
            "model_config.json",
            "not found",
        ),
        "truncated-weights": (
            lambda a: truncate(a / "model.pt", keep=200),
            "model.pt",
            "cannot read it as a torch.save file",
        ),
        "pickled-object-in-weights": (
            lambda a: (a / "model.pt").write_bytes(pickle.dumps({"w": Pickled()})),
            "model.pt",
            "holds objects other than tensors",
        ),
        "feature-width-mismatch": (
            wider_model,
            "model_config.json in_dim",
            f"the model expects {store.feature_dim + 2} features",
        ),
        "weights-of-another-architecture": (
            write_config(gat),
            "model.pt",
            "do not match the GAT that the model config describes",
        ),
    }


GRAPH_CASES = [
    "truncated-array",
    "wrong-dtype",
    "checksum-mismatch",
    "missing-graph-file",
    "garbled-meta",
]
CASES = [
    *GRAPH_CASES,
    "missing-weights",
    "missing-model-config",
    "truncated-weights",
    "pickled-object-in-weights",
    "feature-width-mismatch",
    "weights-of-another-architecture",
]


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize("share_graph", [True, False], ids=["shared-cache", "private"])
@pytest.mark.parametrize("case", CASES)
def test_a_bad_archive_refuses_to_start_with_one_clear_line(
    archive, int_store, tmp_path, caplog, case, share_graph
):
    breaker, file, problem = breakers(int_store)[case]
    breaker(archive)
    cache = tmp_path / "cache"
    caplog.set_level(logging.INFO, logger="handler.gnn_handler")
    with pytest.raises(Exception) as info:
        start(archive, cache, share_graph)
    refusals = [
        r.getMessage()
        for r in caplog.records
        if r.name == "handler.gnn_handler" and r.levelno >= logging.ERROR
    ]
    assert len(refusals) == 1, refusals
    (line,) = refusals
    assert "\n" not in line
    assert line.startswith("gnn worker refuses to start: ")
    assert file in line and problem in line, line
    assert str(info.value) in line
    if case in GRAPH_CASES:  # nothing corrupt was published for the next archive to map
        assert not cache.exists() or not any(
            p.name.startswith(int_store.checksum) for p in cache.iterdir()
        )


def test_a_corrupt_archive_does_not_poison_the_cache_for_a_good_one(archive, tmp_path):
    good = tmp_path / "good"
    shutil.copytree(archive, good)
    flip_last_byte(archive / "graph" / "features.0.npy")
    cache = tmp_path / "cache"
    with pytest.raises(Exception, match=r"features\.0\.npy has blake3"):
        start(archive, cache, share_graph=True)
    handler = start(good, cache, share_graph=True)
    assert handler.engine is not None
    assert handler.engine.store.path.parent == cache
