"""Crash consistency of the update log: several worker processes, each with its follower on,
append concurrently while some are SIGKILLed at random points (some inside a record larger than
a page) and the log's file system fills up (``RLIMIT_FSIZE``). Afterwards every acknowledged
update is in the log exactly once, in seq order, and every reader holds exactly that graph."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import resource
import signal
import time
from collections.abc import Callable
from pathlib import Path

from graph_assets.errors import UpdateLogWriteFailed
from graph_assets.live import update_log
from graph_assets.live.update_log import UpdateLog, check_next
from handler.live.live_graph import LiveGraph, UpdateRequest
from handler.protocol.error_table import api_error
from handler.protocol.errors import InsufficientStorage

LOG_LIMIT = 400_000  # bytes the log may grow to: the "disk" fills part-way through the run
BIG = 120  # operations in a large request: a record of several pages
SLOTS = 4  # writer processes running at once
RANDOM_KILLS_AT = (10, 25, 40, 55, 70, 90)  # acknowledged updates before each random kill
STALLED_KILLS_AT = (20, 50, 80)  # ... before each writer killed inside a large record
FULL_DISK_REFUSALS = 20  # 507s to collect once the log is full, before stopping
FULL_DISK_KILL_AT = 5  # one more random kill after this many 507s
SEED = 1234


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def operations(tag: int, width: int, big: bool) -> list[dict]:
    """A request whose nodes only this request adds (IDs derived from its unique tag)."""
    count = BIG if big else 1
    return [
        {"type": "add_node", "id": 10_000_000 + tag * 1000 + j, "x": [0.25] * width}
        for j in range(count)
    ]


def tag_of(record_operations: list[dict]) -> int:
    return (int(record_operations[0]["id"]) - 10_000_000) // 1000


def writer(store, log_path: str, work: str, name: int, stall: bool) -> None:
    """One worker process: its own LiveGraph with the follower on, appending until told to stop,
    then waiting for its follower to reach the final seq and reporting what it holds."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (LOG_LIMIT, LOG_LIMIT))
    folder = Path(work)
    acks = os.open(folder / "acks", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    live = LiveGraph(store, Path(log_path), follow_interval_s=0.001)
    width = store.feature_dim
    if stall:
        stall_inside_the_next_record(folder)
    rng = random.Random(name)
    i = 0
    while not (folder / "stop").exists():
        tag = name * 10_000 + i
        request = UpdateRequest(operations(tag, width, big=stall or rng.random() < 0.35))
        try:
            seq = live.update(request).seq
            os.write(acks, f"{tag} {seq}\n".encode())
        except UpdateLogWriteFailed as failed:
            if not isinstance(api_error(failed), InsufficientStorage):  # 507: the log is full
                raise
            os.write(acks, f"{tag} refused\n".encode())
        i += 1
    os.write(acks, f"{name} stopped\n".encode())
    wait_until(lambda: (folder / "final").exists(), "the final seq")
    final = int((folder / "final").read_text())
    wait_until(lambda: live.overlay.seq == final, "the follower to catch up", timeout_s=60)
    held = sorted(int(node_id) for node_id in live.overlay.new_ids)
    (folder / f"reader-{name}.tmp").write_text(json.dumps({"seq": final, "ids": held}))
    (folder / f"reader-{name}.tmp").rename(folder / f"reader-{name}.json")
    os._exit(0)


def stall_inside_the_next_record(folder: Path) -> None:
    """Writes half of the next record, says so, and waits to be killed (holding the lock)."""

    def half_then_wait(fd: int, data: bytes, offset: int) -> None:
        os.pwrite(fd, data[: len(data) // 2], offset)
        os.fsync(fd)
        (folder / "stalled.tmp").write_text(str(len(data)))
        (folder / "stalled.tmp").rename(folder / "stalled")  # seen whole or not at all
        time.sleep(3600)

    update_log._write_all = half_then_wait  # type: ignore[assignment]


def test_no_acknowledged_update_is_lost_or_duplicated(int_store, tmp_path):
    log_path = tmp_path / "state" / "updates.log"
    context = multiprocessing.get_context("fork")
    rng = random.Random(SEED)
    started: list = []
    running: dict[int, multiprocessing.process.BaseProcess] = {}
    kills = {"random": 0, "inside a large record": 0}

    def start(name: int, stall: bool = False):
        process = context.Process(
            target=writer, args=(int_store, str(log_path), str(tmp_path), name, stall)
        )
        process.start()
        started.append(process)
        return process

    def kill(process) -> None:
        os.kill(process.pid, signal.SIGKILL)
        process.join(timeout=30)

    def lines() -> list[str]:
        """Complete lines of the ack file (a line being written has no newline yet)."""
        text = (tmp_path / "acks").read_text() if (tmp_path / "acks").exists() else ""
        return text.split("\n")[:-1]

    def acknowledged() -> list[str]:
        return [line for line in lines() if line.split()[1].isdigit()]

    def refusals() -> int:
        return sum(line.endswith(" refused") for line in lines())

    names = iter(range(1, 10_000))
    for slot in range(SLOTS):
        running[slot] = start(next(names))
    events = sorted(
        [(n, "random") for n in RANDOM_KILLS_AT] + [(n, "stall") for n in STALLED_KILLS_AT]
    )
    try:
        for threshold, kind in events:
            wait_until(lambda t=threshold: len(acknowledged()) >= t, f"{threshold} acks")
            if kind == "random":
                slot = rng.randrange(SLOTS)
                kill(running[slot])
                running[slot] = start(next(names))
                kills["random"] += 1
            else:
                (tmp_path / "stalled").unlink(missing_ok=True)
                staller = start(next(names), stall=True)
                wait_until((tmp_path / "stalled").exists, "a writer inside a large record")
                assert int((tmp_path / "stalled").read_text()) > 4096
                kill(staller)
                kills["inside a large record"] += 1
        wait_until(lambda: refusals() >= FULL_DISK_KILL_AT, "the log to fill up")
        slot = rng.randrange(SLOTS)
        kill(running[slot])
        running[slot] = start(next(names))
        kills["random"] += 1
        wait_until(lambda: refusals() >= FULL_DISK_REFUSALS, "507s on the full log")
        (tmp_path / "stop").touch()
        wait_until(lambda: sum(x.endswith(" stopped") for x in lines()) >= SLOTS, "stops")
        records, _ = UpdateLog.open(log_path, writable=False).read_from(0)
        (tmp_path / "final.tmp").write_text(str(len(records)))
        (tmp_path / "final.tmp").rename(tmp_path / "final")
        for process in running.values():
            process.join(timeout=90)
            assert process.exitcode == 0, f"reader {process.pid} exited {process.exitcode}"
    finally:
        for process in started:
            if process.is_alive():
                kill(process)

    previous = 0
    for record in records:  # in seq order, none duplicated, none missing
        check_next(record, previous, log_path)
        previous = record.seq
    logged = {tag_of(record.operations): record.seq for record in records}
    assert len(logged) == len(records)  # each request's record is there at most once
    acked = {int(tag): int(seq) for tag, seq in (line.split() for line in acknowledged())}
    lost = {tag: seq for tag, seq in acked.items() if logged.get(tag) != seq}
    assert lost == {}, f"acknowledged updates missing or under another seq: {lost}"
    refused = {int(line.split()[0]) for line in lines() if line.endswith(" refused")}
    assert refused and not refused & set(logged)  # a 507 left nothing behind
    expected_ids = sorted(int(op["id"]) for record in records for op in record.operations)
    readers = sorted(tmp_path.glob("reader-*.json"))
    assert len(readers) == SLOTS
    for report in readers:
        assert json.loads(report.read_text()) == {"seq": len(records), "ids": expected_ids}
    restarted = LiveGraph(int_store, log_path)  # a restart replays the same graph
    assert restarted.overlay.seq == len(records)
    assert sorted(int(i) for i in restarted.overlay.new_ids) == expected_ids
    restarted.close()
    print(
        f"crash consistency: {len(started)} processes, {kills['random']} random kills, "
        f"{kills['inside a large record']} kills inside a large record, {len(records)} records, "
        f"{len(acked)} acknowledged, {len(refused)} refused (log full at "
        f"{log_path.stat().st_size} bytes), 0 lost, 0 duplicated"
    )
