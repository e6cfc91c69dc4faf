"""The update log: durable appends, replay, torn tails, concurrent writers."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from graph_assets.update_log import UpdateLog


def test_records_round_trip_in_order(tmp_path):
    log = UpdateLog.open(tmp_path / "updates.log")
    for seq in range(1, 4):
        log.append([{"type": "add_edge", "src": seq, "dst": 0}], seq)
    records, end = UpdateLog.open(tmp_path / "updates.log").read_from(0)
    assert [r.seq for r in records] == [1, 2, 3]
    assert records[2].operations == [{"type": "add_edge", "src": 3, "dst": 0}]
    assert end == (tmp_path / "updates.log").stat().st_size
    assert log.read_from(end) == ([], end)


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda data: data[:-5], "truncated payload"),
        (lambda data: data[:-1] + bytes([data[-1] ^ 0xFF]), "checksum mismatch"),
        (lambda data: data + b"GN", "truncated header"),
        (lambda data: data + b"XXXX" + bytes(8), "bad magic"),
    ],
)
def test_a_torn_tail_is_cut_off_and_reported(tmp_path, damage, reason, caplog):
    path = tmp_path / "updates.log"
    log = UpdateLog.open(path)
    log.append([{"type": "add_node", "id": 1}], 1)
    intact = path.stat().st_size
    log.append([{"type": "add_node", "id": 2}], 2)
    data = path.read_bytes()
    path.write_bytes(damage(data))
    # garbage after the second record keeps both; damage inside the second keeps only the first
    kept = 2 if reason in ("truncated header", "bad magic") else 1
    reopened = UpdateLog.open(path)
    assert reopened.torn_tail is not None and reopened.torn_tail.reason == reason
    assert reason in caplog.text
    records, _ = reopened.read_from(0)
    assert [r.seq for r in records] == list(range(1, kept + 1))
    if kept == 1:
        assert path.stat().st_size == intact
    reopened.append([{"type": "add_node", "id": 3}], kept + 1)  # appends after the cut
    assert [r.seq for r in UpdateLog.open(path).read_from(0)[0]] == list(range(1, kept + 2))


def _writer(path: str, worker: int, count: int) -> None:
    log = UpdateLog.open(Path(path))
    for i in range(count):
        with log.exclusive():
            records, _ = log.read_from(0, locked=True)
            log.append([{"worker": worker, "i": i}], len(records) + 1)


def test_concurrent_writers_never_interleave(tmp_path):
    path = tmp_path / "updates.log"
    UpdateLog.open(path)
    context = multiprocessing.get_context("fork")
    processes = [context.Process(target=_writer, args=(str(path), w, 25)) for w in range(4)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=60)
    records, _ = UpdateLog.open(path).read_from(0)
    assert [r.seq for r in records] == list(range(1, 101))
    assert UpdateLog.open(path).torn_tail is None
