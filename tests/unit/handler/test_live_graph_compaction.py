"""Two archive versions after compaction: the old one serves base + log, the new one the
compacted store, and both follow the one log of their lineage, so neither loses an update."""

from __future__ import annotations

import json
import logging
import random
import shutil
from pathlib import Path

import numpy as np
import pytest

from graph_assets import open_store
from graph_assets.compact import compact, replay
from graph_assets.errors import UpdateLogMismatch
from graph_assets.live.log_lineage import update_log_path
from handler.live.live_graph import LiveGraph, UpdateRequest
from tests.live_reference import live_ids, random_update

from .conftest import FEATURES, live_engine, random_model, refused_update, started

SECRET = "update-secret-0123456789"


def graph_as_ids(live: LiveGraph) -> dict:
    """The graph a LiveGraph serves, in external IDs only (internal numbering differs between
    versions): each node's in-neighbours and feature row."""
    overlay = live.overlay
    ids = live_ids(live)
    nodes = overlay.lookup(ids)
    rows = overlay.feature_rows(nodes)
    return {
        node_id: (
            sorted(map(str, overlay.external_ids(overlay.in_list(int(node))))),
            rows[position].tolist(),
        )
        for position, (node_id, node) in enumerate(zip(ids, nodes.tolist(), strict=True))
    }


def compact_state(store, state, out):
    """Compacts ``store`` with its log under ``state``; the new store, opened."""
    compact(replay(store.path, update_log_path(store, state)), out)
    return open_store(out)


@pytest.fixture()
def versions(int_store, tmp_path):
    """Version 1.0 after 40 random updates, and version 2.0 compacted from it."""
    state = tmp_path / "state"
    old = LiveGraph(int_store, update_log_path(int_store, state))
    rng, counter = random.Random(5), [0]
    for _ in range(40):
        old.update(UpdateRequest(random_update(rng, old, counter)))
    new_store = compact_state(int_store, state, tmp_path / "v2")
    new = LiveGraph(new_store, update_log_path(new_store, state))
    yield old, new, rng, counter
    old.close()
    new.close()


def test_the_new_version_starts_where_compaction_stopped(versions, int_store):
    old, new, _, _ = versions
    assert new.log is not None and old.log is not None and new.log.path == old.log.path
    assert new.overlay.seq == 40 and new.overlay.is_empty  # the fast path on the base alone
    assert new.version == f"{new.store.checksum[:12]}+40" != old.version
    assert graph_as_ids(new) == graph_as_ids(old)


def test_updates_through_the_old_version_are_seen_by_the_new_one(versions):
    old, new, rng, counter = versions
    for _ in range(20):
        old.update(UpdateRequest(random_update(rng, old, counter)))
    new.sync()
    assert new.overlay.seq == old.overlay.seq == 60 and not new.overlay.is_empty
    assert new.version.endswith("+60")
    assert graph_as_ids(new) == graph_as_ids(old)


def test_updates_through_the_new_version_are_seen_by_the_old_one(versions):
    old, new, rng, counter = versions
    x = [0.25] * FEATURES
    applied = new.update(
        UpdateRequest(
            [
                {"type": "add_node", "id": 888_888, "x": x},
                {"type": "add_edge", "src": 888_888, "dst": live_ids(new)[0]},
            ]
        )
    )
    assert applied.seq == 41
    assert old.update(UpdateRequest(random_update(rng, old, counter))).seq == 42
    new.sync()
    assert old.overlay.seq == new.overlay.seq == 42
    assert graph_as_ids(new) == graph_as_ids(old)
    assert graph_as_ids(old)[888_888][1] == x


def test_both_versions_answer_alike_on_full_neighbourhoods(int_store, tmp_path):
    model = random_model(int_store, "gcn")
    state = tmp_path / "state"
    old, old_live = live_engine(int_store, update_log_path(int_store, state), model)
    rng, counter = random.Random(9), [0]
    for _ in range(30):
        old_live.update(UpdateRequest(random_update(rng, old_live, counter)))
    new_store = compact_state(int_store, state, tmp_path / "v2")
    new, new_live = live_engine(new_store, update_log_path(new_store, state), model)

    def answers(engine, ids):
        request = [{"body": {"node_ids": ids[i : i + 32]}} for i in range(0, len(ids), 32)]
        return [p["probabilities"] for a in engine.handle(request) for p in a.body["predictions"]]

    ids = live_ids(old_live)
    assert np.allclose(answers(old, ids), answers(new, ids), atol=1e-5)
    assert new_live.overlay.is_empty  # answered from the compacted base alone
    for _ in range(10):
        old_live.update(UpdateRequest(random_update(rng, old_live, counter)))
    ids = live_ids(old_live)
    assert np.allclose(answers(old, ids), answers(new, ids), atol=1e-5)
    assert not new_live.overlay.is_empty and new_live.version.endswith("+40")


@pytest.mark.parametrize("fixture", ["int_store", "str_store"])
def test_a_removed_id_stays_refused_after_compaction(fixture, request, tmp_path):
    store = request.getfixturevalue(fixture)
    state = tmp_path / "state"
    base_id = store.external_ids(np.array([3]))[0]
    added_id = "acct_added" if fixture == "str_store" else 555_555
    old = LiveGraph(store, update_log_path(store, state))
    old.update(UpdateRequest([{"type": "add_node", "id": added_id, "x": [0.0] * FEATURES}]))
    old.update(UpdateRequest([{"type": "remove_node", "id": added_id}]))
    old.update(UpdateRequest([{"type": "remove_node", "id": base_id}]))
    new_store = compact_state(store, state, tmp_path / "v2")
    new = LiveGraph(new_store, update_log_path(new_store, state))
    for live in (old, new):
        for node_id in (base_id, added_id):
            again = {"type": "add_node", "id": node_id, "x": [0.0] * FEATURES}
            refused = refused_update(live, [again])
            assert refused.status == 409
            assert refused.message == (
                f"operation 0: node {node_id!r} was removed (IDs are not reused)"
            )
    assert old.overlay.seq == new.overlay.seq == 3


def test_compacting_a_compacted_store_keeps_the_original_log(versions, tmp_path):
    old, new, rng, counter = versions
    for _ in range(5):
        new.update(UpdateRequest(random_update(rng, new, counter)))
    third_store = compact_state(new.store, tmp_path / "state", tmp_path / "v3")
    assert third_store.update_log is not None
    assert third_store.update_log["base"] == old.store.checksum
    assert third_store.update_log["seq"] == 45
    third = LiveGraph(third_store, update_log_path(third_store, tmp_path / "state"))
    assert third.log is not None and old.log is not None and third.log.path == old.log.path
    assert third.overlay.is_empty
    old.update(UpdateRequest(random_update(rng, old, counter)))
    third.sync()
    new.sync()
    assert third.overlay.seq == new.overlay.seq == old.overlay.seq == 46
    assert graph_as_ids(third) == graph_as_ids(new) == graph_as_ids(old)


def test_a_compacted_store_refuses_a_log_that_lost_records(versions, tmp_path):
    old, new, _, _ = versions
    assert new.store.update_log is not None and old.log is not None
    path = old.log.path
    kept = path.read_bytes()[: new.store.update_log["offset"] // 2]
    moved = tmp_path / "short" / "updates.log"
    moved.parent.mkdir()
    moved.write_bytes(kept)
    with pytest.raises(UpdateLogMismatch, match=f"update log {moved}"):
        LiveGraph(new.store, moved)


def next_version(archive: Path, store_dir: Path, out: Path) -> Path:
    """Version 2.0's unpacked archive: the same model, the compacted graph."""
    out.mkdir()
    for name in ("model.pt", "model_config.json"):
        shutil.copy(archive / name, out / name)
    shutil.copytree(store_dir, out / "graph")
    return out


def test_the_handler_of_a_compacted_archive_follows_the_lineage_log(
    model_dir,
    tmp_path,
    monkeypatch,
):
    monkeypatch.setenv("GNNSERVE_UPDATE_SECRET", SECRET)
    settings = {"fanouts": [-1, -1], "updates_enabled": True, "update_state_dir": str(tmp_path)}
    first, _ = started(model_dir, 1, **settings)
    assert first.live is not None
    first.live.update(UpdateRequest([{"type": "remove_node", "id": 3}]))
    store = first.live.store
    new_store = compact_state(store, tmp_path, tmp_path / "v2")
    second, context = started(
        next_version(model_dir, new_store.path, tmp_path / "mar2"), 1, **settings
    )
    assert second.live is not None and second.live.version == f"{new_store.checksum[:12]}+1"
    first.live.update(UpdateRequest([{"type": "add_edge", "src": 237, "dst": 0}]))  # isolated
    (body,) = second.handle([{"body": {"node_id": 0}}], context)
    assert json.loads(body)["graph_version"] == f"{new_store.checksum[:12]}+2"
    first.live.close()
    second.live.close()


def test_a_compacted_archive_whose_log_lost_records_refuses_to_start(
    model_dir,
    int_store,
    tmp_path,
    monkeypatch,
    caplog,
):
    monkeypatch.setenv("GNNSERVE_UPDATE_SECRET", SECRET)
    old = LiveGraph(int_store, update_log_path(int_store, tmp_path / "state"))
    old.update(UpdateRequest([{"type": "remove_node", "id": 3}]))
    old.close()
    new_store = compact_state(int_store, tmp_path / "state", tmp_path / "v2")
    log = update_log_path(new_store, tmp_path / "state")
    log.write_bytes(b"")  # the log was replaced by an empty one: update 1 is not in it
    archive = next_version(model_dir, new_store.path, tmp_path / "mar2")
    caplog.set_level(logging.INFO, logger="handler.gnn_handler")
    with pytest.raises(UpdateLogMismatch):
        started(archive, 1, updates_enabled=True, update_state_dir=str(tmp_path / "state"))
    (line,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert line.startswith(f"gnn worker refuses to start: update log {log} is 0 bytes, but")
