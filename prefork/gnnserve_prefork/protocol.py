"""The launcher <-> zygote wire format: newline-terminated JSON over a Unix stream socket, with
the worker's standard streams and its liveness pipe passed as file descriptors."""

from __future__ import annotations

import array
import json
import os
import socket
from typing import Any

# The launcher's stdin, stdout, stderr (TorchServe's pipes) and the read end of its liveness pipe.
PASSED_FDS = 4
_MAX_MESSAGE = 1 << 20


def zygote_address(frontend_pid: int) -> str:
    """One zygote per TorchServe frontend and user, in the abstract namespace (no file to clean
    up, no path length limit); the zygote checks each peer's uid itself."""
    return f"\0gnnserve-prefork-{os.getuid()}-{frontend_pid}"


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
            _close_all(fds)
            raise ConnectionError("the launcher closed the connection mid-request")
        chunks.append(data)
        size += len(data)
        if size > _MAX_MESSAGE:
            _close_all(fds)
            raise ValueError(f"a worker request over {_MAX_MESSAGE} bytes")
    if len(fds) != PASSED_FDS:
        _close_all(fds)
        raise ValueError(
            f"a worker request needs {PASSED_FDS} descriptors, it came with {len(fds)}"
        )
    return json.loads(b"".join(chunks)), fds


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


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)
