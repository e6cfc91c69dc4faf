"""One keeper per graph and device hands every worker the same features, exits once no worker
has used it for a while, and a worker whose keeper is gone ends (on the CPU here: tensors are
shared through shared-memory files instead of CUDA IPC handles)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import threading
import time

import numpy as np
import psutil
import pytest
import torch

from handler.gpu.feature_keeper import KeeperLost, attach, keeper_name
from handler.gpu.ipc_handle import BadHandle, describe, open_shared
from handler.pipeline.batch import is_fatal_device_error

CPU = torch.device("cpu")


def keepers(name: str) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if name in (process.info["cmdline"] or []):
            found.append(process)
    return found


def wait_until(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the condition did not hold in time")
        time.sleep(0.05)


@pytest.fixture()
def started(int_store, tmp_path):
    """Two workers attached to one keeper (a short idle time); the keeper killed at the end."""
    name = keeper_name(int_store.checksum, CPU, str(tmp_path))
    first = attach(int_store, CPU, str(tmp_path), idle_s=0.5)
    second = attach(int_store, CPU, str(tmp_path), idle_s=0.5)
    yield name, first, second
    for shared in (first, second):
        shared.close()
    for process in keepers(name):
        process.kill()


def test_every_worker_gets_the_stored_features_from_one_keeper(int_store, started):
    name, first, second = started
    assert len(keepers(name)) == 1
    for shared in (first, second):
        assert np.array_equal(shared.table.numpy(), np.asarray(int_store.features))
        shared.check()


def test_the_keeper_exits_once_its_workers_are_gone(started):
    name, first, second = started
    first.close()
    time.sleep(1.0)  # one worker left: the keeper stays past its idle time
    assert len(keepers(name)) == 1
    second.close()
    wait_until(lambda: not keepers(name))


def test_a_worker_whose_keeper_is_gone_ends(started):
    name, first, _ = started
    keepers(name)[0].kill()
    wait_until(lambda: first._lost.is_set())
    with pytest.raises(KeeperLost) as lost:
        first.check()
    assert is_fatal_device_error(lost.value)


def test_servers_and_graphs_get_keepers_of_their_own(int_store, str_store, tmp_path):
    names = {
        keeper_name(int_store.checksum, CPU, str(tmp_path)),
        keeper_name(int_store.checksum, CPU, str(tmp_path / "other_server")),
        keeper_name(str_store.checksum, CPU, str(tmp_path)),
        keeper_name(int_store.checksum, torch.device("cuda:1"), str(tmp_path)),
    }
    assert len(names) == 4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_workers_on_a_gpu_map_the_keepers_one_copy(int_store, tmp_path):
    cuda = torch.device("cuda:0")
    name = keeper_name(int_store.checksum, cuda, str(tmp_path))
    workers = [attach(int_store, cuda, str(tmp_path)) for _ in range(2)]
    try:
        assert len(keepers(name)) == 1
        pointers = {shared.table.data_ptr() for shared in workers}
        assert len(pointers) == 1  # one mapping of the keeper's allocation in this process
        for shared in workers:
            assert torch.equal(shared.table.cpu(), torch.from_numpy(np.asarray(int_store.features)))
    finally:
        for shared in workers:
            shared.close()
        for process in keepers(name):
            process.kill()


def test_a_shared_matrix_is_described_in_json_and_opened_as_it_was():
    torch.multiprocessing.set_sharing_strategy("file_system")
    table = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    message = describe(table)
    assert json.loads(message)["kind"] == "cpu"
    assert torch.equal(open_shared(message), table)


@pytest.mark.parametrize(
    "message",
    [
        b"not json",
        b"[]",
        b'{"kind": "cpu"}',
        b'{"kind": "pickle", "size": [1, 1], "stride": [1, 1], "offset": 0}',
        b'{"kind": "cpu", "size": [1], "stride": [1], "offset": 0}',
    ],
)
def test_anything_else_is_refused_as_a_bad_handle(message):
    with pytest.raises(BadHandle):
        open_shared(message)


def test_a_keeper_of_another_user_is_refused(int_store, started, monkeypatch, tmp_path):
    monkeypatch.setattr(os, "getuid", lambda: 4242)
    with pytest.raises(KeeperLost, match="uid"):
        attach(int_store, CPU, str(tmp_path), idle_s=0.5)


def connect_to(name: str) -> socket.socket:
    peer = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    peer.connect("\0" + name)
    return peer


def assert_serves_the_store(shared, int_store) -> None:
    assert np.array_equal(shared.table.numpy(), np.asarray(int_store.features))


def test_a_peer_that_connects_and_closes_at_once_leaves_the_keeper_serving(
    int_store, started, tmp_path
):
    name, first, second = started
    (keeper,) = keepers(name)
    keeper.suspend()  # the peer is gone before the keeper accepts it and writes to it
    try:
        connect_to(name).close()
    finally:
        keeper.resume()
    third = attach(int_store, CPU, str(tmp_path), idle_s=0.5)  # accepted after that peer
    try:
        assert keepers(name) == [keeper]
        assert_serves_the_store(third, int_store)
        for shared in (first, second, third):
            shared.check()
            assert not shared._lost.is_set()
    finally:
        third.close()


def test_a_peer_that_stalls_does_not_hold_up_the_next_worker(int_store, started, tmp_path):
    name, first, _ = started
    stalled = connect_to(name)  # never reads what the keeper sends, never closes
    try:
        third = attach(int_store, CPU, str(tmp_path), idle_s=0.5, answer_timeout_s=5.0)
        assert_serves_the_store(third, int_store)
        third.close()
        assert len(keepers(name)) == 1 and not first._lost.is_set()
    finally:
        stalled.close()


def test_a_worker_attaching_to_a_stopped_keeper_gets_a_clear_error_in_time(
    int_store, started, tmp_path
):
    name, first, _ = started
    (keeper,) = keepers(name)
    keeper.suspend()
    try:
        start = time.monotonic()
        with pytest.raises(KeeperLost) as lost:
            attach(int_store, CPU, str(tmp_path), idle_s=0.5, answer_timeout_s=0.5)
        assert time.monotonic() - start < 5.0
    finally:
        keeper.resume()
    assert str(lost.value) == (
        f"the features' keeper {name} did not hand them over within 0.5 s (its process is "
        "stopped or stuck)"
    )
    first.check()  # the workers attached before are not affected


@contextlib.contextmanager
def fake_keeper(name: str, sends: bytes):
    """A process at the keeper's name that sends the worker that connects ``sends`` and keeps
    the connection open until the end."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + name)
    listener.listen(1)
    listener.settimeout(30.0)
    done = threading.Event()

    def serve() -> None:
        worker, _ = listener.accept()
        with worker:
            worker.sendall(sends)
            done.wait(30.0)

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        listener.close()


def framed(payload: bytes) -> bytes:
    return struct.pack("!Q", len(payload)) + payload


def test_a_keeper_that_stalls_inside_its_message_is_given_up_on(int_store, tmp_path):
    name = keeper_name(int_store.checksum, CPU, str(tmp_path))
    with fake_keeper(name, framed(b'{"kind": "cpu"}')[:5]), pytest.raises(KeeperLost) as lost:
        attach(int_store, CPU, str(tmp_path), answer_timeout_s=0.5)
    assert str(lost.value) == (
        f"the features' keeper {name} did not hand them over within 0.5 s (its process is "
        "stopped or stuck)"
    )


def described(table: torch.Tensor, **changes) -> bytes:
    """``table``'s description with ``changes`` to its fields."""
    torch.multiprocessing.set_sharing_strategy("file_system")
    return json.dumps({**json.loads(describe(table)), **changes}).encode()


def features(store) -> torch.Tensor:
    return torch.from_numpy(np.array(store.features))


MALFORMED = {
    "not JSON": (lambda store: b"not json", "not a shared matrix's description: "),
    "nested too deeply": (
        lambda store: b"[" * 30_000 + b"]" * 30_000,
        "not a shared matrix's description: maximum recursion depth exceeded",
    ),
    "sizes as text": (
        lambda store: described(features(store), size=["4", "3"]),
        "not a shared matrix's description: expected integers >= 0, got ['4', '3']",
    ),
    "a negative byte count": (
        lambda store: described(features(store), size_bytes=-1),
        "not a shared matrix's description: expected integers >= 0, got [-1]",
    ),
    "a stale name": (
        lambda store: described(features(store), name="/gnnserve-no-such-memory"),
        "a shared matrix's description that cannot be opened: ",
    ),
    "more rows than its memory": (
        lambda store: described(features(store), size=[10 * store.num_nodes, store.feature_dim]),
        "a shared matrix's description that cannot be opened: ",
    ),
    "a CUDA handle that cannot be opened": (
        lambda store: json.dumps(
            {
                "kind": "cuda",
                "size": list(store.features.shape),
                "stride": [store.feature_dim, 1],
                "offset": 0,
                "device": 0,
                "handle": "00",
                "size_bytes": 4 * store.num_nodes * store.feature_dim,
                "offset_bytes": 0,
                "counter": "00",
                "counter_offset": 0,
                "event": "",
                "sync": False,
            }
        ).encode(),
        "a shared matrix's description that cannot be opened: ",
    ),
}


@pytest.mark.parametrize("kind", MALFORMED)
def test_any_malformed_handle_is_one_typed_error(int_store, tmp_path, kind):
    make, reason = MALFORMED[kind]
    name = keeper_name(int_store.checksum, CPU, str(tmp_path))
    with fake_keeper(name, framed(make(int_store))), pytest.raises(KeeperLost) as lost:
        attach(int_store, CPU, str(tmp_path), answer_timeout_s=5.0)
    assert str(lost.value).startswith(
        f"the features' keeper {name} did not hand them over: {reason}"
    )


def test_a_handle_whose_layout_is_not_the_stores_is_refused(int_store, tmp_path):
    name = keeper_name(int_store.checksum, CPU, str(tmp_path))
    rows, width = int_store.features.shape
    expected = f"the store's features are torch.float32 ({rows}, {width}) with strides ({width}, 1)"
    cases = {  # a zero stride reads row 0 for every node; a matrix of one row less
        described(features(int_store), stride=[0, 1]): f"({rows}, {width}) with strides (0, 1)",
        described(features(int_store)[:-1].clone()): f"({rows - 1}, {width}) with strides "
        f"({width}, 1)",
    }
    for message, got in cases.items():
        with fake_keeper(name, framed(message)), pytest.raises(KeeperLost) as lost:
            attach(int_store, CPU, str(tmp_path), answer_timeout_s=5.0)
        assert str(lost.value) == (
            f"the features' keeper {name} did not hand them over: the keeper's matrix is "
            f"torch.float32 {got}; {expected}"
        )
