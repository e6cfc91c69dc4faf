"""Pre-forked workers (prefork/) in a real TorchServe: same answers as plain workers, shared
memory, and the frontend's worker lifecycle (kill, replace, scale, stop) intact."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import requests

from tests.servers.torchserve import Serve, TorchServe, model_worker_pids

pytestmark = pytest.mark.integration
NODES = [f"acct_{i}" for i in range(0, 120, 4)]


@pytest.fixture(scope="module")
def forked(serve: Serve, model_store: Path) -> Iterator[TorchServe]:
    # A server of its own: pre-forked workers are a server setting, and these tests kill them.
    with serve(model_store, "gnn=gnn.mar", name="prefork", prefork=True) as started:
        scale(started, 2)
        yield started


def scale(server: TorchServe, workers: int) -> None:
    response = requests.put(
        f"{server.management_url}/models/gnn",
        params={"min_worker": workers, "max_worker": workers, "synchronous": "true"},
        headers=server.auth("management"),
        timeout=300,
    )
    response.raise_for_status()


def ready_workers(server: TorchServe) -> list[int]:
    return model_worker_pids(server, "gnn", ready=True)


def wait_for_ready(server: TorchServe, count: int, gone: set[int], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = ready_workers(server)
        if len(pids) == count and not gone & set(pids):
            return
        time.sleep(0.2)
    raise TimeoutError(f"not {count} fresh READY workers after {timeout} s: {pids}")


def zygote(server: TorchServe) -> psutil.Process:
    """The zygote started for this server's frontend (its workers' parent)."""
    (worker, *_) = ready_workers(server)
    parent = psutil.Process(worker).parent()
    assert parent is not None
    assert "gnnserve_prefork.zygote" in " ".join(parent.cmdline())
    # Started by `torchserve --start` itself, before the frontend's first worker (early.py).
    assert "--frontend-pid-file" in parent.cmdline()
    log = (server.home / "logs" / "gnnserve_prefork.log").read_text()
    assert f"started with frontend {server.pid}, before its first worker" in log
    return parent


def answers(server: TorchServe) -> list[dict]:
    headers = server.auth("inference")
    url = f"{server.inference_url}/predictions/gnn"
    return [
        requests.post(url, json={"node_id": n}, headers=headers, timeout=30).json() for n in NODES
    ]


def launcher_of(server: TorchServe, worker: int) -> psutil.Process:
    """The frontend's child whose forked worker is ``worker``: the one the zygote logged."""
    launchers = {child.pid: child for child in psutil.Process(server.pid).children()}
    log = (server.home / "logs" / "model_log.log").read_text()
    assert launchers, log
    # The launcher's stdout is the worker's: TorchServe logs the worker's PID line under the
    # launcher's thread name, but not the launcher's PID, so match through /proc's fd links.
    for launcher in launchers.values():
        if os.readlink(f"/proc/{launcher.pid}/fd/1") == os.readlink(f"/proc/{worker}/fd/1"):
            return launcher
    raise AssertionError(f"no launcher shares worker {worker}'s stdout")


def test_forked_workers_answer_exactly_like_plain_ones(server, forked) -> None:
    assert len(ready_workers(forked)) == 2
    assert answers(forked) == answers(server)
    assert {p.pid for p in zygote(forked).children()} == set(ready_workers(forked))


def test_forked_workers_share_the_imported_pages(forked) -> None:
    for pid in ready_workers(forked):
        fields = {}
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
            key, _, rest = line.partition(":")
            fields[key] = int(rest.split()[0]) / 1024
        print(f"worker {pid}: RSS {fields['Rss']:.0f} MiB, PSS {fields['Pss']:.0f} MiB")
        assert fields["Shared_Clean"] + fields["Shared_Dirty"] > 100  # torch & co. from the zygote
        assert fields["Pss"] < 0.75 * fields["Rss"]


def test_a_killed_worker_or_launcher_is_replaced(forked) -> None:
    victim, _ = ready_workers(forked)
    launcher = launcher_of(forked, victim)
    os.kill(victim, signal.SIGKILL)
    launcher.wait(timeout=30)  # the launcher reports its worker's death to the frontend
    wait_for_ready(forked, 2, gone={victim})
    victim, _ = ready_workers(forked)
    launcher = launcher_of(forked, victim)
    launcher.kill()  # what the frontend does to stop a worker
    psutil.Process(victim).wait(timeout=30)
    wait_for_ready(forked, 2, gone={victim})
    assert all(answer.get("predicted_class") is not None for answer in answers(forked))


def test_scaling_down_and_stopping_leave_no_process_behind(forked) -> None:
    family = zygote(forked)
    before = set(ready_workers(forked))
    scale(forked, 1)
    wait_for_ready(forked, 1, gone=set())
    (removed,) = before - set(ready_workers(forked))
    psutil.wait_procs([psutil.Process(removed)], timeout=30)
    assert not psutil.pid_exists(removed) or psutil.Process(removed).status() == "zombie"
    workers = [psutil.Process(pid) for pid in ready_workers(forked)]
    forked.stop()
    _, alive = psutil.wait_procs([family, *workers], timeout=30)
    assert not alive, alive
