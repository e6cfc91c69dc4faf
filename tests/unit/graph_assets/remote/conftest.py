"""A real Redis Cluster (three primaries, three replicas) and a real single Redis, one of each
per test module, and the two stores the tests load into them: the typed fraud graph (three
node types, four relations, string and int IDs, a featureless type, edge features on one
relation) and a one-type graph with edge features, self-loops and parallel edges."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bench.harness.redis_server import MISSING, RedisServer, redis_server_binary
from graph_assets import GraphStore
from tests.edge_graph import edge_feature_store
from tests.redis_cluster import LocalCluster
from tests.typed_graphs import fraud_store


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    if redis_server_binary() is None:
        pytest.fail(MISSING)
    cluster = LocalCluster(tmp_path_factory.mktemp("cluster")).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def single_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    if redis_server_binary() is None:
        pytest.fail(MISSING)
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def typed_store(tmp_path_factory: pytest.TempPathFactory) -> GraphStore:
    return fraud_store(tmp_path_factory.mktemp("fraud"), 300, 40, 60, 1500, seed=1)


@pytest.fixture(scope="module")
def one_type_store(tmp_path_factory: pytest.TempPathFactory) -> GraphStore:
    return edge_feature_store(tmp_path_factory.mktemp("edges"))
