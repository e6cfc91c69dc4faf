"""The session's shared Redis instances (tests/conftest.py, tests/servers/shared_redis.py): each
test finds its database empty, a module finds the cluster empty on every node, flushing one database
keeps the others, and a test that kills or reconfigures a shared instance fails naming what it
changed and the fixture to use instead."""

from __future__ import annotations

import dataclasses

import pytest
import redis

from graph_assets.remote.connect import connect
from tests.servers.redis_cluster import LocalCluster
from tests.servers.redis_server import RedisServer
from tests.servers.shared_redis import SharedRedis


@pytest.mark.parametrize("run", [1, 2])
def test_each_test_finds_the_shared_database_empty(redis_server: RedisServer, run: int) -> None:
    """The second run would find the first's key if the database were not emptied between."""
    client = redis_server.client()
    try:
        assert client.dbsize() == 0
        client.set(f"left-behind-by-run-{run}", b"x")
    finally:
        client.close()


def test_the_module_finds_the_cluster_empty_and_a_flush_empties_every_node(
    redis_cluster: LocalCluster, _shared_cluster: SharedRedis
) -> None:
    def sizes() -> list[int]:
        counts = []
        for node in redis_cluster.nodes:
            client = node.client()
            try:
                counts.append(int(client.dbsize()))
            finally:
                client.close()
        return counts

    assert sizes() == [0] * 6
    client = connect(redis_cluster.url, 2000)
    try:
        for i in range(60):  # keys in every primary's slots
            client.set(f"key-{i}", b"x")
    finally:
        client.close()
    assert sum(sizes()) == 2 * 60  # each key on its primary and its replica
    _shared_cluster.flush()
    assert sizes() == [0] * 6  # the replicas too: the flush waits for them


def test_flushing_one_database_keeps_the_others(own_redis_server: RedisServer) -> None:
    shared = SharedRedis([own_redis_server])
    zero, one = (dataclasses.replace(own_redis_server, db=db).client() for db in (0, 1))
    try:
        zero.set("k", b"0")
        one.set("k", b"1")
        shared.flush(1)
        assert (zero.get("k"), one.dbsize()) == (b"0", 0)
        shared.flush()
        assert zero.dbsize() == 0
    finally:
        zero.close()
        one.close()


def test_a_changed_setting_fails_naming_it_until_restored(own_redis_server: RedisServer) -> None:
    shared = SharedRedis([own_redis_server])
    admin = own_redis_server.client()
    admin.config_set("maxmemory", "1000000")
    port = own_redis_server.port
    with pytest.raises(pytest.fail.Exception) as changed:
        shared.check_unchanged("test_x")
    assert str(changed.value) == (
        f"test_x changed settings of the shared redis-server on port {port} "
        "(name: (before, after)) {'maxmemory': ('0', '1000000')}: restore them in a finally, "
        "or ask for own_redis_server or own_redis_cluster instead"
    )
    admin.config_set("maxmemory", "0")
    admin.close()
    shared.check_unchanged("test_x")  # restored: passes


def test_a_password_set_on_it_fails_naming_the_fixture_to_use(
    own_redis_server: RedisServer,
) -> None:
    shared = SharedRedis([own_redis_server])
    admin = own_redis_server.client()
    admin.config_set("requirepass", "a-password")
    admin.close()
    with pytest.raises(pytest.fail.Exception, match=r"does not answer .*own_redis_server"):
        shared.check_unchanged("test_x")
    with pytest.raises(redis.AuthenticationError):
        own_redis_server.client().ping()


@pytest.mark.parametrize("fault", ["kill", "restart"])
def test_a_killed_or_restarted_server_fails_naming_the_fixture_to_use(
    own_redis_server: RedisServer, fault: str
) -> None:
    shared = SharedRedis([own_redis_server])
    own_redis_server.kill()
    port = own_redis_server.port
    if fault == "kill":
        message = f"the shared redis-server on port {port} was stopped or killed"
    else:
        own_redis_server.start()
        message = f"test_x restarted the shared redis-server on port {port}"
    with pytest.raises(pytest.fail.Exception) as failed:
        shared.check_unchanged("test_x")
    assert str(failed.value) == (
        f"{message}: ask for own_redis_server or own_redis_cluster instead"
    )
