"""The launcher <-> zygote wire format and rendezvous: newline-terminated JSON over a Unix stream
socket in a directory private to the serving user, with the worker's standard streams and its
liveness pipe passed as file descriptors. Both ends check that the other runs as the same user."""

from __future__ import annotations

import array
import contextlib
import json
import os
import socket
import stat
import struct
from pathlib import Path
from typing import Any

# The launcher's stdin, stdout, stderr (TorchServe's pipes) and the read end of its liveness pipe.
PASSED_FDS = 4
_MAX_MESSAGE = 1 << 20
_MAX_SOCKET_PATH = 107  # sun_path holds 108 bytes, the last one a NUL
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class Refused(Exception):
    """A check that keeps other users, and code other than TorchServe's worker, away from the
    zygote failed; the message says which, in one line."""


def socket_dir() -> Path:
    """``$TMPDIR/gnnserve-prefork-<uid>`` (``/tmp`` without TMPDIR), created 0700: only this user
    can reach the sockets in it, so nobody else can listen in the zygote's place."""
    base = Path(os.path.abspath(os.environ.get("TMPDIR") or "/tmp"))
    for part in (base, *base.parents):
        if os.path.islink(part):
            raise Refused(f"the socket directory's parent {part} is a symbolic link")
    path = base / f"gnnserve-prefork-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    _check_private(path)
    return path


def _check_private(path: Path) -> None:
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):  # lstat: a symbolic link is not a directory here
        raise Refused(f"the socket directory {path} is not a directory (or is a symbolic link)")
    if info.st_uid != os.getuid():
        raise Refused(
            f"the socket directory {path} is owned by uid {info.st_uid}, not {os.getuid()}"
        )
    if stat.S_IMODE(info.st_mode) != 0o700:
        raise Refused(
            f"the socket directory {path} has mode {stat.S_IMODE(info.st_mode):04o}, not 0700"
        )


def zygote_address(frontend_pid: int) -> str:
    """One zygote per TorchServe frontend and user: ``<socket_dir()>/<frontend PID>.sock``."""
    address = str(socket_dir() / f"{frontend_pid}.sock")
    if len(os.fsencode(address)) > _MAX_SOCKET_PATH:
        raise Refused(
            f"the socket path {address} is longer than {_MAX_SOCKET_PATH} bytes (set a shorter "
            "TMPDIR)"
        )
    return address


def check_peer(sock: socket.socket, peer: str) -> int:
    """Refuses a peer that runs as another user (the kernel's SO_PEERCRED, not its word);
    returns its PID for the log."""
    pid, uid, _ = _PEERCRED.unpack(
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    )
    if uid != os.getuid():
        raise Refused(f"{peer} (pid {pid}) runs as uid {uid}, not {os.getuid()}")
    return pid


def send_request(sock: socket.socket, request: dict[str, Any], fds: list[int]) -> None:
    """Sends one worker request and the descriptors it runs on, in a single message."""
    payload = json.dumps(request).encode() + b"\n"
    if len(payload) > _MAX_MESSAGE:
        raise ValueError(f"the worker request is {len(payload)} bytes; the limit is {_MAX_MESSAGE}")
    rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
    sock.sendmsg([payload], rights)


def receive_request(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """Reads one worker request and takes ownership of the descriptors that came with it."""
    fds: list[int] = []
    chunks: list[bytes] = []
    size = 0
    while not chunks or not chunks[-1].endswith(b"\n"):
        data, ancillary, _, _ = conn.recvmsg(65536, socket.CMSG_SPACE(PASSED_FDS * 4))
        for level, kind, raw in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                received = array.array("i")
                received.frombytes(raw[: len(raw) - len(raw) % received.itemsize])
                fds.extend(received)
        if not data:
            close_all(fds)
            raise ConnectionError("the launcher closed the connection mid-request")
        chunks.append(data)
        size += len(data)
        if size > _MAX_MESSAGE:
            close_all(fds)
            raise ValueError(f"a worker request over {_MAX_MESSAGE} bytes")
    if len(fds) != PASSED_FDS:
        close_all(fds)
        raise ValueError(
            f"a worker request needs {PASSED_FDS} descriptors, it came with {len(fds)}"
        )
    try:
        request = json.loads(b"".join(chunks))
        if not isinstance(request, dict):
            raise ValueError("a worker request that is not a JSON object")
    except ValueError:
        close_all(fds)
        raise
    return request, fds


def send_line(conn: socket.socket, message: dict[str, Any]) -> None:
    conn.sendall(json.dumps(message).encode() + b"\n")


class LineReader:
    """Reads newline-terminated JSON messages from a socket."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buffer = b""

    def next(self) -> dict[str, Any] | None:
        """The next message, or None once the peer has closed the connection."""
        while b"\n" not in self._buffer:
            data = self._sock.recv(4096)
            if not data:
                return None
            self._buffer += data
        line, self._buffer = self._buffer.split(b"\n", 1)
        message = json.loads(line)
        if not isinstance(message, dict):
            raise ValueError(f"expected a JSON object from the zygote, got {line[:80]!r}")
        return message


def close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)
