"""The follower thread: applies other workers' updates between batches, never during one."""

from __future__ import annotations

import gc
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from archive_build.archive_config import main as write_archive_config
from handler.live import live_graph
from handler.live.live_graph import LiveGraph, UpdateRequest
from handler.settings import ServingSettings

from .conftest import make_engine, random_model, started

FOLLOWER = "gnnserve-update-follower"
FAST = 0.001  # poll every millisecond: the follower reacts within the test's patience
NEVER = 3600.0  # the thread runs but does not poll during the test
# The last six nodes of the test graph have no edges, so an edge from them is always new.
ISOLATED = (222, 225, 228, 231, 234)


def edge(src: int, dst: int) -> UpdateRequest:
    return UpdateRequest([{"type": "add_edge", "src": src, "dst": dst}])


def wait_for(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the follower did not get there in time"
        time.sleep(0.002)


def engine_over(live: LiveGraph, model):
    """A node engine serving ``live`` (full neighbourhoods)."""
    return make_engine(live.store, model=model, live=live, fanouts=[-1, -1])


def followers() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name.startswith(FOLLOWER)]


@pytest.fixture(autouse=True)
def no_leaked_followers() -> Iterator[None]:
    before = set(followers())
    yield
    gc.collect()
    for thread in set(followers()) - before:
        thread.join(timeout=2)
    assert set(followers()) - before == set(), "a test left a follower thread running"


@pytest.fixture()
def archive(model_dir: Path) -> Path:
    """An unpacked node archive (test_gnn_handler's)."""
    return model_dir


@pytest.fixture()
def graphs(int_store, tmp_path) -> Iterator[Callable[..., LiveGraph]]:
    """Opens LiveGraphs on one shared log (as workers do) and closes them after the test."""
    opened: list[LiveGraph] = []

    def open_graph(follow_interval_s: float = 0.0) -> LiveGraph:
        opened.append(LiveGraph(int_store, tmp_path / "updates.log", follow_interval_s))
        return opened[-1]

    yield open_graph
    for graph in opened:
        graph.close()


def test_the_follower_applies_another_workers_updates_without_a_read(graphs):
    writer, follower = graphs(), graphs(FAST)
    assert follower.following
    writer.update(edge(ISOLATED[0], 6))
    writer.update(edge(ISOLATED[1], 6))
    wait_for(lambda: follower.overlay.seq == 2)
    assert follower.version == writer.version
    node = int(follower.overlay.lookup([6])[0])
    assert list(follower.overlay.in_list(node)) == list(writer.overlay.in_list(node))


def test_read_your_writes_holds_when_the_follower_has_not_polled_yet(int_store, graphs):
    writer = graphs()
    engine = engine_over(graphs(NEVER), random_model(int_store, "sage"))
    writer.update(
        UpdateRequest(
            [
                {"type": "add_node", "id": 999_999, "x": [0.5] * int_store.feature_dim},
                {"type": "add_edge", "src": 999_999, "dst": 0},
            ]
        )
    )
    (answer,) = engine.handle([{"body": {"node_id": 999_999}}])
    assert answer.status == 200 and answer.body["graph_version"].endswith("+1")


class ContendedLock:
    """A re-entrant lock that tells when a thread that does not hold it starts waiting for it.

    Installed before the follower starts, so the test knows (no sleep, no race with the
    follower's poll) that the follower has read the new records and waits for the graph."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.contended = threading.Event()

    def __enter__(self) -> None:
        if not self._lock.acquire(blocking=False):
            self.contended.set()
            self._lock.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self._lock.release()


def test_a_batch_holding_the_graph_blocks_the_follower(int_store, graphs, monkeypatch):
    model = random_model(int_store, "sage")
    writer = graphs()
    writer.update(edge(ISOLATED[0], 0))
    lock = ContendedLock()
    seam = SimpleNamespace(RLock=lambda: lock, Event=threading.Event, Thread=threading.Thread)
    monkeypatch.setattr(live_graph, "threading", seam)  # this module's view only
    live = graphs(FAST)
    monkeypatch.undo()
    engine = engine_over(live, model)
    request = [{"body": {"node_ids": [0, 3, 6]}}]
    (expected,) = engine_over(graphs(), model).handle(request)  # the answer at +1
    with live.reading():
        version = live.version
        prepared = engine.prepare(request)
        for src in ISOLATED[1:4]:
            writer.update(edge(src, 0))  # node 0's neighbourhood changes meanwhile
        assert lock.contended.wait(timeout=30)  # the follower read them and waits for the graph
        assert live.version == version == f"{int_store.checksum[:12]}+1"
        (answer,) = engine.respond(engine.run(prepared))
    assert answer.body == expected.body  # computed and labelled on the graph at +1
    wait_for(lambda: live.overlay.seq == 4, timeout_s=30)
    (after,) = engine.handle(request)
    assert after.body["graph_version"].endswith("+4")
    assert after.body["predictions"][0] != expected.body["predictions"][0]  # node 0 changed


def test_an_update_inside_a_batch_takes_the_lock_again(int_store, tmp_path):
    live = LiveGraph(int_store, tmp_path / "updates.log")  # no fixture: a deadlock must not hang
    done: list[int] = []

    def batch() -> None:
        with live.reading():
            done.append(live.update(edge(ISOLATED[0], 6)).seq)

    thread = threading.Thread(target=batch, daemon=True)
    thread.start()
    thread.join(timeout=5)
    assert not thread.is_alive(), "an update inside reading() deadlocked"
    assert done == [1] and live.overlay.seq == 1
    live.close()


def test_engine_handle_holds_the_graph_for_the_whole_batch(int_store, graphs, monkeypatch):
    writer, live = graphs(), graphs(FAST)
    engine = engine_over(live, random_model(int_store, "sage"))
    run = engine.run

    def update_meanwhile(batch):
        writer.update(edge(ISOLATED[0], 0))
        time.sleep(0.05)  # the follower polls ~50 times and waits for the lock
        assert live.overlay.seq == 0
        return run(batch)

    monkeypatch.setattr(engine, "run", update_meanwhile)
    (answer,) = engine.handle([{"body": {"node_ids": [0]}}])
    assert answer.body["graph_version"].endswith("+0")
    wait_for(lambda: live.overlay.seq == 1)


def test_the_follower_survives_a_failing_apply_and_skips_nothing(graphs, monkeypatch, caplog):
    monkeypatch.setattr(live_graph, "FOLLOWER_RETRY_S", 0.01)
    writer, live = graphs(), graphs(FAST)
    calls: list[int] = []
    apply = live.overlay.apply

    def fails_once_on_seq_2(operations, seq, commit=None) -> None:
        calls.append(seq)
        if calls == [1, 2]:
            raise RuntimeError("injected replay failure")
        apply(operations, seq, commit)

    monkeypatch.setattr(live.overlay, "apply", fails_once_on_seq_2)
    with caplog.at_level(logging.ERROR, logger="handler.live.live_graph"):
        for src in ISOLATED[:3]:
            writer.update(edge(src, 6))
        wait_for(lambda: live.overlay.seq == 3)
    assert live.following
    assert calls == [1, 2, 2, 3]  # seq 2 failed and was retried; none skipped, none twice
    node = int(live.overlay.lookup([6])[0])
    assert list(live.overlay.in_list(node)) == list(writer.overlay.in_list(node))
    (logged,) = [record for record in caplog.records if record.exc_info]
    assert "cannot apply the record seq 2" in logged.getMessage()
    assert "injected replay failure" in str(logged.exc_info[1])
    assert live.failure is None  # cleared once the record applied


def test_close_stops_the_follower(graphs):
    live = graphs(FAST)
    (thread,) = set(followers())
    live.close()
    assert not thread.is_alive() and not live.following
    live.close()  # a second close is harmless


def test_a_graph_dropped_without_close_ends_its_follower(int_store, tmp_path):
    live = LiveGraph(int_store, tmp_path / "updates.log", FAST)
    thread = live._follower
    assert thread is not None
    del live
    gc.collect()
    thread.join(timeout=2)
    assert not thread.is_alive()


def test_the_handler_holds_the_graph_for_the_whole_batch(archive, tmp_path, monkeypatch):
    secret = "update-secret-0123456789"
    monkeypatch.setenv("GNNSERVE_UPDATE_SECRET", secret)
    state = tmp_path / "state"
    handler, context = started(archive, 1, updates_enabled=True, update_state_dir=str(state))
    live = handler.live
    assert live is not None and live.following
    store = handler.engine.store
    writer = LiveGraph(store, state / store.checksum / "updates.log")
    inference = handler.inference

    def update_meanwhile(data, *args, **kwargs):
        writer.update(edge(ISOLATED[0], 0))
        time.sleep(0.05)  # the follower polls ~50 times and waits for the lock
        assert live.overlay.seq == 0
        return inference(data, *args, **kwargs)

    try:
        monkeypatch.setattr(handler, "inference", update_meanwhile)
        (body,) = handler.handle([{"body": {"node_ids": [0]}}], context)
        assert json.loads(body)["graph_version"].endswith("+0")
        wait_for(lambda: live.overlay.seq == 1)
    finally:
        writer.close()
        live.close()


def test_the_handler_starts_no_follower_when_the_interval_is_zero(archive, tmp_path, monkeypatch):
    monkeypatch.setenv("GNNSERVE_UPDATE_SECRET", "update-secret-0123456789")
    handler, _ = started(
        archive,
        1,
        updates_enabled=True,
        update_state_dir=str(tmp_path / "state"),
        update_follow_interval_ms=0,
    )
    assert handler.live is not None and not handler.live.following
    handler.live.close()


@pytest.mark.parametrize("value", [-1, True, float("nan"), float("inf"), "5"])
def test_the_follow_interval_must_be_a_finite_number_of_ms(value):
    with pytest.raises(ValueError, match="update_follow_interval_ms"):
        ServingSettings.from_yaml_section({"update_follow_interval_ms": value})
    assert ServingSettings.from_yaml_section({"update_follow_interval_ms": 0})


def test_the_build_flag_reaches_the_archive_yaml(tmp_path):
    (tmp_path / "model_config.json").write_text(json.dumps({"num_layers": 2}))
    out = tmp_path / "model-config.yaml"
    options = ["--enable-updates", "--update-follow-interval", "0"]
    model_config = ["--model-config", str(tmp_path / "model_config.json")]
    assert write_archive_config(["--out", str(out), *model_config, *options]) == 0
    settings = ServingSettings.from_yaml_section(yaml.safe_load(out.read_text())["gnn"])
    assert settings.updates_enabled and settings.update_follow_interval_ms == 0
