"""RemoteStore through faults of a real Redis Cluster (three primaries, three replicas): a
primary that stops answering fails a read within a bound of the timeout, never a hang, and the
next reads are the graph's again; a primary killed with kill -9 fails reads
(RemoteUnavailable, never another answer) until the cluster promotes its replica, and reads
then succeed, identically, on the same store object: redis-py's slot map is refreshed, with no
restart. The kill runs last: this module's cluster is its own (own_redis_cluster)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from graph_assets import GraphStore
from graph_assets.remote import RemoteStore, RemoteUnavailable, load_store, open_remote_store
from graph_assets.remote.connect import connect
from tests.servers.redis_cluster import LocalCluster

TIMEOUT_MS = 300
# A failed read waits out the timeout once for its round, and at worst once more for the
# refresh of the slot map when that meets the stopped node; with slack for a busy machine.
READ_BOUND_S = 3 * TIMEOUT_MS / 1000 + 0.5
# That bound is tight: a neighbour xdist worker on a small machine could stretch a read past it.
pytestmark = pytest.mark.serial


@pytest.fixture(scope="module")
def remote(own_redis_cluster: LocalCluster, typed_store: GraphStore) -> Iterator[RemoteStore]:
    client = connect(own_redis_cluster.url, 5000)
    try:
        load_store(typed_store, client, "faults", shown_url=own_redis_cluster.url, block_size=8)
    finally:
        client.close()
    store = open_remote_store(
        own_redis_cluster.url, "faults", typed_store.checksum, cache_mb=0, timeout_ms=TIMEOUT_MS
    )
    try:
        yield store
    finally:
        store.close()


def reads(store: RemoteStore) -> Callable[[], list[np.ndarray]]:
    """Every in-list and the target type's feature rows: blocks on every shard, one read each
    (the cache is off, so every call goes to Redis)."""
    nodes = np.arange(store.num_nodes)
    targets = np.arange(store.schema.target_type.num_nodes)

    def read() -> list[np.ndarray]:
        lists = store.in_lists(nodes)
        return [lists.indptr, lists.indices, lists.edge_ids, store.feature_rows(targets)]

    return read


def same(got: list[np.ndarray], want: list[np.ndarray]) -> bool:
    return all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))


def test_a_stopped_primary_fails_a_read_within_the_timeout_and_the_next_reads_are_exact(
    own_redis_cluster: LocalCluster, remote: RemoteStore
) -> None:
    read = reads(remote)
    want = read()
    primary, _ = own_redis_cluster.a_primary()
    assert primary.process is not None
    os.kill(primary.process.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(RemoteUnavailable, match="Timeout"):
            read()
        assert time.monotonic() - started < READ_BOUND_S
    finally:
        os.kill(primary.process.pid, signal.SIGCONT)
    # Its late replies went to closed connections: nothing of them is read as another's.
    for _ in range(3):
        assert same(read(), want)


def test_a_killed_primary_fails_reads_until_its_replica_is_promoted_then_reads_are_exact(
    own_redis_cluster: LocalCluster, remote: RemoteStore
) -> None:
    read = reads(remote)
    want = read()
    primary, replica = own_redis_cluster.a_primary()
    primary.kill()
    killed = time.monotonic()
    outcomes: list[str] = []
    deadline = killed + 30
    while True:
        started = time.monotonic()
        try:
            got = read()
        except RemoteUnavailable:
            outcomes.append("unavailable")
        else:
            assert same(got, want), "a read during the failover answered other data"
            outcomes.append("exact")
        assert time.monotonic() - started < READ_BOUND_S
        if outcomes[-1] == "exact" and "unavailable" in outcomes:
            break
        assert time.monotonic() < deadline, f"no exact read 30 s after the kill: {outcomes}"
        time.sleep(0.05)
    recovered = time.monotonic() - killed
    own_redis_cluster.wait_promoted(replica, timeout_s=5)
    for _ in range(3):
        assert same(read(), want)
    print(
        f"failover: {outcomes.count('unavailable')} reads unavailable, exact again after "
        f"{recovered:.1f} s"
    )
