"""The zygote started with the server instead of with its first worker.

Left to the first launcher, the zygote's imports (torch, PyG: about 3.5 s here) begin only once
the Java frontend is up and has started a worker, so every server start pays the JVM's start and
the imports one after the other. ``torchserve --start`` is a Python process too: with this folder
on ``PYTHONPATH`` it starts the zygote at once. The zygote waits for the pid file the CLI writes
when it has started the frontend (``$TMPDIR/.model_server.pid``), takes that frontend's address
before any launcher looks for it, and imports while the JVM starts; a launcher that connects
meanwhile waits for it. If no frontend shows up (the server was already running, or failed to
start), the zygote exits, and launchers start one themselves as before.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gnnserve_prefork.launcher import SWITCH, log_dir

CLI = "torchserve"
PID_FILE = ".model_server.pid"  # where TorchServe's CLI records the frontend's PID
FRONTEND_CLASS = b"org.pytorch.serve.ModelServer"
FRONTEND_WAIT_S = 60.0
_POLL_S = 0.02


def start_zygote_early() -> None:
    """In ``torchserve --start`` (not ``--stop``, not with the switch off): starts the zygote
    for the frontend this CLI is about to start, detached, and returns at once."""
    argv = [Path(sys.argv[0]).name, *sys.argv[1:]]
    if argv[0] != CLI or os.environ.get(SWITCH, "1") == "0":
        return
    if any(flag in argv for flag in ("--stop", "-h", "--help", "-v", "--version")):
        return
    pid_file = Path(tempfile.gettempdir()) / PID_FILE
    command = [
        sys.executable,
        "-m",
        "gnnserve_prefork.zygote",
        "--frontend-pid-file",
        str(pid_file),
        "--newer-than",
        repr(time.time()),
    ]
    directory = log_dir()
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / "gnnserve_prefork.log").open("ab") as log:
        subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
        )


def wait_for_frontend(pid_file: Path, newer_than: float, timeout_s: float) -> int | None:
    """The PID in ``pid_file`` once it is written after ``newer_than`` (a Unix time) and names a
    running TorchServe frontend of this user; None if none does within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pid = _frontend_in(pid_file, newer_than)
        if pid is not None:
            return pid
        time.sleep(_POLL_S)
    return None


def _frontend_in(pid_file: Path, newer_than: float) -> int | None:
    try:
        if pid_file.stat().st_mtime < newer_than - 1.0:  # left by an earlier server
            return None
        pid = int(pid_file.read_text().strip())
        process = Path(f"/proc/{pid}")
        if process.stat().st_uid != os.getuid():
            return None
        command = (process / "cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if FRONTEND_CLASS in command.split(b"\0") else None
