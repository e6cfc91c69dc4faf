"""The zygote: imports torch and PyG once, then forks one TorchServe worker per launcher.

Forked workers share the imported modules' pages copy-on-write (``gc.freeze()`` keeps the
collector from touching them), so each further worker costs what it writes, not a whole
interpreter. The zygote lives as long as its TorchServe frontend; its workers are killed if it
dies (``PR_SET_PDEATHSIG``), which their launchers report to the frontend as a worker exit.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import gc
import importlib
import logging
import os
import runpy
import select
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from gnnserve_prefork.protocol import receive_request, send_line, zygote_address

logger = logging.getLogger("gnnserve_prefork")

IMPORTS_ENV = "GNNSERVE_PREFORK_IMPORTS"
# What every gnnserve worker imports: torch, PyG, Captum (explanations) and TorchServe's own.
DEFAULT_IMPORTS = (
    "torch,torch_geometric,numpy,yaml,psutil,captum.attr,"
    "ts.torch_handler.base_handler,ts.model_service_worker"
)
_PR_SET_PDEATHSIG = 1
_POLL_S = 0.5


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--frontend-pid", type=int, required=True, help="the TorchServe frontend")
    parser.add_argument(
        "--imports",
        default=os.environ.get(IMPORTS_ENV, DEFAULT_IMPORTS),
        help=f"comma-separated modules imported before forking (env {IMPORTS_ENV})",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(format="%(asctime)s zygote %(process)d %(message)s", level=logging.INFO)
    frontend = Frontend(args.frontend_pid)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(zygote_address(args.frontend_pid))
    except OSError as error:
        if error.errno == errno.EADDRINUSE:
            return 0  # another launcher started this frontend's zygote first
        raise
    listener.listen(64)
    ready_read, ready_write = os.pipe()
    if os.fork() > 0:  # detach; the launcher that started us waits until the imports are done
        os.close(ready_write)
        os._exit(0 if os.read(ready_read, 1) == b"1" else 1)
    os.close(ready_read)
    os.setsid()
    os.chdir("/")  # the launcher's folder is an unpacked archive that TorchServe may delete
    # torch.cuda.is_available() during the imports must not initialise CUDA: a CUDA context
    # does not survive fork. The NVML check answers without one; workers get their own env.
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    start = time.perf_counter()
    for name in filter(None, (part.strip() for part in args.imports.split(","))):
        importlib.import_module(name)
    # Python threads would be lost in the children with whatever locks they hold. Native pools
    # started at import (OpenBLAS, jemalloc's background thread) handle fork themselves.
    if threading.active_count() != 1:
        names = [thread.name for thread in threading.enumerate()]
        logger.error(
            "refusing to fork workers: Python threads %s are running after the imports", names
        )
        return 1
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        logger.error("refusing to fork workers: CUDA was initialised during the imports")
        return 1
    gc.collect()
    gc.freeze()
    os.write(ready_write, b"1")
    os.close(ready_write)
    logger.info(
        "ready for frontend %d after %.1f s of imports (%s)",
        args.frontend_pid,
        time.perf_counter() - start,
        args.imports,
    )
    serve(listener, frontend)
    logger.info("frontend %d is gone; exiting", args.frontend_pid)
    return 0


def serve(listener: socket.socket, frontend: Frontend) -> None:
    """Forks a worker per launcher and reports each worker's exit to its launcher, until the
    frontend exits. Single-threaded: forking from a threaded process is unsafe."""
    launchers: dict[int, socket.socket] = {}
    while frontend.alive():
        readable, _, _ = select.select([listener], [], [], _POLL_S)
        _reap(launchers)
        if readable:
            _accept(listener, launchers)


def _accept(listener: socket.socket, launchers: dict[int, socket.socket]) -> None:
    conn, _ = listener.accept()
    try:
        conn.settimeout(10)
        _, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        if uid != os.getuid():
            raise PermissionError(f"a launcher of uid {uid}; this zygote serves uid {os.getuid()}")
        request, fds = receive_request(conn)
    except (OSError, ValueError) as error:
        logger.warning("refused a launcher: %s", error)
        conn.close()
        return
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _become_worker(request, fds, [listener, conn, *launchers.values()])
    for fd in fds:
        os.close(fd)
    try:
        send_line(conn, {"pid": pid})
    except OSError:
        logger.warning("launcher of worker %d went away before it started", pid)
    launchers[pid] = conn
    logger.info("forked worker %d for %s", pid, request.get("cwd"))


def _reap(launchers: dict[int, socket.socket]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        code = os.waitstatus_to_exitcode(status)
        conn = launchers.pop(pid, None)
        logger.info("worker %d exited with %d", pid, code)
        if conn is None:
            continue
        with contextlib.suppress(OSError):
            send_line(conn, {"exit": code if code >= 0 else 128 - code})
        conn.close()


def _process_state(pid: int) -> tuple[str, str] | None:
    """(state, start time) of a process from ``/proc/<pid>/stat``; None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # the command name may hold spaces and parentheses
    return fields[0], fields[19]


class Frontend:
    """The TorchServe frontend this zygote serves. It counts as gone once it has exited, even
    while nobody reaps it (a zombie), and a new process that reuses its PID is not it."""

    def __init__(self, pid: int) -> None:
        state = _process_state(pid)
        if state is None:
            raise ProcessLookupError(f"frontend {pid} is not running")
        self.pid = pid
        self._started = state[1]

    def alive(self) -> bool:
        state = _process_state(self.pid)
        return state is not None and state[0] not in ("Z", "X") and state[1] == self._started


def _become_worker(request: dict[str, Any], fds: list[int], inherited: list[socket.socket]) -> None:
    """In the forked child: take over the launcher's streams, environment and paths, run
    TorchServe's worker script as ``__main__``, and never return into the zygote's loop."""
    code = 1
    try:
        for sock in inherited:
            sock.close()
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        stdin, stdout, stderr, launcher_alive = fds
        for target, fd in enumerate((stdin, stdout, stderr)):
            os.dup2(fd, target)
            os.close(fd)
        threading.Thread(target=_exit_with_launcher, args=(launcher_alive,), daemon=True).start()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _adopt(request)
        code = _run_worker_script(request["argv"][0])
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)


def _adopt(request: dict[str, Any]) -> None:
    """What a fresh ``python model_service_worker.py ...`` would have: argv, environment, working
    directory, ``sys.path`` (script folder first), an unconfigured root logger, fresh seeds."""
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    argv = [str(part) for part in request["argv"]]
    sys.argv = argv
    sys.path[:] = [os.path.dirname(os.path.abspath(argv[0])), *request["path"]]
    tempfile: Any = sys.modules.get("tempfile")
    if tempfile is not None:
        tempfile.tempdir = None  # recomputed from the worker's TMPDIR
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def _run_worker_script(script: str) -> int:
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exit_:
        if exit_.code is None or isinstance(exit_.code, int):
            return int(exit_.code or 0)
        print(exit_.code, file=sys.stderr)
        return 1
    except BaseException:  # reported on the worker's stderr, as a plain worker would
        traceback.print_exc()
        return 1
    return 0


def _exit_with_launcher(fd: int) -> None:
    """The frontend stops a worker by killing its launcher (SIGKILL): follow it."""
    while os.read(fd, 1):
        pass
    os._exit(1)


if __name__ == "__main__":
    sys.exit(main())
