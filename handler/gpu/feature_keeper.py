"""One copy of a graph's stored features per GPU, shared by every worker on it.

TorchServe's workers are separate processes, so features each worker copied to its GPU would
take that memory once per worker. Instead the first worker on a GPU starts a keeper: a process
of its own session (a worker's crash or restart does not end it) that copies the features to
the GPU once and hands every worker on that GPU a CUDA IPC handle of them over a Unix socket
(handler.gpu.ipc_handle: plain JSON, never a pickle). Each worker keeps
its connection open: the keeper counts them and exits once the last one has been gone for
``idle_s`` seconds. A worker whose keeper is gone can no longer trust the memory it maps, so it
ends (``KeeperLost``) and TorchServe starts a fresh one, which starts a fresh keeper.

The socket is in Linux's abstract namespace, named from TorchServe's temp dir (one per
server), the graph's checksum and the device, so two servers or two graphs never share one.
An abstract name has no file permissions, so each end checks the other's user (SO_PEERCRED):
a name taken first by another user's process is refused, never trusted.
On a CPU "device" (tests) tensors are shared through shared-memory files instead.

``python -m handler.gpu.feature_keeper --store DIR --checksum C --device cuda:0 --name N``
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import logging
import os
import selectors
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
import torch.multiprocessing

from graph_assets.stored.store import GraphStore, open_store
from handler.gpu.device_copy import copy_to_device
from handler.gpu.ipc_handle import BadHandle, describe, open_shared

logger = logging.getLogger(__name__)

_LENGTH = struct.Struct("!Q")
_CREDENTIALS = struct.Struct("3i")  # SO_PEERCRED: pid, uid, gid
_MAX_MESSAGE = 1 << 16
START_TIMEOUT_S = 120.0  # copying tens of GB of features to a GPU takes a while
# A keeper listens only once its features are on the device and answers as it accepts: one
# that has not answered in this time is stopped (SIGSTOP) or stuck.
ANSWER_TIMEOUT_S = 10.0
IDLE_S = 30.0


class KeeperLost(RuntimeError):
    """The keeper of this worker's shared features ended: their memory is no longer held."""


def keeper_name(checksum: str, device: torch.device, temp_dir: str | None = None) -> str:
    """The abstract socket name of the keeper for ``checksum`` on ``device`` under this
    server's temp dir (TorchServe's ``TEMP``)."""
    where = temp_dir if temp_dir is not None else tempfile.gettempdir()
    key = hashlib.sha256(f"{os.path.realpath(where)}|{checksum}|{device}".encode()).hexdigest()
    return f"gnnserve-features-{key[:24]}"


def _address(name: str) -> str:
    return "\0" + name


def _share_on(device: torch.device) -> None:
    """CPU tensors go through shared-memory files, which unrelated processes can open."""
    if device.type == "cpu":
        torch.multiprocessing.set_sharing_strategy("file_system")


class SharedFeatures:
    """A worker's view of the features its GPU's keeper holds (``table``), and the
    connection that keeps it counted."""

    def __init__(self, table: torch.Tensor, connection: socket.socket) -> None:
        self.table = table
        self._connection = connection
        self._lost = threading.Event()
        threading.Thread(target=self._watch, name="feature-keeper-watch", daemon=True).start()

    def _watch(self) -> None:
        with contextlib.suppress(OSError):
            while self._connection.recv(1):
                pass
        self._lost.set()

    def check(self) -> None:
        """Raises KeeperLost once the keeper has gone (call before reading ``table``)."""
        if self._lost.is_set():
            raise KeeperLost(
                "the process that holds this GPU's shared graph features ended; this worker "
                "ends so that TorchServe starts a fresh one (and a fresh holder)"
            )

    def close(self) -> None:
        """Leaves the keeper's count (shutdown first: it also wakes the watching thread)."""
        with contextlib.suppress(OSError):
            self._connection.shutdown(socket.SHUT_RDWR)
        self._connection.close()


def attach(
    store: GraphStore,
    device: torch.device,
    temp_dir: str | None = None,
    timeout_s: float = START_TIMEOUT_S,
    idle_s: float = IDLE_S,
    answer_timeout_s: float = ANSWER_TIMEOUT_S,
) -> SharedFeatures:
    """``store``'s features on ``device``, from their keeper, started here when none runs (one
    start at a time, under a lock file). KeeperLost when the keeper does not hand over, within
    ``answer_timeout_s``, a matrix of the store's shape, strides and dtype."""
    _share_on(device)
    name = keeper_name(store.checksum, device, temp_dir)
    connection = _connect(name)
    if connection is None:
        lock_dir = Path(temp_dir if temp_dir is not None else tempfile.gettempdir())
        with open(lock_dir / f"{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            connection = _connect(name)
            if connection is None:
                process = _start(store.path, store.checksum, device, name, idle_s)
                connection = _wait_for(name, process, timeout_s)
    try:
        _check_same_user(connection)
        table = open_shared(_receive(connection, time.monotonic() + answer_timeout_s))
        _check_matches(table, store)
    except TimeoutError:
        connection.close()
        raise KeeperLost(
            f"the features' keeper {name} did not hand them over within "
            f"{answer_timeout_s:g} s (its process is stopped or stuck)"
        ) from None
    except (OSError, EOFError, BadHandle) as error:
        connection.close()
        raise KeeperLost(f"the features' keeper {name} did not hand them over: {error}") from None
    connection.settimeout(None)  # SharedFeatures waits on it for as long as the keeper lives
    return SharedFeatures(table, connection)


def _check_matches(table: torch.Tensor, store: GraphStore) -> None:
    """BadHandle unless ``table`` is laid out as the store's features are copied to a device:
    float32, their shape, row-major (a zero stride would read one row for all)."""
    shape = tuple(store.features.shape)
    stride = torch.empty(shape, device="meta").stride()
    got = (table.dtype, tuple(table.shape), table.stride())
    if got != (torch.float32, shape, stride):
        raise BadHandle(
            f"the keeper's matrix is {table.dtype} {tuple(table.shape)} with strides "
            f"{table.stride()}; the store's features are torch.float32 {shape} with strides "
            f"{stride}"
        )


def _connect(name: str) -> socket.socket | None:
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(_address(name))
    except (ConnectionRefusedError, FileNotFoundError):
        connection.close()
        return None
    return connection


def _start(
    store_dir: Path, checksum: str, device: torch.device, name: str, idle_s: float
) -> subprocess.Popen:
    """The keeper, in a session of its own, with this worker's import path."""
    here = Path(__file__).resolve().parents[2]  # the folder that holds handler/ and graph_assets/
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here), *sys.path[1:]])}
    command = [sys.executable, "-m", "handler.gpu.feature_keeper", "--store", str(store_dir)]
    command += ["--checksum", checksum, "--device", str(device), "--name", name]
    command += ["--idle-s", str(idle_s)]
    return subprocess.Popen(
        command,
        env=env,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=None,  # the keeper's errors go where the worker's do: TorchServe's log
    )


def _wait_for(name: str, process: subprocess.Popen, timeout_s: float) -> socket.socket:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        connection = _connect(name)
        if connection is not None:
            return connection
        if process.poll() is not None:
            raise KeeperLost(f"the features' keeper exited with status {process.returncode}")
        time.sleep(0.05)
    process.kill()
    raise KeeperLost(f"the features' keeper did not listen within {timeout_s:.0f} s")


def _check_same_user(connection: socket.socket) -> None:
    """PermissionError unless the process at the other end runs as this process's user."""
    _, uid, _ = _CREDENTIALS.unpack(
        connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDENTIALS.size)
    )
    if uid != os.getuid():
        raise PermissionError(f"the socket's other end runs as uid {uid}, not {os.getuid()}")


def _receive(connection: socket.socket, deadline: float) -> bytes:
    """The keeper's one message, by ``deadline`` (``time.monotonic``) or TimeoutError."""
    header = _read_exactly(connection, _LENGTH.size, deadline)
    (length,) = _LENGTH.unpack(header)
    if length > _MAX_MESSAGE:
        raise EOFError(f"a {length}-byte description is not one the keeper sends")
    return _read_exactly(connection, length, deadline)


def _read_exactly(connection: socket.socket, size: int, deadline: float) -> bytes:
    chunks, left = [], size
    while left:
        left_s = deadline - time.monotonic()
        if left_s <= 0:
            raise TimeoutError("timed out")
        connection.settimeout(left_s)
        chunk = connection.recv(left)
        if not chunk:
            raise EOFError("the connection closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def serve(table: torch.Tensor, name: str, idle_s: float = IDLE_S) -> None:
    """Hands ``table`` to every worker that connects, until none has been connected for
    ``idle_s`` seconds."""
    payload = describe(table)
    message = _LENGTH.pack(len(payload)) + payload
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(_address(name))
    listener.listen(64)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    clients = 0
    idle_since = time.monotonic()
    while clients or time.monotonic() - idle_since < idle_s:
        for key, _ in selector.select(timeout=1.0):
            if key.fileobj is listener:
                clients += _hand_over(listener, message, selector)
                continue
            gone = key.fileobj
            assert isinstance(gone, socket.socket)
            with contextlib.suppress(OSError):
                if gone.recv(1):
                    continue  # workers send nothing; ignore it
            selector.unregister(gone)
            gone.close()
            clients -= 1
            if not clients:
                idle_since = time.monotonic()
    listener.close()


def _hand_over(listener: socket.socket, message: bytes, selector: selectors.BaseSelector) -> int:
    """Accepts one worker and sends it ``message``: 1 when it is counted, 0 when it was
    refused or was gone before the message reached it. A peer that connects and closes at
    once must not end the keeper: every worker attached to it would end too."""
    worker, _ = listener.accept()
    try:
        _check_same_user(worker)
        worker.sendall(message)
    except PermissionError as refused:
        logger.warning("refused a connection: %s", refused)
        worker.close()
        return 0
    except OSError as gone:
        logger.warning("a connection closed before it got the features (%s); serving on", gone)
        worker.close()
        return 0
    selector.register(worker, selectors.EVENT_READ)
    return 1


def load_table(store_dir: Path, checksum: str, device: torch.device) -> torch.Tensor:
    """The store's feature matrix copied to ``device`` (the store must be the one named)."""
    store = open_store(store_dir, verify_checksum=False)
    if store.checksum != checksum:
        raise SystemExit(f"{store_dir} has checksum {store.checksum}, not {checksum}")
    return copy_to_device(store.features, device)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--store", type=Path, required=True, help="the graph store")
    parser.add_argument("--checksum", required=True, help="the checksum it must have")
    parser.add_argument("--device", required=True, help="cuda:N (cpu in tests)")
    parser.add_argument("--name", required=True, help="abstract socket name")
    parser.add_argument("--idle-s", type=float, default=IDLE_S, help="exit after idle")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="feature keeper %(process)d: %(message)s")
    device = torch.device(args.device)
    _share_on(device)
    table = load_table(args.store, args.checksum, device)
    logger.info("holding %.0f MiB of features on %s", table.nbytes / 2**20, device)
    serve(table, args.name, args.idle_s)


if __name__ == "__main__":
    main()
