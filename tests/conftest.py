"""Fixtures every test layer shares: a real redis-server (the shared update log is tested
against the real thing, never a fake; a missing redis-server fails the test, it never skips)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.harness.redis_server import MISSING, RedisServer, redis_server_binary


@pytest.fixture()
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of its own with the shipped durable configuration, stopped by PID."""
    if redis_server_binary() is None:
        pytest.fail(MISSING)
    server = RedisServer(tmp_path / "redis").start()
    try:
        yield server
    finally:
        server.stop()
