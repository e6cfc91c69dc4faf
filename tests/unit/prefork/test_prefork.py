"""The pre-fork launcher and zygote without TorchServe: a stand-in frontend starts a stand-in
``model_service_worker.py`` exactly as the Java frontend would, with the hook on PYTHONPATH."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from gnnserve_prefork.protocol import (
    PASSED_FDS,
    LineReader,
    receive_request,
    send_line,
    send_request,
)
from gnnserve_prefork.zygote import Frontend

from .standins import (
    TS_ARGS,
    launcher_and_worker,
    launcher_pid,
    prefork_env,
    reported,
    run_frontend,
    start_frontend,
    zygote_log,
)


def test_the_worker_runs_forked_with_the_launchers_streams_env_and_exit_status(
    tmp_path: Path, worker_script: Path
) -> None:
    result = run_frontend(tmp_path, worker_script, "exit 3")
    assert result.returncode == 3
    worker = reported(result.stdout)
    launcher = launcher_pid(result.stdout)
    assert worker["pid"] != launcher  # it ran in another process: the zygote's child
    assert worker["ppid"] != launcher
    assert worker["argv"] == [str(worker_script), *TS_ARGS]
    assert worker["cwd"] == str(tmp_path)
    assert worker["path0"] == str(worker_script.parent)
    assert worker["marker"] == "from-the-frontend"
    assert worker["torch_loaded"]  # the zygote's imports are there already
    assert "to stderr" in result.stderr
    assert f"forked worker {worker['pid']}" in zygote_log(tmp_path)


def test_the_zygote_exits_with_its_frontend_and_removes_its_socket(
    tmp_path: Path, worker_script: Path, short_tmpdir: Path
) -> None:
    run_frontend(tmp_path, worker_script, "exit 0")
    sockets = short_tmpdir / f"gnnserve-prefork-{os.getuid()}"
    deadline = time.monotonic() + 10
    while "is gone; exiting" not in zygote_log(tmp_path) or any(sockets.iterdir()):
        assert time.monotonic() < deadline, (zygote_log(tmp_path), list(sockets.iterdir()))
        time.sleep(0.1)


def test_killing_the_launcher_kills_its_worker(tmp_path: Path, worker_script: Path) -> None:
    """TorchServe stops a worker with SIGKILL on the process it started: the launcher."""
    frontend = start_frontend(tmp_path, worker_script, "sleep")
    try:
        launcher, reported_worker = launcher_and_worker(frontend)
        worker = psutil.Process(reported_worker["pid"])
        os.kill(launcher, signal.SIGKILL)
        worker.wait(timeout=10)  # raises TimeoutExpired if the worker outlived its launcher
        assert frontend.wait(timeout=10) == 256 - signal.SIGKILL  # sys.exit(-9) of the stand-in
    finally:
        frontend.kill()
        frontend.wait()


def test_sigterm_to_the_launcher_reaches_the_worker(tmp_path: Path, worker_script: Path) -> None:
    frontend = start_frontend(tmp_path, worker_script, "sleep")
    try:
        launcher, _ = launcher_and_worker(frontend)
        os.kill(launcher, signal.SIGTERM)
        assert frontend.wait(timeout=10) == 128 + signal.SIGTERM
    finally:
        frontend.kill()
        frontend.wait()


def test_the_switch_and_other_scripts_leave_python_alone(
    tmp_path: Path, worker_script: Path
) -> None:
    plain = run_frontend(tmp_path, worker_script, "exit 0", GNNSERVE_PREFORK="0")
    assert reported(plain.stdout)["pid"] == launcher_pid(plain.stdout)
    other = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        env=prefork_env(tmp_path, "exit 0"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert other.returncode == 0 and other.stdout.strip().isdigit()
    assert not (tmp_path / "logs" / "gnnserve_prefork.log").exists()


def test_a_zygote_that_cannot_start_leaves_a_plain_worker(
    tmp_path: Path, worker_script: Path
) -> None:
    result = run_frontend(
        tmp_path, worker_script, "exit 0", GNNSERVE_PREFORK_IMPORTS="no_such_module_here"
    )
    assert result.returncode == 0
    assert reported(result.stdout)["pid"] == launcher_pid(result.stdout)
    assert "starts as a plain interpreter" in result.stderr
    assert "no_such_module_here" in zygote_log(tmp_path)


def test_requests_carry_their_descriptors() -> None:
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    read_end, write_end = os.pipe()
    try:
        send_request(left, {"argv": ["x"], "env": {}}, [0, 1, 2, read_end])
        request, fds = receive_request(right)
        assert request == {"argv": ["x"], "env": {}}
        assert len(fds) == PASSED_FDS
        os.write(write_end, b"!")
        assert os.read(fds[3], 1) == b"!"  # the same pipe, duplicated into this process
        for fd in fds:
            os.close(fd)
        send_line(right, {"pid": 7})
        send_line(right, {"exit": 0})
        reader = LineReader(left)
        assert reader.next() == {"pid": 7}
        assert reader.next() == {"exit": 0}
        right.close()
        assert reader.next() is None
    finally:
        for fd in (read_end, write_end):
            os.close(fd)
        left.close()
        right.close()


def test_a_request_without_its_descriptors_is_refused() -> None:
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with left, right:
        left.sendall(b'{"argv": []}\n')
        with pytest.raises(ValueError, match="needs 4 descriptors"):
            receive_request(right)


def test_an_exited_frontend_counts_as_gone_even_before_it_is_reaped() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.2)"])
    try:
        frontend = Frontend(child.pid)
        assert frontend.alive()
        deadline = time.monotonic() + 10
        while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert not frontend.alive()  # a zombie: exited, not yet waited for
    finally:
        child.wait()
    assert not frontend.alive()
