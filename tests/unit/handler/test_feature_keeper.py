"""One keeper per graph and device hands every worker the same features, exits once no worker
has used it for a while, and a worker whose keeper is gone ends (on the CPU here: tensors are
shared through shared-memory files instead of CUDA IPC handles)."""

from __future__ import annotations

import json
import os
import time

import numpy as np
import psutil
import pytest
import torch

from handler.core.batch import is_fatal_device_error
from handler.core.feature_keeper import KeeperLost, attach, keeper_name
from handler.core.ipc_handle import BadHandle, describe, open_shared

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
    first = attach(int_store.path, int_store.checksum, CPU, str(tmp_path), idle_s=0.5)
    second = attach(int_store.path, int_store.checksum, CPU, str(tmp_path), idle_s=0.5)
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
    workers = [attach(int_store.path, int_store.checksum, cuda, str(tmp_path)) for _ in range(2)]
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
        attach(int_store.path, int_store.checksum, CPU, str(tmp_path), idle_s=0.5)
