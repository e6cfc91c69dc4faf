"""The zygote started by ``torchserve --start`` (gnnserve_prefork.early): it takes the frontend
the CLI's pid file names, only a fresh file naming a running frontend of this user, and nothing
but ``torchserve --start`` starts one."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gnnserve_prefork import early
from gnnserve_prefork.early import FRONTEND_CLASS, start_zygote_early, wait_for_frontend


@pytest.fixture()
def frontend():
    """A process whose command line names TorchServe's frontend class, as java's does."""
    process = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", FRONTEND_CLASS.decode()]
    )
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def test_a_fresh_pid_file_naming_the_frontend_is_taken(tmp_path: Path, frontend) -> None:
    pid_file = tmp_path / ".model_server.pid"
    since = time.time()
    pid_file.write_text(str(frontend.pid))
    assert wait_for_frontend(pid_file, since, timeout_s=5) == frontend.pid


def test_a_stale_file_or_another_process_is_not(tmp_path: Path, frontend) -> None:
    pid_file = tmp_path / ".model_server.pid"
    pid_file.write_text(str(frontend.pid))
    old = time.time() - 3600
    os.utime(pid_file, (old, old))
    assert wait_for_frontend(pid_file, time.time(), timeout_s=0.2) is None
    pid_file.write_text(str(os.getpid()))  # fresh, but this is not a TorchServe frontend
    assert wait_for_frontend(pid_file, time.time() - 5, timeout_s=0.2) is None
    pid_file.write_text("not a pid")
    assert wait_for_frontend(pid_file, time.time() - 5, timeout_s=0.2) is None


def test_no_pid_file_means_no_frontend(tmp_path: Path) -> None:
    assert wait_for_frontend(tmp_path / "absent.pid", time.time(), timeout_s=0.2) is None


@pytest.mark.parametrize(
    "argv",
    [
        ["/usr/bin/python3", "-m", "pytest"],
        ["/venv/bin/torchserve", "--stop"],
        ["/venv/bin/torchserve", "--help"],
    ],
)
def test_only_torchserve_start_starts_a_zygote(monkeypatch, argv) -> None:
    started = []
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.setattr(early.subprocess, "Popen", lambda *a, **k: started.append(a))
    start_zygote_early()
    assert started == []


def test_torchserve_start_starts_one_waiting_for_the_pid_file(monkeypatch, tmp_path) -> None:
    started = []
    monkeypatch.setattr(sys, "argv", ["/venv/bin/torchserve", "--start", "--ncs"])
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("LOG_LOCATION", str(tmp_path / "logs"))
    monkeypatch.setattr(early.tempfile, "tempdir", None)
    monkeypatch.setattr(early.subprocess, "Popen", lambda command, **k: started.append(command))
    start_zygote_early()
    (command,) = started
    assert command[1:4] == ["-m", "gnnserve_prefork.zygote", "--frontend-pid-file"]
    assert command[4] == str(tmp_path / ".model_server.pid")
    monkeypatch.setenv("GNNSERVE_PREFORK", "0")
    start_zygote_early()
    assert len(started) == 1
