"""A graph store outside the archive (``gnn.graph_location``): mapped in place and never written,
refused with one line when it is missing, is not a store, is another graph or was changed.

tests/integration/test_graph_location.py does the same with build_mar.sh and real TorchServes.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from ts.context import RequestProcessor

from graph_assets import StoreError, generate_synthetic
from handler.graph.graph_source import open_referenced_graph
from handler.live.live_graph import UPDATE_KEY_HEADER
from handler.settings import ServingSettings

from .conftest import started

CHECKSUM = "ab" * 32


@pytest.mark.parametrize(
    ("section", "words"),
    [
        ({"graph_location": "/srv/graph"}, "go together"),
        ({"graph_checksum": CHECKSUM}, "go together"),
        ({"graph_location": "srv/graph", "graph_checksum": CHECKSUM}, "absolute path"),
        ({"graph_location": "/srv/graph", "graph_checksum": "ABC"}, "64 lowercase hex"),
        ({"graph_location": 7, "graph_checksum": CHECKSUM}, "must be strings"),
    ],
)
def test_a_location_needs_its_checksum_and_an_absolute_path(section, words):
    with pytest.raises(ValueError, match=words):
        ServingSettings.from_yaml_section(section)


def test_the_location_round_trips_through_the_yaml_section():
    settings = ServingSettings(graph_location="/srv/graph", graph_checksum=CHECKSUM)
    assert ServingSettings.from_yaml_section(settings.to_yaml_section()) == settings


def snapshot(directory: Path) -> dict[str, tuple[int, int, int, int]]:
    """Every entry's inode, size, mode and mtime, the directory's own included."""
    entries = [directory, *sorted(directory.iterdir())]
    return {
        p.name: (p.stat().st_ino, p.stat().st_size, p.stat().st_mode, p.stat().st_mtime_ns)
        for p in entries
    }


@pytest.fixture()
def volume(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The archive's graph moved out to a read-only directory (the archive keeps no graph/)."""
    location = tmp_path_factory.mktemp("volume") / "graph"
    shutil.move(model_dir / "graph", location)
    yield location
    if location.exists():  # for pytest to remove it
        make_writable(location)


def make_read_only(directory: Path) -> None:
    for path in (*directory.iterdir(), directory):
        path.chmod(stat.S_IMODE(path.stat().st_mode) & ~0o222)


def make_writable(directory: Path) -> None:
    for path in (directory, *directory.iterdir()):
        path.chmod(stat.S_IMODE(path.stat().st_mode) | 0o200)


def referenced(location: Path, **gnn) -> dict:
    checksum = json.loads((location / "meta.json").read_text())["checksum"]
    return {"graph_location": str(location), "graph_checksum": checksum, **gnn}


def test_a_referenced_store_is_mapped_in_place_and_never_written(model_dir, volume):
    carried, _ = started(_archive_with(model_dir, volume), 1)
    make_read_only(volume)
    before = snapshot(volume)
    cache = model_dir.parent / "cache"
    handler, context = started(model_dir, 2, graph_cache_dir=str(cache), **referenced(volume))
    assert handler.engine.store.path == volume
    assert (volume / "features.0.npy").samefile(handler.engine.store.path / "features.0.npy")
    assert not cache.exists(), "no shared-cache copy of a store mapped in place"
    assert not (model_dir / "graph").exists()
    data = [{"body": {"node_ids": [0, 3, 6]}}, {"body": {"node_id": 9}}]
    answers = [json.loads(body) for body in handler.handle(data, context)]
    expected = [json.loads(body) for body in carried.handle(data, context)]
    assert answers == expected
    assert snapshot(volume) == before


def test_live_updates_on_a_referenced_store_are_logged_in_the_state_dir(
    model_dir, volume, monkeypatch
):
    secret = "update-secret-0123456789"
    monkeypatch.setenv("GNNSERVE_UPDATE_SECRET", secret)
    make_read_only(volume)
    before = snapshot(volume)
    state = model_dir.parent / f"{model_dir.name}-state"
    settings = referenced(volume, updates_enabled=True, update_state_dir=str(state))
    handler, context = started(model_dir, 2, **settings)
    context.request_processor = [
        RequestProcessor({UPDATE_KEY_HEADER: secret}),
        RequestProcessor({}),
    ]
    operations = [
        {"type": "add_node", "id": 900, "x": [0.1] * 6},
        {"type": "add_edge", "src": 900, "dst": 0},
    ]
    data = [{"body": {"op": "update", "operations": operations}}, {"body": {"node_id": 900}}]
    bodies = [json.loads(body) for body in handler.handle(data, context)]
    assert [context.get_response_status(i)[0] for i in range(2)] == [200, 200], bodies
    assert bodies[1]["graph_version"].endswith("+1")
    assert (state / settings["graph_checksum"] / "updates.log").is_file()
    assert snapshot(volume) == before


def _archive_with(model_dir: Path, graph: Path) -> Path:
    """A copy of the archive that carries ``graph`` inside, as archives did before."""
    copy = model_dir.parent / f"{model_dir.name}-carried"
    shutil.copytree(model_dir, copy)
    shutil.copytree(graph, copy / "graph")
    return copy


def flip_a_feature_byte(location: Path) -> None:
    """What bit rot or an edit in place does: same size, same meta.json, other bytes."""
    with (location / "features.0.npy").open("r+b") as f:
        f.seek(-3, os.SEEK_END)
        byte = f.read(1)
        f.seek(-3, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0x40]))


def another_graph(location: Path) -> None:
    shutil.rmtree(location)
    generate_synthetic(80, 300, location, feature_dim=6, num_classes=3, seed=5)


BREAKERS: dict[str, tuple[Callable[[Path], None], list[str]]] = {
    "missing": (shutil.rmtree, ["is missing", "mount the store this archive was built with"]),
    "not-a-store": (
        lambda p: [f.unlink() for f in p.iterdir()],
        ["is refused", "not a graph store"],
    ),
    "another-graph": (another_graph, ["has checksum", "in its meta.json"]),
    "changed-feature-byte": (
        flip_a_feature_byte,
        ["is refused", "features.0.npy has blake3", "corrupt or was changed"],
    ),
    "truncated-file": (
        lambda p: os.truncate(p / "labels.npy", 16),
        ["is refused", "labels.npy is 16 bytes"],
    ),
}


@pytest.mark.parametrize("case", sorted(BREAKERS))
def test_a_bad_referenced_store_refuses_the_worker_with_one_line(model_dir, volume, caplog, case):
    settings = referenced(volume)
    breaker, words = BREAKERS[case]
    breaker(volume)
    caplog.set_level(logging.INFO, logger="handler.gnn_handler")
    with pytest.raises(StoreError):
        started(model_dir, 1, **settings)
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(lines) == 1, lines
    (line,) = lines
    assert "\n" not in line and line.startswith("gnn worker refuses to start: graph store ")
    assert f"{volume} (graph_location)" in line
    for word in words:
        assert word in line, line
    if case in ("missing", "another-graph"):
        assert settings["graph_checksum"] in line  # what the archive expects, to find it


def test_without_hashing_sizes_checksum_and_structure_are_checked_not_the_bytes(volume):
    checksum = json.loads((volume / "meta.json").read_text())["checksum"]
    flip_a_feature_byte(volume)
    store = open_referenced_graph(volume, checksum, verify_checksum=False)
    assert store.checksum == checksum  # the trade-off docs/operations.md states
    with pytest.raises(StoreError, match=r"features\.0\.npy has blake3"):
        open_referenced_graph(volume, checksum, verify_checksum=True)
    os.truncate(volume / "labels.npy", 16)
    with pytest.raises(StoreError, match=r"labels\.npy is 16 bytes"):
        open_referenced_graph(volume, checksum, verify_checksum=False)
    with pytest.raises(StoreError, match=f"has checksum {checksum}"):
        open_referenced_graph(volume, "0" * 64, verify_checksum=False)


def test_the_checksum_is_compared_before_any_array_is_read(volume, monkeypatch):
    def no_arrays(*args, **kwargs):
        raise AssertionError("open_store ran on a store with another checksum")

    monkeypatch.setattr("handler.graph.graph_source.open_store", no_arrays)
    with pytest.raises(StoreError, match="has checksum"):
        open_referenced_graph(volume, "0" * 64, verify_checksum=True)
