"""Ports for the servers tests start: never from the kernel's ephemeral range (an outgoing
connection may take such a port before the server binds it), never one already bound, and never
the same one twice in a process."""

from __future__ import annotations

import socket

import pytest

from tests.servers import ports
from tests.servers.ports import free_ports


def test_ports_are_distinct_free_and_below_the_ephemeral_range() -> None:
    drawn = free_ports(50) + free_ports(50)
    assert len(set(drawn)) == 100
    assert all(ports.LOWEST <= port < ports._ephemeral_start() for port in drawn)
    for port in drawn[:5]:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", port))


def test_a_bound_port_is_skipped() -> None:
    (port,) = free_ports(1)
    with socket.socket() as held:
        held.bind(("127.0.0.1", port + 1))
        held.listen()
        assert port + 1 not in free_ports(3)


def test_each_xdist_worker_draws_from_its_own_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    firsts = {}
    for worker in ("gw0", "gw1", "gw2"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        firsts[worker] = next(ports._candidates())
    width = (ports._ephemeral_start() - ports.LOWEST) // ports.SLICES
    slices = {worker: (port - ports.LOWEST) // width for worker, port in firsts.items()}
    assert slices == {"gw0": 0, "gw1": 1, "gw2": 2}
