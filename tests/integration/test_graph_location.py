"""Archives built with ``build_mar.sh --graph-location``: the graph stays out of the ``.mar``, two
TorchServes map one read-only store in place and answer alike (and as the full-graph forward),
and a store that is missing or was tampered with is refused at start with one line."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
import torch
import yaml

from graph_assets import open_store
from model import build_model
from tests.servers.torchserve import Serve, TorchServe, graph_checksum, model_worker_pids

from .archives import ROOT, build_archive, write_small_graph

pytestmark = pytest.mark.integration
OPTIONS = ["--arch", "gcn", "--epochs", "3", "--fanouts", "-1,-1", "--max-ids", "16"]


def build_mar(*options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ROOT / "build_mar.sh"), *options, "--device", "cpu"],
        capture_output=True,
        text=True,
        env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
        timeout=600,
        check=False,
    )


def snapshot(directory: Path) -> dict[str, tuple[int, int, int, int]]:
    """Every entry's inode, size, mode and mtime, the directory's own included."""
    return {
        path.name: (
            path.stat().st_ino,
            path.stat().st_size,
            path.stat().st_mode,
            path.stat().st_mtime_ns,
        )
        for path in (directory, *sorted(directory.iterdir()))
    }


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """``gnn.mar``, whose store build_mar.sh wrote to ``location`` (then made read-only), and
    ``tampered.mar``, built against ``copy``, an existing store given alone."""
    root = tmp_path_factory.mktemp("graph_location")
    location = root / "volume" / "graph"
    model_store = root / "model_store"
    graph = write_small_graph(root / "input")
    build_archive(model_store, graph, "--graph-location", str(location), *OPTIONS)
    copy = root / "volume" / "copy"
    shutil.copytree(location, copy)
    referenced = build_mar(
        "--graph-location",
        str(copy),
        "--name",
        "tampered",
        "--export-path",
        str(model_store),
        *OPTIONS,
    )
    assert referenced.returncode == 0, referenced.stderr
    subprocess.run(["chmod", "-R", "a-w", str(location)], check=True)
    yield {"model_store": model_store, "location": location, "copy": copy}
    subprocess.run(["chmod", "-R", "u+w", str(root / "volume")], check=True)


@pytest.fixture(scope="module")
def servers(serve: Serve, built: dict[str, Path]) -> Iterator[tuple[TorchServe, TorchServe]]:
    """Two TorchServes, each with its own ports, temp dir and logs, on the one store (servers
    of their own: two servers mapping one store is what is tested)."""
    with (
        serve(built["model_store"], "gnn=gnn.mar", name="first") as first,
        serve(built["model_store"], "gnn=gnn.mar", name="second") as second,
    ):
        yield first, second


def test_the_archive_carries_the_stores_location_and_checksum_not_its_bytes(built):
    archive = zipfile.ZipFile(built["model_store"] / "gnn.mar")
    assert not [name for name in archive.namelist() if name.startswith("graph/")]
    gnn = yaml.safe_load(archive.read("model-config.yaml"))["gnn"]
    meta = json.loads((built["location"] / "meta.json").read_text())
    assert gnn["graph_location"] == str(built["location"])
    assert gnn["graph_checksum"] == meta["checksum"] and gnn["verify_checksum"] is True
    assert json.loads(archive.read("build_info.json"))["graph"]["checksum"] == meta["checksum"]


@pytest.mark.parametrize(
    ("options", "words"),
    [
        (["--graph-location", "{empty}"], "holds no graph store (no meta.json)"),
        (["--graph-location", "{full}", "--synthetic", "10", "20"], "is not empty"),
        (["--graph-location", "{full}", "--store", "{full}"], "give --graph-location {full} alone"),
        (["--graph-location", "{full}", "--task", "graph"], "goes with --task node or link"),
    ],
)
def test_a_location_that_cannot_be_served_is_refused_at_build(tmp_path, options, words):
    (tmp_path / "empty").mkdir()
    full = tmp_path / "full"
    full.mkdir()
    (full / "meta.json").write_text("{}")
    paths = {"empty": tmp_path / "empty", "full": full}
    result = build_mar(*(o.format(**paths) for o in options), "--export-path", str(tmp_path / "ms"))
    assert result.returncode == 2 and words.format(**paths) in result.stderr, result.stderr
    assert not (tmp_path / "ms").exists() and sorted(full.iterdir()) == [full / "meta.json"]


def test_two_servers_serve_one_read_only_store_in_place(servers, built):
    location = built["location"]
    before = snapshot(location)
    store = open_store(location)
    for server in servers:
        assert graph_checksum(server, "gnn") == store.checksum
        assert not list((server.home / "tmp").rglob("*.npy")), "no copy of the graph per start"
        for pid in model_worker_pids(server, "gnn"):
            maps = Path(f"/proc/{pid}/maps").read_text()
            assert str(location / "features.0.npy") in maps, "mapped where it is"
    ids = store.external_ids(np.arange(store.num_nodes))
    answers = [served_probabilities(server, ids) for server in servers]
    assert answers[0] == answers[1]
    assert float((torch.tensor(answers[0]) - full_graph_forward(built, store)).abs().max()) <= 1e-5
    assert snapshot(location) == before, "nothing was written into the store"


def served_probabilities(server: TorchServe, ids: list) -> list[list[float]]:
    probabilities = []
    for start in range(0, len(ids), 16):
        response = requests.post(
            f"{server.inference_url}/predictions/gnn",
            json={"node_ids": ids[start : start + 16]},
            headers=server.auth("inference"),
            timeout=60,
        )
        assert response.status_code == 200, response.text
        probabilities += [p["probabilities"] for p in response.json()["predictions"]]
    return probabilities


def full_graph_forward(built: dict[str, Path], store) -> torch.Tensor:
    archive = zipfile.ZipFile(built["model_store"] / "gnn.mar")
    model = build_model(json.loads(archive.read("model_config.json")))
    model.load_state_dict(torch.load(io.BytesIO(archive.read("model.pt")), weights_only=True))
    model.eval()
    with torch.no_grad():
        x = torch.from_numpy(np.array(store.features))
        return torch.softmax(model(x, torch.from_numpy(store.edge_index())), dim=-1)


def flip_a_feature_byte(store: Path) -> None:
    """An edit in place: features.0.npy keeps its size, meta.json is untouched."""
    features = store / "features.0.npy"
    data = bytearray(features.read_bytes())
    data[-3] ^= 0x40
    features.write_bytes(bytes(data))


def test_a_tampered_or_missing_store_is_refused_at_start(servers, built):
    server, copy = servers[0], built["copy"]
    checksum = json.loads((copy / "meta.json").read_text())["checksum"]
    meta = (copy / "meta.json").read_bytes()
    flip_a_feature_byte(copy)
    assert (copy / "meta.json").read_bytes() == meta
    assert_refused(server, "tampered", f"is refused: {copy}/features.0.npy has blake3")
    shutil.rmtree(copy)
    missing = f"is missing: mount the store this archive was built with (checksum {checksum})"
    assert_refused(server, "missing", missing)
    assert graph_checksum(server, "gnn") == json.loads(meta)["checksum"], "gnn serves on"


def assert_refused(server: TorchServe, name: str, problem: str) -> None:
    """Registering tampered.mar as ``name`` fails, each worker's one line stating ``problem``."""
    response = requests.post(
        f"{server.management_url}/models",
        params={"url": "tampered.mar", "model_name": name, "synchronous": "true"},
        headers=server.auth("management"),
        timeout=120,
    )
    assert response.status_code == 500, response.text
    assert "Failed to start workers" in response.json()["message"]
    log = (server.home / "logs" / "model_log.log").read_text(errors="replace")
    lines = [
        line.split("MODEL_LOG - ")[-1]
        for line in log.splitlines()
        if f"-{name}_1.0-" in line and "gnn worker refuses to start: " in line
    ]
    assert lines and all(problem in line for line in lines), lines
    print(f"\n[graph_location] {name}: {lines[0]}")
    listed = requests.get(
        f"{server.management_url}/models", headers=server.auth("management"), timeout=10
    )
    if name in listed.text:  # TorchServe 0.12 may leave it registered with no worker
        assert not model_worker_pids(server, name)
        requests.delete(
            f"{server.management_url}/models/{name}",
            headers=server.auth("management"),
            timeout=60,
        ).raise_for_status()
