"""Faults of a graph's Redis Cluster through TorchServe (issue 26, item 4): a node archive built
with ``--graph-location redis://...`` on a real 3+3 cluster, two workers, the block cache off
so every request reads Redis. A stopped (SIGSTOP) primary is answered 503 with Retry-After
within a bound of ``remote_timeout_ms``, then 200 again after SIGCONT; under a bounded load, a
primary killed with kill -9 gets 200s with exactly the answers of before the kill or 503s with
Retry-After, never a 500, the same worker PIDs, and 200 again after its replica's promotion
without a restart. Values poisoned in the cluster (features changed at their length, a deleted
key, an ID pointed at another node's row) answer their requests 503 naming corrupt or missing
graph data, the key in the worker log, other requests 200, and 200 again after ``load-redis``
repairs them. The kill runs last: the cluster is this module's own."""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
from redis.cluster import RedisCluster

from graph_assets import open_store
from graph_assets.remote.layout import ADJ, CHECK_BYTES, Keys, RemoteLayout, id_shards, key_array
from tests.servers.redis_cluster import LocalCluster
from tests.servers.redis_server import MISSING, RedisServer, redis_server_binary
from tests.servers.torchserve import Serve, TorchServe, model_worker_pids

from .archives import built, python_m, write_small_graph

pytestmark = pytest.mark.integration
PREFIX, BLOCK_SIZE, TIMEOUT_MS = "served", 4, 400
# A request whose read meets a stopped primary waits out its round's timeout, at worst once
# more for the slot map's refresh, plus TorchServe's own way in and out on a busy machine.
SLOW_BOUND_S = 3 * TIMEOUT_MS / 1000 + 2.0
# The loader: threads, requests in all (paced evenly at RATE per second), and a deadline.
THREADS, REQUESTS, RATE, LOAD_DEADLINE_S = 4, 600, 40.0, 60.0
NODES = [f"acct_{i}" for i in range(0, 120, 5)]


@dataclass(frozen=True)
class Answer:
    """One request of the loader: which node, when it was sent and answered (monotonic s)."""

    node: str
    sent: float
    done: float
    status: int
    body: dict[str, Any]
    retry_after: str | None


@dataclass(frozen=True)
class Served:
    server: TorchServe
    cluster: LocalCluster
    store: Path


@pytest.fixture(scope="module")
def served(serve: Serve, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The cluster, the small graph loaded into it with ``load-redis``, and a TorchServe with
    two workers on the archive built with ``--graph-location redis://.../served`` (a server
    of its own: the tests stop and kill the cluster's primaries under it and read its log)."""
    if redis_server_binary() is None:
        pytest.fail(MISSING)
    root = tmp_path_factory.mktemp("remote_failover")
    cluster = LocalCluster(root / "cluster").start()
    try:
        store = root / "store"
        graph = write_small_graph(root / "graph")
        python_m("graph_assets", "build", "--graph", str(graph), "--out", str(store))
        load = ["--store", str(store), "--url", cluster.url, "--prefix", PREFIX]
        python_m("graph_assets", "load-redis", *load, "--block-size", str(BLOCK_SIZE))
        model_store = root / "model_store"
        built(
            *("--store", str(store), "--graph-location", f"{cluster.url}/{PREFIX}"),
            *("--arch", "gcn", "--epochs", "2", "--fanouts", "-1,-1", "--device", "cpu"),
            *("--batch-size", "1", "--min-workers", "2", "--max-workers", "2"),
            *("--remote-cache-mb", "0", "--remote-timeout-ms", str(TIMEOUT_MS)),
            *("--export-path", str(model_store)),
        )
        with serve(model_store, "gnn=gnn.mar", name="remote_failover") as server:
            yield Served(server, cluster, store)
    finally:
        cluster.stop()


def predict(server: TorchServe, node: str) -> requests.Response:
    return requests.post(
        f"{server.inference_url}/predictions/gnn",
        json={"node_id": node},
        headers=server.auth("inference"),
        timeout=60,
    )


def answers_now(server: TorchServe) -> dict[str, dict[str, Any]]:
    """Every node of NODES answered 200 now: the graph's answers, to compare with later."""
    found = {}
    for node in NODES:
        response = predict(server, node)
        assert response.status_code == 200, response.text
        found[node] = response.json()
    return found


def primary_of(served: Served, node: str) -> tuple[RedisServer, RedisServer]:
    """The primary holding the in-lists block of ``node`` (a read for ``node`` needs it), and
    its replica."""
    index = int(open_store(served.store).lookup([node])[0])
    key = Keys(PREFIX).block(index // BLOCK_SIZE, ADJ)
    first = served.cluster.nodes[0]
    client = RedisCluster(host="127.0.0.1", port=first.port)
    try:
        port = client.get_node_from_key(key).port
    finally:
        client.close()
    primary = next(n for n in served.cluster.nodes if n.port == port)
    info = primary.client()
    try:
        replica_port = int(info.info("replication")["slave0"]["port"])
    finally:
        info.close()
    return primary, next(n for n in served.cluster.nodes if n.port == replica_port)


def a_node_off_the_first(served: Served) -> tuple[str, RedisServer, RedisServer]:
    """A node whose block is not on the first cluster node (the one every client starts
    from), with that block's primary and replica."""
    for node in NODES:
        primary, replica = primary_of(served, node)
        if primary is not served.cluster.nodes[0]:
            return node, primary, replica
    raise AssertionError("every node's block is on the first cluster node")


def pid_of(node: RedisServer) -> int:
    assert node.process is not None
    return node.process.pid


def test_a_stopped_primary_is_answered_503_within_the_timeout_then_200(served: Served) -> None:
    expected = answers_now(served.server)
    node, primary, _ = a_node_off_the_first(served)
    os.kill(pid_of(primary), signal.SIGSTOP)
    try:
        sent = time.monotonic()
        response = predict(served.server, node)
        waited = time.monotonic() - sent
    finally:
        os.kill(pid_of(primary), signal.SIGCONT)
    assert response.status_code == 503, response.text
    assert response.headers.get("Retry-After") and response.json()["type"] == "Unavailable"
    assert waited < SLOW_BOUND_S, f"503 after {waited:.2f} s, bound {SLOW_BOUND_S} s"
    deadline = time.monotonic() + 30
    while (again := predict(served.server, node)).status_code != 200:
        assert again.status_code == 503 and again.headers.get("Retry-After"), again.text
        assert time.monotonic() < deadline, "no 200 within 30 s of SIGCONT"
    assert again.json() == expected[node]
    print(f"\nSIGSTOP of a primary: 503 after {waited:.2f} s (remote_timeout_ms {TIMEOUT_MS})")


def test_poisoned_values_answer_503_naming_them_until_load_redis_repairs_them(
    served: Served,
) -> None:
    server = served.server
    expected = answers_now(server)
    store = open_store(served.store)
    keys = Keys(PREFIX)
    scaled, lost, misled, pointed_at = store.lookup(["acct_10", "acct_50", "acct_20", "acct_21"])
    layout = RemoteLayout.of_store(store, BLOCK_SIZE)
    array = key_array([b"acct_20"], layout.id_dtypes[0])
    id_map = keys.id_shard(0, int(id_shards(array, layout.id_shards[0])[0]))

    def scale(client: RedisCluster, key: str) -> None:
        raw = client.get(key)
        assert isinstance(raw, bytes)
        rows = np.frombuffer(raw[:-CHECK_BYTES], dtype="<f4") * -3  # its checksum kept
        client.set(key, rows.astype("<f4").tobytes() + raw[-CHECK_BYTES:])

    def delete(client: RedisCluster, key: str) -> None:
        assert client.delete(key) == 1

    def point(client: RedisCluster, key: str) -> None:
        assert client.hget(key, "acct_20") == str(misled).encode()
        client.hset(key, "acct_20", str(pointed_at))  # acct_21's row

    reload = ["--store", str(served.store), "--url", served.cluster.url, "--prefix", PREFIX]
    reload += ["--block-size", str(BLOCK_SIZE)]
    corrupt = "graph data this request needs is corrupt in the graph store"
    missing = "graph data this request needs is missing from the graph store (a lost key)"
    for node, poison, key, start in (
        ("acct_10", scale, keys.block(int(scaled) // BLOCK_SIZE, "x0"), corrupt),
        ("acct_50", delete, keys.block(int(lost) // BLOCK_SIZE, "x0"), missing),
        ("acct_20", point, id_map, corrupt),
    ):
        client = RedisCluster(host="127.0.0.1", port=served.cluster.nodes[0].port)
        try:
            poison(client, key)
        finally:
            client.close()
        response = predict(server, node)
        assert response.status_code == 503, response.text
        body = response.json()
        assert body["type"] == "Unavailable" and body["message"].startswith(start), body
        assert body["message"].endswith("the server log names the key and how to restore it")
        assert "predicted_class" not in body
        assert response.headers.get("Retry-After") == "1"
        wait_for_log(server, key)
        clean = predict(server, "acct_115")  # no in-edges: its ego-graph reads none of them
        assert clean.status_code == 200 and clean.json() == expected["acct_115"]
        python_m("graph_assets", "load-redis", *reload)  # verifies, rewrites what differs
        again = predict(server, node)  # the next request, the value repaired: no restart
        assert again.status_code == 200 and again.json() == expected[node], again.text


def wait_for_log(server: TorchServe, text: str, timeout_s: float = 20.0) -> None:
    """Waits until the worker log holds ``text`` (workers' output reaches it asynchronously)."""
    log = server.home / "logs" / "model_log.log"
    deadline = time.monotonic() + timeout_s
    while text not in (log.read_text(errors="replace") if log.exists() else ""):
        assert time.monotonic() < deadline, f"{text!r} not in {log} after {timeout_s} s"
        time.sleep(0.1)


def test_a_killed_primary_gives_exact_200s_or_503s_then_200_without_restart(
    served: Served,
) -> None:
    server = served.server
    expected = answers_now(server)
    workers = model_worker_pids(server, "gnn")
    assert len(workers) == 2
    _, primary, replica = a_node_off_the_first(served)
    killed: list[float] = []
    kill_at = REQUESTS // 6  # after 100 requests, a few seconds of steady answers

    def kill() -> None:
        primary.kill()  # SIGKILL by PID
        killed.append(time.monotonic())

    answers = load(server, kill_at, kill)
    served.cluster.wait_promoted(replica)

    assert killed, "the loader never reached the kill"
    statuses = {a.status for a in answers}
    assert statuses <= {200, 503}, sorted(statuses)
    for a in answers:
        if a.status == 200:
            assert a.body == expected[a.node], (a.node, a.body, expected[a.node])
        else:
            assert a.retry_after and a.body.get("type") == "Unavailable", a.body
    failed = [a for a in answers if a.status == 503]
    assert failed, "no request met the killed primary: the test proves nothing"
    assert all(a.sent >= killed[0] - 1.0 for a in failed), "a 503 before the kill"

    # 200 again: every request sent after the last 503 was answered 200, and more than a few.
    last_failure = max(a.done for a in failed)
    after = [a for a in answers if a.sent > last_failure]
    assert len(after) >= 20 and all(a.status == 200 for a in after)
    recovered_s = min(a.done for a in after) - killed[0]
    assert model_worker_pids(server, "gnn") == workers, "a worker died or was restarted"
    assert answers_now(server) == expected
    print(
        f"\nkill -9 of a primary under {THREADS} threads, {len(answers)} requests at "
        f"{RATE:.0f}/s: {len(failed)} answered 503, none 500; 200 again "
        f"{recovered_s:.1f} s after the kill"
    )


def load(server: TorchServe, kill_at: int, kill: Callable[[], None]) -> list[Answer]:
    """REQUESTS predictions from THREADS threads, paced at RATE per second over NODES in
    turn, calling ``kill`` once request ``kill_at`` is due; stops at LOAD_DEADLINE_S."""
    counter = itertools.count()
    lock = threading.Lock()
    start = time.monotonic()
    stop = threading.Event()

    def worker() -> list[Answer]:
        mine: list[Answer] = []
        while True:
            with lock:
                i = next(counter)
            due = start + i / RATE
            if i >= REQUESTS or due > start + LOAD_DEADLINE_S:
                return mine
            if stop.wait(max(0.0, due - time.monotonic())):
                return mine
            if i == kill_at:
                kill()
            node = NODES[i % len(NODES)]
            sent = time.monotonic()
            response = predict(server, node)
            mine.append(
                Answer(
                    node,
                    sent,
                    time.monotonic(),
                    response.status_code,
                    response.json(),
                    response.headers.get("Retry-After"),
                )
            )

    with ThreadPoolExecutor(THREADS) as pool:
        futures = [pool.submit(worker) for _ in range(THREADS)]
        try:
            return [a for f in futures for a in f.result(timeout=LOAD_DEADLINE_S + 60)]
        finally:
            stop.set()
