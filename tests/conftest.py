"""Fixtures every test layer shares: one real redis-server and one real Redis Cluster per test
session (per pytest-xdist worker), emptied between the tests or modules that use them, and
instances of their own for the fault tests that kill, stop, fail over, fill or reconfigure a
Redis. The update log and the graph in Redis are tested against the real thing, never a fake;
a missing redis-server fails the test, it never skips.

Which fixture to ask for:

- ``redis_server``: the shared server's database 1, empty for each test.
- ``single_redis``: the shared server's database 0, empty for each module (a module's fixtures
  load graphs into it once); graph URLs name a prefix in their path, so it is database 0.
- ``redis_cluster``: the shared cluster, empty for each module.
- ``own_redis_server`` (per test) and ``own_redis_cluster`` (per module): instances of their
  own, for a test that kills, stops, restarts, fails over, fills or reconfigures its Redis.

A test that kills a shared instance, fails one of its nodes over or changes its configuration
fails at teardown, naming what changed: it needs an instance of its own."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from tests.servers.redis_cluster import LocalCluster
from tests.servers.redis_server import MISSING, RedisServer, redis_server_binary
from tests.servers.shared_redis import SharedRedis

T = TypeVar("T")

_SERVER_DB, _SINGLE_DB = 1, 0


def _require_redis_server() -> None:
    if redis_server_binary() is None:
        pytest.fail(MISSING)


@pytest.fixture(scope="session")
def _shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedRedis]:
    _require_redis_server()
    server = RedisServer(tmp_path_factory.mktemp("shared-redis")).start()
    try:
        yield SharedRedis([server])
    finally:
        server.stop()


@pytest.fixture(scope="session")
def _shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedRedis]:
    _require_redis_server()
    cluster = LocalCluster(tmp_path_factory.mktemp("shared-cluster")).start()
    try:
        yield SharedRedis(cluster.nodes)
    finally:
        cluster.stop()


def _lend(shared: SharedRedis, lent: T, user: str, db: int | None = None) -> Iterator[T]:
    """Lends a shared instance empty (database ``db``, or all), checks that ``user`` left it
    as it was, and empties it again."""
    shared.flush(db)
    yield lent
    shared.check_unchanged(user)
    shared.flush(db)


@pytest.fixture()
def redis_server(
    _shared_server: SharedRedis, request: pytest.FixtureRequest
) -> Iterator[RedisServer]:
    """The session's redis-server (the shipped durable configuration), database 1, empty."""
    server = dataclasses.replace(_shared_server.nodes[0], db=_SERVER_DB)
    yield from _lend(_shared_server, server, request.node.nodeid, _SERVER_DB)


@pytest.fixture(scope="module")
def single_redis(
    _shared_server: SharedRedis, request: pytest.FixtureRequest
) -> Iterator[RedisServer]:
    """The session's redis-server, database 0, empty for this module."""
    server = dataclasses.replace(_shared_server.nodes[0], db=_SINGLE_DB)
    yield from _lend(_shared_server, server, request.node.nodeid, _SINGLE_DB)


@pytest.fixture(scope="module")
def redis_cluster(
    _shared_cluster: SharedRedis, request: pytest.FixtureRequest
) -> Iterator[LocalCluster]:
    """The session's Redis Cluster (three primaries, three replicas), empty for this module."""
    cluster = LocalCluster(_shared_cluster.nodes[0].home.parent, list(_shared_cluster.nodes))
    yield from _lend(_shared_cluster, cluster, request.node.nodeid)


@pytest.fixture()
def own_redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test's own with the shipped durable configuration, stopped by PID."""
    _require_redis_server()
    server = RedisServer(tmp_path / "redis").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def own_redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A Redis Cluster of this module's own, stopped by PID."""
    _require_redis_server()
    cluster = LocalCluster(tmp_path_factory.mktemp("cluster")).start()
    try:
        yield cluster
    finally:
        cluster.stop()
