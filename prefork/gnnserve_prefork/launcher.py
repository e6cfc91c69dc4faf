"""The launcher: what a TorchServe worker process does when the pre-fork hook is on.

The Java frontend starts ``python .../ts/model_service_worker.py --sock-name ...`` for each
worker and watches that process: its stdout/stderr carry the worker's log and metrics, its exit
means the worker died, and it is killed (SIGKILL) to stop the worker. The launcher keeps that
contract while the real worker is forked from the zygote: it hands over its argv, environment,
working directory, ``sys.path``, its standard streams and the read end of a pipe the worker
watches (the worker exits when the launcher is gone), then exits with the worker's exit code.
Only if no zygote can be reached before anything was handed over does the process go on as a
plain worker. It talks only to a zygote of its own user (see ``protocol``).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from gnnserve_prefork.protocol import (
    LineReader,
    Refused,
    check_peer,
    send_request,
    zygote_address,
)

WORKER_SCRIPT = "model_service_worker.py"
# Set to 0 in TorchServe's environment to start plain workers with the hook still on the path.
SWITCH = "GNNSERVE_PREFORK"
_CONNECT_WAIT_S = 5.0
# The frontend gives a worker 2 minutes to start; the zygote's first imports fit well inside.
_START_WAIT_S = 110.0


def hand_over_to_zygote() -> None:
    """Runs this worker in a forked child of the zygote and exits with its status; returns
    (and the interpreter runs the worker itself) for any other process or when the zygote
    cannot be reached."""
    if Path(sys.argv[0]).name != WORKER_SCRIPT or os.environ.get(SWITCH, "1") == "0":
        return
    try:
        sock = _connect(os.getppid())
        reader, worker_pid = _start_worker(sock)
    except Refused as refusal:
        _fall_back(f"refused: {refusal}")
        return
    except (OSError, ValueError, subprocess.SubprocessError) as error:
        _fall_back(f"no zygote ({error})")
        return
    os._exit(_wait_for(reader, worker_pid))


def _fall_back(reason: str) -> None:
    """One line in the worker's log; pre-forking never stops a worker from starting."""
    print(
        f"gnnserve prefork: {reason}; this worker starts as a plain interpreter",
        file=sys.stderr,
        flush=True,
    )


def _connect(frontend_pid: int) -> socket.socket:
    address = zygote_address(frontend_pid)
    sock = _try_connect(address)
    if sock is not None:
        return sock
    _spawn_zygote(frontend_pid)
    deadline = time.monotonic() + _CONNECT_WAIT_S
    while time.monotonic() < deadline:
        sock = _try_connect(address)
        if sock is not None:
            return sock
        time.sleep(0.05)
    raise TimeoutError(f"the zygote did not listen within {_CONNECT_WAIT_S:.0f} s")


def _try_connect(address: str) -> socket.socket | None:
    """A connection to the zygote at ``address``, or None while nobody listens there. What
    follows carries the environment (secrets included): a listener of another uid is refused."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(address)
        check_peer(sock, "the zygote")
    except (ConnectionRefusedError, FileNotFoundError):
        sock.close()
        return None
    except BaseException:
        sock.close()
        raise
    return sock


def _spawn_zygote(frontend_pid: int) -> None:
    """Starts the zygote for this frontend and waits until it has imported everything (it
    fails here if it could not). Several launchers racing here leave one zygote: the others
    find its lock taken and return at once."""
    directory = log_dir()
    directory.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "gnnserve_prefork.zygote", "--frontend-pid", str(frontend_pid)]
    with (directory / "gnnserve_prefork.log").open("ab") as log:
        subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            check=True,
            timeout=_START_WAIT_S,
        )


def _start_worker(sock: socket.socket) -> tuple[LineReader, int]:
    """Hands this process over; returns once the zygote says which PID the worker has. On any
    failure the connection is closed: a plain worker keeps nothing of the zygote's."""
    try:
        return _request_worker(sock)
    except BaseException:
        sock.close()
        raise


def log_dir() -> Path:
    """Where the zygote writes its log: TorchServe's log folder, else the temp dir."""
    return Path(os.environ.get("LOG_LOCATION") or os.environ.get("TMPDIR") or "/tmp")


def _request_worker(sock: socket.socket) -> tuple[LineReader, int]:
    alive_read, _alive_write = os.pipe()  # the write end is open until this process dies
    request = {"argv": sys.argv, "env": dict(os.environ), "cwd": os.getcwd(), "path": sys.path}
    try:
        send_request(sock, request, [0, 1, 2, alive_read])
    finally:
        os.close(alive_read)
    sock.settimeout(_START_WAIT_S)
    reader = LineReader(sock)
    started = reader.next()
    if started is not None and "error" in started:
        raise Refused(f"the zygote refused this worker: {started['error']}")
    if started is None or not isinstance(started.get("pid"), int):
        raise ConnectionError(f"the zygote did not start the worker (it answered {started})")
    sock.settimeout(None)
    return reader, started["pid"]


def _wait_for(reader: LineReader, worker_pid: int) -> int:
    """Forwards SIGTERM/SIGINT to the worker and returns its exit status once it exits."""

    def forward(signum: int, _frame: object) -> None:
        os.kill(worker_pid, signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    try:
        finished = reader.next()
    except (OSError, ValueError):
        return 1
    if finished is None:  # the zygote died; its workers die with it (PR_SET_PDEATHSIG)
        return 1
    code = finished.get("exit")
    return code if isinstance(code, int) and 0 <= code < 256 else 1
