"""What a failing update or a record that cannot be replayed does: its own answer, never the
batch's, never a wedged worker, never a skipped record."""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from ts.context import RequestProcessor

from graph_assets.errors import UpdateLogCorrupt
from graph_assets.live import update_log
from graph_assets.live.overlay import OverlayChange
from graph_assets.live.update_log import UpdateLog
from handler.live.live_graph import LiveGraph, UpdatePolicy, read_secret
from tests.unit.graph_assets.test_graph_assets_update_log import intact_record

from .conftest import answer_update, started

SECRET = "update-secret-0123456789"
POLICY = UpdatePolicy(secret=SECRET, max_operations=100)


def new_node(node_id: int, width: int, value: float = 0.5) -> dict:
    return {"type": "add_node", "id": node_id, "x": [value] * width}


def update_body(*operations: dict) -> dict:
    return {"op": "update", "operations": list(operations)}


def raw_append(path: Path, operations: list, seq: int) -> None:
    """A record as another writer would leave it, whatever it holds."""
    log = UpdateLog.open(path)
    with log.exclusive():
        _, end = log.read_from(0, locked=True)
        log.append(operations, seq, at=end)
    log.close()


@pytest.fixture()
def log_path(tmp_path) -> Path:
    return tmp_path / "updates.log"


def test_a_full_disk_answers_507_and_applies_and_logs_nothing(int_store, log_path, monkeypatch):
    live, other = LiveGraph(int_store, log_path), LiveGraph(int_store, log_path)
    width = int_store.feature_dim
    assert answer_update(update_body(new_node(900, width)), SECRET, live, POLICY)[0] == 200
    size = log_path.stat().st_size
    real_pwrite = os.pwrite

    def full(fd: int, data, offset: int) -> int:  # half the record fits, then the disk is full
        if len(data) > 40:
            return real_pwrite(fd, bytes(data[: len(data) // 2]), offset)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(update_log.os, "pwrite", full)
    status, body = answer_update(update_body(new_node(901, width)), SECRET, live, POLICY)
    assert status == 507 and body["type"] == "InsufficientStorage"
    assert "nothing was applied" in body["message"]
    assert live.overlay.seq == 1 and int(live.overlay.lookup([901])[0]) == -1
    assert log_path.stat().st_size == size
    other.sync()  # another worker reads on: no torn record, no error
    assert other.overlay.seq == 1 and other.failure is None
    monkeypatch.undo()
    assert answer_update(update_body(new_node(902, width)), SECRET, live, POLICY)[0] == 200
    other.sync()
    assert other.version == live.version and int(other.overlay.lookup([902])[0]) >= 0


@pytest.mark.parametrize("value", [10**400, 2**200, 1e39, -1e39])
def test_feature_values_outside_float32_are_400(int_store, log_path, value):
    live = LiveGraph(int_store, log_path)
    operation = new_node(900, int_store.feature_dim)
    operation["x"][0] = value
    status, body = answer_update(update_body(operation), SECRET, live, POLICY)
    assert status == 400 and body["type"] == "BadRequest"
    assert "float32" in body["message"] or "finite" in body["message"]
    assert live.overlay.seq == 0 and log_path.stat().st_size == 0


def test_an_unexpected_error_is_that_updates_500_only(int_store, log_path, monkeypatch):
    live = LiveGraph(int_store, log_path)

    def broken(*args, **kwargs):
        raise OverflowError("injected")

    monkeypatch.setattr(live.overlay, "apply", broken)
    status, body = answer_update(update_body(new_node(900, 6)), SECRET, live, POLICY)
    assert status == 500 and body["type"] == "InternalError"
    assert log_path.stat().st_size == 0


def raising_once(seen: list) -> Callable[[OverlayChange], None]:
    """An overlay listener that fails on the first change it gets, then takes each in."""

    def listener(change: OverlayChange) -> None:
        seen.append(change)
        if len(seen) == 1:
            raise RuntimeError("injected listener failure")

    return listener


def test_a_listener_failing_after_the_commit_is_answered_applied_and_never_wedges(
    int_store, log_path, caplog
):
    """The record is in the log and applied when a listener fails: 200 with its seq and
    rows_rebuilding (not "nothing was applied", which a client would send again, doubling an
    edge); a worker whose replay of it meets the same failure moves seq and offset on together,
    so its own next update is neither refused as a duplicate nor answered 503."""
    live, replica = LiveGraph(int_store, log_path), LiveGraph(int_store, log_path)
    seen: list = []
    replica_seen: list = []
    live.overlay.listeners.append(raising_once(seen))
    replica.overlay.listeners.append(raising_once(replica_seen))
    src, dst = int_store.external_ids(np.array([3, 6]))
    before = int((live.overlay.in_list(6) == 3).sum())
    add = update_body({"type": "add_edge", "src": src, "dst": dst})
    with caplog.at_level(logging.ERROR, logger="handler.live.live_graph"):
        status, body = answer_update(add, SECRET, live, POLICY)
    assert (status, body["status"], body["seq"]) == (200, "applied", 1)
    assert body["rows_rebuilding"] is True and body["graph_version"].endswith("+1")
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert "update seq 1 is applied" in line and "injected listener failure" in line
    records, end = UpdateLog.open(log_path, writable=False).read_from(0)
    assert [r.seq for r in records] == [1] and end == log_path.stat().st_size
    assert int((live.overlay.in_list(6) == 3).sum()) == before + 1 and live.failure is None

    replica.sync()  # its listener fails on the same record
    assert replica.seq == 1 and replica.failure is None and replica.lag == 0
    status, body = answer_update(add, SECRET, replica, POLICY)
    assert (status, body["seq"], body["rows_rebuilding"]) == (200, 2, False)
    assert len(replica_seen) == 2 and int((replica.overlay.in_list(6) == 3).sum()) == before + 2

    added = update_body(new_node(900, int_store.feature_dim))
    status, body = answer_update(added, SECRET, live, POLICY)
    assert (status, body["seq"], body["rows_rebuilding"]) == (200, 3, False)
    assert [len(change.in_lists_before) for change in seen] == [1, 1, 0]
    replica.sync()
    assert replica.version == live.version and int(replica.overlay.lookup([900])[0]) >= 0
    records, _ = UpdateLog.open(log_path, writable=False).read_from(0)
    assert [r.seq for r in records] == [1, 2, 3]


def test_a_record_that_cannot_be_applied_keeps_serving_and_refuses_updates(
    int_store, log_path, caplog
):
    live = LiveGraph(int_store, log_path)
    width = int_store.feature_dim
    assert answer_update(update_body(new_node(900, width)), SECRET, live, POLICY)[0] == 200
    raw_append(log_path, [{"type": "add_edge", "src": 123456, "dst": 0}], 2)  # no such node
    raw_append(log_path, [new_node(901, width)], 3)
    with caplog.at_level(logging.ERROR, logger="handler.live.live_graph"):
        live.sync()
    assert live.version.endswith("+1") and live.failure is not None
    assert live.failure.seq == 2 and "123456" in live.failure.reason
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert "cannot apply the record seq 2" in line and "serving graph version" in line
    caplog.clear()
    live.sync()  # the next batch: no new error line, still the last version applied
    assert live.version.endswith("+1") and not caplog.records
    status, body = answer_update(update_body(new_node(902, width)), SECRET, live, POLICY)
    assert status == 503 and "seq 2" in body["message"]
    assert live.describe()["replay_failure"]["seq"] == 2
    # seq 3 is never applied before seq 2: the record is not skipped
    assert int(live.overlay.lookup([901])[0]) == -1


def test_the_handler_reports_a_replay_failure_and_keeps_answering(model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("GNNSERVE_UPDATE_SECRET", SECRET)
    handler, context = started(
        model_dir,
        2,
        updates_enabled=True,
        update_state_dir=str(tmp_path / "state"),
        metrics_interval_s=0,
    )
    path = handler.live.log.path
    # fails on replay: an edge that the graph does not have
    raw_append(path, [{"type": "remove_edge", "src": 0, "dst": 424242}], 1)
    context.request_processor = [
        RequestProcessor({"x-gnnserve-update-key": SECRET}),
        RequestProcessor({}),
    ]
    data = [
        {"body": update_body({"type": "add_edge", "src": 3, "dst": 6})},
        {"body": {"node_id": 3}},
    ]
    bodies = [json.loads(item) for item in handler.handle(data, context)]
    assert [context.get_response_status(i)[0] for i in range(2)] == [503, 200]
    assert bodies[1]["graph_version"].endswith("+0")
    assert dict(context.metrics.recorded)["GnnUpdateReplayFailed"] == 1
    described = json.loads(handler.describe_handle())
    assert described["updates"]["replay_failure"]["seq"] == 1


def test_a_duplicate_seq_refuses_the_start_naming_the_file_and_offset(int_store, log_path):
    raw_append(log_path, [new_node(900, int_store.feature_dim)], 1)
    raw_append(log_path, [new_node(901, int_store.feature_dim)], 1)  # two writers, one seq
    with pytest.raises(
        UpdateLogCorrupt, match=f"update log {log_path}: the record at byte \\d+ has seq 1"
    ):
        LiveGraph(int_store, log_path)


def test_a_duplicate_seq_after_the_start_stops_replay_without_skipping(int_store, log_path):
    live = LiveGraph(int_store, log_path)
    raw_append(log_path, [new_node(900, int_store.feature_dim)], 1)
    raw_append(log_path, [new_node(901, int_store.feature_dim)], 1)
    raw_append(log_path, [new_node(902, int_store.feature_dim)], 2)
    live.follow_once()
    assert live.version.endswith("+1") and live.failure is not None
    assert "where seq 2 was expected" in live.failure.reason
    assert int(live.overlay.lookup([901])[0]) == -1 and int(live.overlay.lookup([902])[0]) == -1


def test_damage_inside_the_log_refuses_the_start(int_store, log_path):
    for seq in (1, 2, 3):
        raw_append(log_path, [new_node(900 + seq, int_store.feature_dim)], seq)
    data = bytearray(log_path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    log_path.write_bytes(bytes(data))
    with pytest.raises(UpdateLogCorrupt, match=f"update log {log_path}: the record at byte \\d+"):
        LiveGraph(int_store, log_path)


def test_an_intact_record_of_no_known_format_is_kept_and_refused(int_store, log_path):
    """A last record whose checksum matches but whose format is null: a running worker refuses
    updates (503) rather than write over it, a starting one refuses to start in one line."""
    live = LiveGraph(int_store, log_path)
    width = int_store.feature_dim
    assert answer_update(update_body(new_node(900, width)), SECRET, live, POLICY)[0] == 200
    payload = json.dumps({"seq": 2, "format": None, "operations": [new_node(901, width)]})
    with log_path.open("ab") as file:
        file.write(intact_record(payload.encode()))
    data = log_path.read_bytes()
    status, body = answer_update(update_body(new_node(902, width)), SECRET, live, POLICY)
    assert status == 503 and body["type"] == "Unavailable" and "a record" in body["message"]
    assert live.failure is not None and "format None" in live.failure.reason
    assert log_path.read_bytes() == data and live.version.endswith("+1")
    with pytest.raises(UpdateLogCorrupt, match="has format None") as refused:
        LiveGraph(int_store, log_path)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    ("mode", "accepted"),
    [(0o600, True), (0o640, True), (0o400, True), (0o644, False), (0o620, False), (0o602, False)],
)
def test_the_secret_file_must_be_private(tmp_path, mode, accepted):
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    secret.chmod(mode)
    if accepted:
        assert read_secret("UNUSED", str(secret)) == SECRET
    else:
        with pytest.raises(ValueError, match=f"{secret} has mode {stat.filemode(0o100000 | mode)}"):
            read_secret("UNUSED", str(secret))
