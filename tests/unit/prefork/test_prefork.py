"""The pre-fork launcher and zygote without TorchServe: a stand-in frontend starts a stand-in
``model_service_worker.py`` exactly as the Java frontend would, with the hook on PYTHONPATH."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
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

PREFORK = Path(__file__).resolve().parents[3] / "prefork"

# Stands in for TorchServe's worker script: reports what a worker would see, then behaves as
# the test asks through its arguments.
FAKE_WORKER = textwrap.dedent(
    """
    import json, os, sys, time
    print(json.dumps({
        "pid": os.getpid(), "ppid": os.getppid(), "argv": sys.argv, "cwd": os.getcwd(),
        "path0": sys.path[0], "marker": os.environ.get("PREFORK_TEST_MARKER"),
        "torch_loaded": "json" in sys.modules,
    }), flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    if sys.argv[1] == "sleep":
        time.sleep(60)
    sys.exit(int(sys.argv[2]))
    """
)

# Stands in for the Java frontend: starts one worker, relays its exit status, and lives only
# as long as that (so the zygote, keyed by this PID, exits after it).
FAKE_FRONTEND = textwrap.dedent(
    """
    import subprocess, sys
    worker = subprocess.Popen([sys.executable, *sys.argv[1:]], cwd=sys.argv[1].rsplit("/", 2)[0])
    print(f"launcher {worker.pid}", flush=True)
    sys.exit(worker.wait())
    """
)


@pytest.fixture
def worker_script(tmp_path: Path) -> Path:
    script = tmp_path / "ts" / "model_service_worker.py"
    script.parent.mkdir()
    script.write_text(FAKE_WORKER)
    return script


def prefork_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(PREFORK),
        "GNNSERVE_PREFORK_IMPORTS": "json",  # light: these tests are about the plumbing
        "LOG_LOCATION": str(tmp_path / "logs"),
        "PREFORK_TEST_MARKER": "from-the-frontend",
        **extra,
    }


def run_frontend(
    tmp_path: Path, worker_script: Path, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", FAKE_FRONTEND, str(worker_script), *args],
        env=prefork_env(tmp_path, **env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def reported(output: str) -> dict:
    return json.loads(next(line for line in output.splitlines() if line.startswith("{")))


def zygote_log(tmp_path: Path) -> str:
    return (tmp_path / "logs" / "gnnserve_prefork.log").read_text()


def test_the_worker_runs_forked_with_the_launchers_streams_env_and_exit_status(
    tmp_path: Path, worker_script: Path
) -> None:
    result = run_frontend(tmp_path, worker_script, "exit", "3")
    assert result.returncode == 3
    worker = reported(result.stdout)
    launcher_pid = int(result.stdout.split("launcher ")[1].split()[0])
    assert worker["pid"] != launcher_pid  # it ran in another process: the zygote's child
    assert worker["ppid"] != launcher_pid
    assert worker["argv"] == [str(worker_script), "exit", "3"]
    assert worker["cwd"] == str(tmp_path)
    assert worker["path0"] == str(worker_script.parent)
    assert worker["marker"] == "from-the-frontend"
    assert worker["torch_loaded"]  # the zygote's imports are there already
    assert "to stderr" in result.stderr
    assert f"forked worker {worker['pid']}" in zygote_log(tmp_path)


def test_the_zygote_exits_with_its_frontend(tmp_path: Path, worker_script: Path) -> None:
    run_frontend(tmp_path, worker_script, "exit", "0")
    deadline = time.monotonic() + 10
    while "is gone; exiting" not in zygote_log(tmp_path):
        assert time.monotonic() < deadline, zygote_log(tmp_path)
        time.sleep(0.1)


def test_killing_the_launcher_kills_its_worker(tmp_path: Path, worker_script: Path) -> None:
    """TorchServe stops a worker with SIGKILL on the process it started: the launcher."""
    frontend = subprocess.Popen(
        [sys.executable, "-c", FAKE_FRONTEND, str(worker_script), "sleep", "0"],
        env=prefork_env(tmp_path),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert frontend.stdout is not None
        launcher_pid = int(frontend.stdout.readline().split()[1])
        worker_pid = reported(frontend.stdout.readline())["pid"]
        worker = psutil.Process(worker_pid)
        os.kill(launcher_pid, signal.SIGKILL)
        worker.wait(timeout=10)  # raises TimeoutExpired if the worker outlived its launcher
        assert frontend.wait(timeout=10) == 256 - signal.SIGKILL  # sys.exit(-9) of the stand-in
    finally:
        frontend.kill()
        frontend.wait()


def test_sigterm_to_the_launcher_reaches_the_worker(tmp_path: Path, worker_script: Path) -> None:
    frontend = subprocess.Popen(
        [sys.executable, "-c", FAKE_FRONTEND, str(worker_script), "sleep", "0"],
        env=prefork_env(tmp_path),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert frontend.stdout is not None
        launcher_pid = int(frontend.stdout.readline().split()[1])
        reported(frontend.stdout.readline())
        os.kill(launcher_pid, signal.SIGTERM)
        assert frontend.wait(timeout=10) == 128 + signal.SIGTERM
    finally:
        frontend.kill()
        frontend.wait()


def test_the_switch_and_other_scripts_leave_python_alone(
    tmp_path: Path, worker_script: Path
) -> None:
    plain = run_frontend(tmp_path, worker_script, "exit", "0", GNNSERVE_PREFORK="0")
    launcher_pid = int(plain.stdout.split("launcher ")[1].split()[0])
    assert reported(plain.stdout)["pid"] == launcher_pid
    other = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        env=prefork_env(tmp_path),
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
        tmp_path, worker_script, "exit", "0", GNNSERVE_PREFORK_IMPORTS="no_such_module_here"
    )
    assert result.returncode == 0
    launcher_pid = int(result.stdout.split("launcher ")[1].split()[0])
    assert reported(result.stdout)["pid"] == launcher_pid
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
