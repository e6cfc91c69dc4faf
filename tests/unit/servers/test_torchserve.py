"""Which processes count as a TorchServe's workers: the one lookup the tests and the bench share.

This test's own process stands in for the frontend; its children are sleeping interpreters
whose command lines look like a worker's, a zygote's or neither.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.servers.torchserve import TorchServe, worker_pids, worker_processes

Start = Callable[..., subprocess.Popen[bytes]]


@pytest.fixture()
def child() -> Iterator[Start]:
    started: list[subprocess.Popen[bytes]] = []

    def start(*args: str) -> subprocess.Popen[bytes]:
        # Popen returns once exec succeeded: the command line is already the child's own.
        process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", *args])
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill()
        process.wait(timeout=10)


@pytest.fixture()
def server(tmp_path: Path) -> TorchServe:
    return TorchServe(home=tmp_path, model_store=tmp_path, pid=os.getpid())


def test_workers_are_the_children_that_run_the_worker_script(child, server):
    worker = child("/ts/model_service_worker.py", "--sock-type", "unix")
    child("some_other_child.py")
    assert [process.pid for process in worker_processes(server)] == [worker.pid]


def test_worker_pids_add_the_zygote_of_this_frontend_and_no_other(child, server):
    worker = child("model_service_worker.py")
    zygote = child("-m", "gnnserve_prefork.zygote", "--frontend-pid", str(os.getpid()))
    child("-m", "gnnserve_prefork.zygote", "--frontend-pid", "1")  # another server's zygote
    assert worker_pids(server) == sorted([worker.pid, zygote.pid])


def test_a_server_that_never_started_has_no_workers(server):
    server.pid = None
    assert worker_pids(server) == []
