"""Loopback ports for the servers the tests and benchmarks start.

A port the kernel hands out for ``bind(port 0)`` comes from the ephemeral range, the same range
it draws the source port of every outgoing connection from. Between picking such a port and the
server binding it, any outgoing connection (a worker dialling Redis while TorchServe loads its
models, before it opens its own ports) may take it, and the server then dies on "address already
in use". So ports come from below the ephemeral range, which the kernel never hands out on its
own; each pytest-xdist worker draws from its own slice, and a process never hands out the same
port twice until its slice wraps, so a port a stopped server just released is not reused while
its connections linger."""

from __future__ import annotations

import itertools
import os
import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

LOWEST = 20000  # above the well-known defaults (Redis 6379, TorchServe 8080-8082, 7070-7071)
SLICES = 8  # pytest-xdist workers get disjoint slices (gw0 .. gw7, wrapping beyond)
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL_START = 32768


def _ephemeral_start() -> int:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return DEFAULT_EPHEMERAL_START


def _worker_index() -> int:
    match = re.fullmatch(r"gw(\d+)", os.environ.get("PYTEST_XDIST_WORKER", ""))
    return int(match.group(1)) % SLICES if match else 0


def _candidates() -> Iterator[int]:
    """This process's slice, endlessly, starting at a place of its PID so that two processes of
    one slice (a test and a benchmark it runs) rarely walk the same ports in step."""
    end = max(_ephemeral_start(), LOWEST + SLICES * 64)
    width = (end - LOWEST) // SLICES
    first = LOWEST + _worker_index() * width
    start = os.getpid() % width
    return (first + (start + step) % width for step in itertools.count())


_lock = threading.Lock()
_next: Iterator[int] | None = None


def _is_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports free right now, none of them ephemeral."""
    global _next
    with _lock:
        if _next is None:
            _next = _candidates()
        ports: list[int] = []
        for _ in range(100_000):
            port = next(_next)
            if _is_free(port):
                ports.append(port)
                if len(ports) == count:
                    return ports
        raise RuntimeError("no free loopback port below the ephemeral range")
