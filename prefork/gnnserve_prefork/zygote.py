"""The zygote: imports torch and PyG once, then forks one TorchServe worker per launcher.

Forked workers share the imported modules' pages copy-on-write (``gc.freeze()`` keeps the
collector from touching them), so each further worker costs what it writes, not a whole
interpreter. The zygote lives as long as its TorchServe frontend; its workers are killed if it
dies (``PR_SET_PDEATHSIG``), which their launchers report to the frontend as a worker exit.
It forks nothing but the installed TorchServe's worker script, started with the arguments
TorchServe's frontend gives it, for launchers of its own user.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import gc
import importlib
import importlib.util
import logging
import os
import reprlib
import runpy
import select
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeGuard

from gnnserve_prefork.early import FRONTEND_WAIT_S, wait_for_frontend
from gnnserve_prefork.protocol import (
    Refused,
    check_peer,
    close_all,
    receive_request,
    send_line,
    zygote_address,
)

logger = logging.getLogger("gnnserve_prefork")

IMPORTS_ENV = "GNNSERVE_PREFORK_IMPORTS"
# What every gnnserve worker imports at start: torch, PyG and TorchServe's own, and numba
# started (numba_ready: the sampler's compiled hops then load in 0.05 s). Captum waits for a
# worker's first explanation (handler/explain/ego_explain.py): it is 0.3 s of every start.
DEFAULT_IMPORTS = (
    "torch,torch_geometric,numpy,yaml,psutil,ts.torch_handler.base_handler,ts.model_service_worker,"
    "gnnserve_prefork.numba_ready"
)
_PR_SET_PDEATHSIG = 1
_POLL_S = 0.5
# How TorchServe 0.12's frontend starts a Python worker (WorkerLifeCycle.startWorkerPython):
#   <ts home>/ts/model_service_worker.py --sock-type unix --sock-name PATH
#       --metrics-config PATH [--async]
# with ``--sock-type tcp --port N`` instead where Unix sockets are not used.
_ADDRESS_FLAG = {"unix": "--sock-name", "tcp": "--port"}


@dataclass(frozen=True)
class WorkerRequest:
    """What a launcher hands over, checked: the worker runs with these, and nothing else."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    path: list[str]


@dataclass(frozen=True)
class Zygote:
    """What a forked worker must close (the listening socket, the lock that makes this the
    frontend's only zygote) and the only script it may run."""

    listener: socket.socket
    lock: IO[bytes]
    script: str

    def close(self) -> None:
        self.listener.close()
        self.lock.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    frontend_given = parser.add_mutually_exclusive_group(required=True)
    frontend_given.add_argument("--frontend-pid", type=int, help="the TorchServe frontend")
    frontend_given.add_argument(
        "--frontend-pid-file",
        type=Path,
        help="wait for TorchServe's CLI to write the frontend's PID there (early.py)",
    )
    parser.add_argument(
        "--newer-than", type=float, default=0.0, help="Unix time before which the file is stale"
    )
    parser.add_argument(
        "--imports",
        default=os.environ.get(IMPORTS_ENV, DEFAULT_IMPORTS),
        help=f"comma-separated modules imported before forking (env {IMPORTS_ENV})",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(format="%(asctime)s zygote %(process)d %(message)s", level=logging.INFO)
    if args.frontend_pid_file is not None:
        args.frontend_pid = wait_for_frontend(
            args.frontend_pid_file, args.newer_than, FRONTEND_WAIT_S
        )
        if args.frontend_pid is None:
            logger.info("no frontend wrote %s; exiting", args.frontend_pid_file)
            return 0
        logger.info("started with frontend %d, before its first worker", args.frontend_pid)
    frontend = Frontend(args.frontend_pid)
    try:
        script = worker_script()
        address = zygote_address(args.frontend_pid)
    except Refused as refusal:
        logger.error("refusing to start: %s", refusal)
        return 1
    with _first_zygote(address) as lock:
        if lock is None:
            return 0  # another launcher started this frontend's zygote first
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(address)
        listener.listen(64)
        return _prepare_and_serve(args, frontend, Zygote(listener, lock, script))


def worker_script() -> str:
    """The real path of the installed TorchServe's worker script, found the way the workers'
    interpreter finds ``ts``: the only code this zygote runs in what it forks."""
    spec = importlib.util.find_spec("ts")
    if spec is None or spec.origin is None:
        raise Refused("TorchServe (the ts package) is not installed for this interpreter")
    return os.path.realpath(Path(spec.origin).parent / "model_service_worker.py")


@contextlib.contextmanager
def _first_zygote(address: str) -> Iterator[IO[bytes] | None]:
    """Holds ``<address>.lock`` while this zygote serves (None: another one holds it) and removes
    the socket and the lock at the end. Under the lock a socket file left by a zygote that was
    killed is stale and is replaced."""
    lock_path = f"{address}.lock"
    with open(lock_path, "ab") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield None
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(address)
        try:
            yield lock
        finally:
            for path in (address, lock_path):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)


def _prepare_and_serve(args: argparse.Namespace, frontend: Frontend, zygote: Zygote) -> int:
    """Detaches, imports, tells the launcher that started it, then serves until the frontend
    exits."""
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
    serve(zygote, frontend)
    logger.info("frontend %d is gone; exiting", args.frontend_pid)
    return 0


def serve(zygote: Zygote, frontend: Frontend) -> None:
    """Forks a worker per launcher and reports each worker's exit to its launcher, until the
    frontend exits. Single-threaded: forking from a threaded process is unsafe."""
    launchers: dict[int, socket.socket] = {}
    while frontend.alive():
        readable, _, _ = select.select([zygote.listener], [], [], _POLL_S)
        _reap(launchers)
        if readable:
            accept(zygote, launchers)


def accept(zygote: Zygote, launchers: dict[int, socket.socket]) -> None:
    """Forks the worker that one launcher asks for, or refuses it with an ``error`` answer."""
    conn, _ = zygote.listener.accept()
    try:
        request, fds = _receive(conn, zygote.script)
    except Refused as refusal:
        logger.warning("refused a launcher: %s", refusal)
        with contextlib.suppress(OSError):
            send_line(conn, {"error": str(refusal)})
        conn.close()
        return
    except (OSError, ValueError) as error:
        logger.warning("dropped a launcher: %s", error)
        conn.close()
        return
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _become_worker(request, zygote, fds, [conn, *launchers.values()])
    close_all(fds)
    try:
        send_line(conn, {"pid": pid})
    except OSError:
        logger.warning("launcher of worker %d went away before it started", pid)
    launchers[pid] = conn
    logger.info("forked worker %d for %s", pid, request.cwd)


def _receive(conn: socket.socket, script: str) -> tuple[WorkerRequest, list[int]]:
    """One launcher's request, from a peer of this user, for TorchServe's worker only."""
    conn.settimeout(10)
    pid = check_peer(conn, "the launcher")
    raw, fds = receive_request(conn)
    try:
        return check_request(raw, script), fds
    except Refused as refusal:
        close_all(fds)
        raise Refused(f"pid {pid}: {refusal}") from None


def check_request(raw: dict[str, Any], script: str) -> WorkerRequest:
    """A request with the types the worker needs and TorchServe's worker command line."""
    argv, env, cwd, path = (raw.get(key) for key in ("argv", "env", "cwd", "path"))
    if not (
        _strings(argv)
        and isinstance(env, dict)
        and _strings([*env, *env.values()])
        and isinstance(cwd, str)
        and _strings(path)
    ):
        raise Refused("a malformed worker request")
    check_worker_argv(argv, script)
    return WorkerRequest(argv=argv, env=env, cwd=cwd, path=path)


def check_worker_argv(argv: list[str], script: str) -> None:
    """Refuses anything but ``script`` (compared by real path) with the arguments TorchServe's
    frontend passes: a same-uid peer must not get other code run in a forked worker."""
    if not argv or not os.path.isabs(argv[0]) or os.path.realpath(argv[0]) != script:
        raise Refused(f"{reprlib.repr(argv[:1])} is not TorchServe's worker script {script}")
    args = argv[1:-1] if argv[-1] == "--async" else argv[1:]
    if not (
        len(args) == 6
        and args[0] == "--sock-type"
        and args[2] == _ADDRESS_FLAG.get(args[1])
        and args[4] == "--metrics-config"
        and all(value and not value.startswith("-") for value in (args[3], args[5]))
        and (args[1] != "tcp" or args[3].isdigit())
    ):
        raise Refused(
            f"arguments {reprlib.repr(argv[1:])} are not those TorchServe starts its worker with"
        )


def _strings(value: object) -> TypeGuard[list[str]]:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


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


def _become_worker(
    request: WorkerRequest, zygote: Zygote, fds: list[int], launchers: list[socket.socket]
) -> None:
    """In the forked child: drop the zygote's files, take over the launcher's streams,
    environment and paths, run TorchServe's worker script as ``__main__``, and never return
    into the zygote's loop."""
    code = 1
    try:
        zygote.close()
        for sock in launchers:
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
        code = _run_worker_script(zygote.script)
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)


def _adopt(request: WorkerRequest) -> None:
    """What a fresh ``python model_service_worker.py ...`` would have: argv, environment, working
    directory, ``sys.path`` (script folder first), an unconfigured root logger, fresh seeds."""
    os.environ.clear()
    os.environ.update(request.env)
    os.chdir(request.cwd)
    sys.argv = list(request.argv)
    sys.path[:] = [os.path.dirname(request.argv[0]), *request.path]
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
