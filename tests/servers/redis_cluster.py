"""A real Redis Cluster for the tests and the benchmarks: three primaries and three
replicas on free loopback ports, each node a `RedisServer` (tests/servers/redis_server.py) with
its own directory and cluster configuration, joined by ``redis-cli --cluster create``, stopped
by PID."""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from tests.servers.ports import free_ports
from tests.servers.redis_server import MISSING, RedisServer

PRIMARIES, REPLICAS_PER_PRIMARY = 3, 1
# What a cluster node needs beyond a plain server: cluster mode, its bus on a port of its own
# (the default, port + 10000, may be past 65535 for an ephemeral port), a short failure
# detection, replicas synced at once (not after the default 5 s wait), and no persistence (the
# tests reload what they need) nor eviction.
_NODE_CONFIG = """\
cluster-enabled yes
cluster-config-file nodes.conf
cluster-port {bus_port}
cluster-node-timeout 2000
repl-diskless-sync-delay 0
appendonly no
save ""
maxmemory-policy noeviction
"""


@dataclass
class LocalCluster:
    """Six cluster nodes under ``home`` (``node<i>/``); ``url`` reaches the first primary,
    from which a cluster client discovers the others."""

    home: Path
    nodes: list[RedisServer] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.nodes[0].port}"

    def start(self, timeout_s: float = 60.0) -> LocalCluster:
        """Starts the nodes, joins them (``--cluster-replicas 1``) and waits until every node
        reports ``cluster_state:ok`` with all six known and every replica is in sync; stops
        what it started if that fails."""
        cli = shutil.which("redis-cli")
        if cli is None:
            raise RuntimeError(MISSING)
        count = PRIMARIES * (1 + REPLICAS_PER_PRIMARY)
        ports = free_ports(2 * count)
        try:
            for i in range(count):
                home = self.home / f"node{i}"
                home.mkdir(parents=True, exist_ok=True)
                config = home / "cluster.conf"
                config.write_text(_NODE_CONFIG.format(bus_port=ports[count + i]))
                self.nodes.append(RedisServer(home, port=ports[i], config=config).start())
            addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
            replicas = ["--cluster-replicas", str(REPLICAS_PER_PRIMARY), "--cluster-yes"]
            subprocess.run(
                [cli, "--cluster", "create", *addresses, *replicas],
                check=True,
                capture_output=True,
                timeout=timeout_s,
            )
            self._wait_until_ok(time.monotonic() + timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_until_ok(self, deadline: float) -> None:
        waiting = list(self.nodes)
        while waiting:
            waiting = [node for node in waiting if not _cluster_ok(node, len(self.nodes))]
            if not waiting:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"cluster nodes on ports {[n.port for n in waiting]} did not reach "
                    "cluster_state:ok with every node known and replicas in sync"
                )
            time.sleep(0.05)

    def a_primary(self) -> tuple[RedisServer, RedisServer]:
        """A primary other than the first node (``url`` keeps reaching the cluster when it
        fails), and its replica."""
        for node in self.nodes[1:]:
            client = node.client()
            try:
                replication = client.info("replication")
            finally:
                client.close()
            if replication["role"] == "master":
                port = int(replication["slave0"]["port"])
                return node, next(n for n in self.nodes if n.port == port)
        raise RuntimeError("no primary among the nodes after the first")

    def wait_promoted(self, replica: RedisServer, timeout_s: float = 30.0) -> None:
        """Waits until ``replica`` is a primary and reports ``cluster_state:ok`` (its failed
        primary's slots served again); TimeoutError past ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not _promoted(replica):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the replica on port {replica.port} was not promoted within {timeout_s} s"
                )
            time.sleep(0.05)

    def stop(self) -> None:
        """Stops every node by PID (SIGTERM, then SIGKILL if it lingers)."""
        for node in self.nodes:
            node.stop()


def _promoted(node: RedisServer) -> bool:
    client = node.client()
    try:
        role = client.info("replication")["role"]
        return role == "master" and client.cluster("info").get("cluster_state") == "ok"
    except redis.ConnectionError:
        return False
    finally:
        client.close()


def _cluster_ok(node: RedisServer, count: int) -> bool:
    """Whether ``node`` sees the whole cluster: state ok, every node known, the replicas as
    replicas, and its own replication in sync (a primary's replica attached, a replica's link
    to its primary up)."""
    client = node.client()
    try:
        info = client.cluster("info")
        flags = [entry["flags"] for entry in client.cluster("nodes").values()]
        replication = client.info("replication")
    except redis.ConnectionError:
        return False
    finally:
        client.close()
    if replication["role"] == "master":
        synced = replication["connected_slaves"] == REPLICAS_PER_PRIMARY
    else:
        synced = replication.get("master_link_status") == "up"
    return (
        info.get("cluster_state") == "ok"
        and int(info.get("cluster_known_nodes", 0)) == count
        and sum("slave" in f for f in flags) == count - PRIMARIES
        and synced
    )
