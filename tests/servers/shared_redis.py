"""The session's shared Redis instances (tests/conftest.py): emptied between their users, and
checked after each that it left them as it found them (running, same roles, same settings), so
that no test sees another's keys and a fault test run on them by mistake fails, naming the fix,
instead of breaking the tests after it."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import redis

from tests.servers.redis_server import RedisServer

_OWN = "ask for own_redis_server or own_redis_cluster instead"


@dataclasses.dataclass(frozen=True)
class NodeState:
    """What a node looked like: its PID, role (``master`` or ``slave``), how many replicas it
    feeds, and every setting CONFIG GET reports."""

    pid: int
    role: str
    replicas: int
    config: dict[str, str]


def node_state(node: RedisServer) -> NodeState:
    """``node``'s state now; fails naming the node when it does not answer."""
    if node.process is None or node.process.poll() is not None:
        pytest.fail(f"the shared redis-server on port {node.port} was stopped or killed: {_OWN}")
    client = node.client()
    try:
        replication: dict[str, Any] = client.info("replication")
        config = {str(key): str(value) for key, value in client.config_get("*").items()}
    except redis.RedisError as error:
        pytest.fail(
            f"the shared redis-server on port {node.port} does not answer ({error}): {_OWN}"
        )
    finally:
        client.close()
    role = str(replication["role"])
    return NodeState(node.process.pid, role, int(replication["connected_slaves"]), config)


@dataclasses.dataclass
class SharedRedis:
    """Shared redis-server processes (one plain server, or a cluster's nodes) and their state
    when they started."""

    nodes: list[RedisServer]
    started: dict[int, NodeState] = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.started = {node.port: node_state(node) for node in self.nodes}

    def check_unchanged(self, user: str) -> None:
        """Fails naming what ``user`` changed: a node stopped, killed or restarted, a failover,
        a setting."""
        for node in self.nodes:
            before, now = self.started[node.port], node_state(node)
            if now.pid != before.pid:
                pytest.fail(f"{user} restarted the shared redis-server on port {node.port}: {_OWN}")
            if now.role != before.role:
                pytest.fail(
                    f"{user} made the shared node on port {node.port} a {now.role} "
                    f"(it was a {before.role}): {_OWN}"
                )
            changed = {
                name: (before.config.get(name), value)
                for name, value in now.config.items()
                if before.config.get(name) != value
            }
            if changed:
                pytest.fail(
                    f"{user} changed settings of the shared redis-server on port {node.port} "
                    f"(name: (before, after)) {changed}: restore them in a finally, or {_OWN}"
                )

    def flush(self, db: int | None = None) -> None:
        """Empties database ``db`` of every primary (None: every database), and waits until
        each primary's replicas have applied it."""
        for node in self.nodes:
            state = self.started[node.port]
            if state.role != "master":
                continue
            client = (node if db is None else dataclasses.replace(node, db=db)).client()
            try:
                if db is None:
                    client.flushall()
                else:
                    client.flushdb()
                synced = int(client.execute_command("WAIT", state.replicas, 5000))
            except redis.RedisError as error:
                pytest.fail(f"could not empty the shared redis-server on port {node.port}: {error}")
            finally:
                client.close()
            if synced < state.replicas:
                pytest.fail(
                    f"{synced} of the {state.replicas} replicas of the shared node on port "
                    f"{node.port} applied its FLUSH within 5 s"
                )
