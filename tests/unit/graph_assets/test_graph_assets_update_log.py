"""The update log: durable appends, replay, torn tails, damage, failed writes, locking."""

from __future__ import annotations

import errno
import fcntl
import json
import multiprocessing
import os
import resource
import threading
import zlib
from pathlib import Path

import pytest

from graph_assets.errors import UpdateLogCorrupt, UpdateLogWriteFailed
from graph_assets.live.operations import LOG_FORMAT
from graph_assets.live.update_log import MAGIC, UpdateLog, check_next


def append(log: UpdateLog, operations: list, seq: int) -> int:
    """One writer's step: catch up under the exclusive lock, then append at the end read."""
    with log.exclusive():
        _, end = log.read_from(0, locked=True)
        return log.append(operations, seq, at=end)


def seqs(path: Path) -> list[int]:
    return [record.seq for record in UpdateLog.open(path, writable=False).read_from(0)[0]]


def test_records_round_trip_in_order(tmp_path):
    log = UpdateLog.open(tmp_path / "updates.log")
    for seq in range(1, 4):
        append(log, [{"type": "add_edge", "src": seq, "dst": 0}], seq)
    records, end = UpdateLog.open(tmp_path / "updates.log").read_from(0)
    assert [r.seq for r in records] == [1, 2, 3]
    assert records[2].operations == [{"type": "add_edge", "src": 3, "dst": 0}]
    assert records[1].offset == records[0].end and records[2].end == end
    assert end == (tmp_path / "updates.log").stat().st_size
    assert log.read_from(end) == ([], end)


def test_a_new_log_and_its_directory_are_private(tmp_path):
    path = tmp_path / "state" / "abc" / "updates.log"
    UpdateLog.open(path).close()
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.parent.stat().st_mode & 0o777 == 0o700


def test_creating_a_log_fsyncs_its_directory(tmp_path, monkeypatch):
    synced: list[str] = []
    real_fsync = os.fsync

    def spy(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    UpdateLog.open(tmp_path / "updates.log").close()
    assert str(tmp_path) in synced  # the new entry is durable, not only later records
    synced.clear()
    UpdateLog.open(tmp_path / "updates.log").close()
    assert synced == []  # reopening creates nothing


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda data: data[:-5], "truncated payload"),
        (lambda data: data[:-1] + bytes([data[-1] ^ 0xFF]), "checksum mismatch"),
        (lambda data: data + b"GN", "truncated header"),
        (lambda data: data + b"XXXX" + bytes(8), "bad magic"),
    ],
)
def test_a_torn_tail_is_not_written_yet_and_the_next_append_replaces_it(
    tmp_path, damage, reason, caplog
):
    path = tmp_path / "updates.log"
    log = UpdateLog.open(path)
    append(log, [{"type": "add_node", "id": 1}], 1)
    append(log, [{"type": "add_node", "id": 2}], 2)
    path.write_bytes(damage(path.read_bytes()))
    damaged = path.stat().st_size
    # garbage after the second record keeps both; damage inside the second keeps only the first
    kept = 2 if reason in ("truncated header", "bad magic") else 1
    reopened = UpdateLog.open(path)
    records, end = reopened.read_from(0)
    assert [r.seq for r in records] == list(range(1, kept + 1))
    assert reopened.torn_tail is not None and reopened.torn_tail.reason == reason
    assert reopened.torn_tail.offset == end
    assert path.stat().st_size == damaged  # reading never truncates
    append(reopened, [{"type": "add_node", "id": 3}], kept + 1)  # replaces the torn tail
    assert "replaced an incomplete record" in caplog.text
    assert seqs(path) == list(range(1, kept + 2))


def test_an_unreadable_record_with_intact_records_after_it_is_refused(tmp_path):
    path = tmp_path / "updates.log"
    log = UpdateLog.open(path)
    for seq in range(1, 4):
        append(log, [{"type": "add_node", "id": seq}], seq)
    second = log.read_from(0)[0][1].offset
    data = bytearray(path.read_bytes())
    data[second + 20] ^= 0xFF  # inside the second record's payload
    path.write_bytes(bytes(data))
    message = f"update log {path}: the record at byte {second} is unreadable (checksum mismatch)"
    with pytest.raises(UpdateLogCorrupt, match="intact record follows") as refused:
        UpdateLog.open(path).read_from(0)
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)
    with pytest.raises(UpdateLogCorrupt):  # a writer refuses too: it never appends past damage
        append(UpdateLog.open(path), [{"type": "add_node", "id": 4}], 4)
    assert path.read_bytes() == bytes(data)  # nothing was cut off


def test_a_duplicate_or_missing_seq_stops_replay(tmp_path):
    path = tmp_path / "updates.log"
    log = UpdateLog.open(path)
    append(log, [{"type": "add_node", "id": 1}], 1)
    append(log, [{"type": "add_node", "id": 2}], 1)  # two writers that both read seq 0
    first, second = log.read_from(0)[0]
    check_next(first, 0, path)
    with pytest.raises(UpdateLogCorrupt, match=f"byte {second.offset} has seq 1 where seq 2"):
        check_next(second, 1, path)


def intact_record(payload: bytes) -> bytes:
    """A whole record (its checksum matches) holding ``payload``, whatever that is."""
    return (
        MAGIC
        + len(payload).to_bytes(4, "little")
        + zlib.crc32(payload).to_bytes(4, "little")
        + payload
    )


ADD_3 = [{"type": "add_node", "id": 3}]
MALFORMED = {
    "format null": {"seq": 3, "format": None, "operations": ADD_3},
    "format 0": {"seq": 3, "format": 0, "operations": ADD_3},
    "format -1": {"seq": 3, "format": -1, "operations": ADD_3},
    "format as text": {"seq": 3, "format": "2", "operations": ADD_3},
    "seq 2.9": {"seq": 2.9, "format": 2, "operations": ADD_3},
    "seq true": {"seq": True, "format": 2, "operations": ADD_3},
    "seq -3": {"seq": -3, "format": 2, "operations": ADD_3},
    "seq as text": {"seq": "3", "format": 2, "operations": ADD_3},
    "no seq": {"format": 2, "operations": ADD_3},
    "operations a string": {"seq": 3, "format": 2, "operations": "add_node"},
    "operations of numbers": {"seq": 3, "format": 2, "operations": [1, 2]},
    "an unknown field": {"seq": 3, "format": 2, "operations": ADD_3, "undo": True},
    "a list": [3, 2, ADD_3],
}


@pytest.mark.parametrize(
    "payload",
    [json.dumps(content).encode() for content in MALFORMED.values()] + [b"{not json", b"\xff"],
    ids=[*MALFORMED, "not JSON", "not UTF-8"],
)
def test_an_intact_last_record_that_is_not_well_formed_is_refused_and_kept(tmp_path, payload):
    """Its checksum matches, so it was written whole (maybe acknowledged): not a torn tail."""
    path = tmp_path / "updates.log"
    log = UpdateLog.open(path)
    append(log, [{"type": "add_node", "id": 1}], 1)
    second = append(log, [{"type": "add_node", "id": 2}], 2)
    with path.open("ab") as file:
        file.write(intact_record(payload))
    data = path.read_bytes()
    where = f"update log {path}: the record at byte {second} "
    with pytest.raises(UpdateLogCorrupt) as refused:
        UpdateLog.open(path).read_from(0)
    assert str(refused.value).startswith(where) and "\n" not in str(refused.value)
    reopened = UpdateLog.open(path)
    with pytest.raises(UpdateLogCorrupt, match="the record at byte"):
        append(reopened, [{"type": "add_node", "id": 4}], 3)  # a writer never writes over it
    assert reopened.torn_tail is None and path.read_bytes() == data


def test_a_newer_format_asks_for_an_upgrade_and_every_known_format_reads(tmp_path):
    path = tmp_path / "updates.log"
    contents = [{"seq": 1, "operations": []}]  # format 1: written before the field existed
    contents += [{"seq": 1 + f, "format": f, "operations": ADD_3} for f in range(1, LOG_FORMAT + 1)]
    path.write_bytes(b"".join(intact_record(json.dumps(c).encode()) for c in contents))
    assert seqs(path) == list(range(1, LOG_FORMAT + 2))
    newer = {"seq": LOG_FORMAT + 2, "format": LOG_FORMAT + 1, "operations": ADD_3}
    with path.open("ab") as file:
        file.write(intact_record(json.dumps(newer).encode()))
    with pytest.raises(UpdateLogCorrupt, match=f"format {LOG_FORMAT + 1}, newer than this"):
        seqs(path)


def _append_under_a_file_size_limit(path: str, limit: int, queue) -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    log = UpdateLog.open(Path(path))
    try:
        append(log, [{"type": "add_node", "id": "x" * 20_000}], 2)  # several pages
        queue.put("acknowledged")
    except UpdateLogWriteFailed as failed:
        queue.put((failed.errno, failed.rolled_back, str(failed)))


def test_a_short_write_is_rolled_back_and_never_acknowledged(tmp_path):
    path = tmp_path / "updates.log"
    log = UpdateLog.open(path)
    end = append(log, [{"type": "add_node", "id": 1}], 1)
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_append_under_a_file_size_limit, args=(str(path), 8192, queue))
    child.start()
    answer = queue.get(timeout=60)
    child.join(timeout=60)
    assert answer[0] == errno.EFBIG and answer[1] is True, answer
    assert "nothing was applied" in answer[2]
    assert path.stat().st_size == end  # the part that was written is gone again
    assert log.torn_tail is None and seqs(path) == [1]
    append(log, [{"type": "add_node", "id": 3}], 2)  # the next writer appends where it stopped
    assert seqs(path) == [1, 2]


def test_a_failed_fsync_leaves_no_record_behind(tmp_path, monkeypatch):
    path = tmp_path / "updates.log"
    log = UpdateLog.open(path)
    end = append(log, [{"type": "add_node", "id": 1}], 1)
    real_fsync, calls = os.fsync, []

    def fails_once(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 1:
            raise OSError(errno.EIO, "injected")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fails_once)
    with pytest.raises(UpdateLogWriteFailed) as failed:
        append(log, [{"type": "add_node", "id": 2}], 2)
    assert failed.value.errno == errno.EIO and failed.value.rolled_back
    assert path.stat().st_size == end and seqs(path) == [1]


def test_a_reader_thread_never_drops_a_writer_threads_exclusive_lock(tmp_path):
    """flock belongs to the open file description that every thread shares: another thread's
    shared lock and unlock on it used to turn the writer's lock into nothing."""
    path = tmp_path / "updates.log"
    log = UpdateLog.open(path)
    append(log, [{"type": "add_node", "id": 1}], 1)
    inside, leave = threading.Event(), threading.Event()

    def writer() -> None:
        with log.exclusive():
            inside.set()
            leave.wait(timeout=30)

    def reader() -> None:
        log.read_from(0)

    threads = [threading.Thread(target=writer), threading.Thread(target=reader)]
    threads[0].start()
    assert inside.wait(timeout=10)
    threads[1].start()
    threads[1].join(timeout=0.2)  # the reader waits for the writer (with the fix)
    other = os.open(path, os.O_RDWR)  # another worker's descriptor
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(other)
        leave.set()
        for thread in threads:
            thread.join(timeout=30)
    assert not threads[1].is_alive()


def test_a_read_only_log_is_never_changed(tmp_path):
    path = tmp_path / "updates.log"
    append(UpdateLog.open(path), [{"type": "add_node", "id": 1}], 1)
    with path.open("ab") as tail:
        tail.write(b"GNUP\x40\x00\x00\x00torn")
    before = path.read_bytes()
    log = UpdateLog.open(path, writable=False)
    assert [r.seq for r in log.read_from(0)[0]] == [1]
    with pytest.raises(PermissionError):
        append(log, [{"type": "add_node", "id": 2}], 2)
    assert path.read_bytes() == before
    with pytest.raises(FileNotFoundError):
        UpdateLog.open(tmp_path / "missing.log", writable=False)


def _writer(path: str, worker: int, count: int) -> None:
    log = UpdateLog.open(Path(path))
    for i in range(count):
        with log.exclusive():
            records, end = log.read_from(0, locked=True)
            log.append([{"worker": worker, "i": i}], len(records) + 1, at=end)


def test_concurrent_writers_never_interleave(tmp_path):
    path = tmp_path / "updates.log"
    UpdateLog.open(path)
    context = multiprocessing.get_context("fork")
    processes = [context.Process(target=_writer, args=(str(path), w, 25)) for w in range(4)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=60)
    log = UpdateLog.open(path)
    assert seqs(path) == list(range(1, 101))
    log.read_from(0)
    assert log.torn_tail is None


def test_replaying_a_long_log_does_not_block_writers(tmp_path, monkeypatch):
    """A worker starting on a long log parses it without the lock (it used to hold LOCK_EX for
    the whole parse: 1.6 s for 200k records, every update waiting)."""
    path = tmp_path / "updates.log"
    log = UpdateLog.open(path)
    for seq in range(1, 21):
        append(log, [{"type": "add_node", "id": seq}], seq)
    reader = UpdateLog.open(path)
    parsing, resume = threading.Event(), threading.Event()
    parse = reader._parse_at

    def slow_parse(offset: int, size: int):
        if offset > 0 and not parsing.is_set():
            parsing.set()
            resume.wait(timeout=30)
        return parse(offset, size)

    monkeypatch.setattr(reader, "_parse_at", slow_parse)
    replay = threading.Thread(target=reader.read_from, args=(0,))
    replay.start()
    try:
        assert parsing.wait(timeout=10)
        other = os.open(path, os.O_RDWR)  # another worker's writer, while the replay parses
        try:
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(other)
    finally:
        resume.set()
        replay.join(timeout=30)
