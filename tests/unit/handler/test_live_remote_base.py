"""The overlay over a graph in a real Redis Cluster answers exactly as over the local store
after the same seeded random stream of updates: the same in-lists, features, edge features,
in- and out-degrees (and the largest) and lookups, on a typed graph and a one-type graph."""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import pytest

from graph_assets import GraphStore
from graph_assets.live.operations import decode_operations
from graph_assets.live.overlay import GraphOverlay
from graph_assets.remote import open_remote_store
from graph_assets.remote.connect import connect
from graph_assets.remote.loader import load_store
from tests.edge_graph import edge_feature_store
from tests.live_reference import random_update
from tests.servers.redis_cluster import LocalCluster
from tests.typed_graphs import fraud_store
from tests.typed_live_reference import random_typed_update

UPDATES = 120


@dataclass
class _Live:
    """What the reference generators read of a live graph: the local overlay and its store."""

    overlay: GraphOverlay
    store: GraphStore

    def sync(self) -> None:
        """Nothing to catch up with: one writer."""


@pytest.fixture(scope="module")
def cluster(redis_cluster: LocalCluster) -> LocalCluster:
    """The session's Redis Cluster (tests/conftest.py), empty for this module."""
    return redis_cluster


def _remote(cluster: LocalCluster, store: GraphStore, prefix: str) -> GraphOverlay:
    client = connect(cluster.url, 5000)
    try:
        load_store(store, client, prefix, shown_url=cluster.url, block_size=8)
    finally:
        client.close()
    remote = open_remote_store(cluster.url, prefix, store.checksum, cache_mb=1, timeout_ms=5000)
    return GraphOverlay(remote)


@pytest.mark.parametrize("graph", ["typed", "one_type"])
def test_the_overlay_over_redis_answers_as_over_the_local_store(
    cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory, graph: str
) -> None:
    home = tmp_path_factory.mktemp(graph)
    typed = graph == "typed"
    store = fraud_store(home, 300, 40, 60, 1500, seed=1) if typed else edge_feature_store(home)
    local = GraphOverlay(store)
    remote = _remote(cluster, store, f"live_{graph}")
    live = _Live(local, store)
    rng, counter = random.Random(7), [0]
    for seq in range(1, UPDATES + 1):
        raw = (random_typed_update if typed else random_update)(rng, live, counter)  # type: ignore[arg-type]
        for overlay in (local, remote):
            overlay.apply(decode_operations(raw, store), seq)
    assert local.num_nodes == remote.num_nodes and local.removed == remote.removed
    every = np.arange(local.num_nodes, dtype=np.int64)
    mine, theirs = local.in_lists(every), remote.in_lists(every)
    for field in ("indptr", "indices", "edge_ids", "relations"):
        assert np.array_equal(getattr(mine, field), getattr(theirs, field)), field
    assert np.array_equal(local.degree_rows(every), remote.degree_rows(every))
    assert np.array_equal(local.out_degree_rows(every), remote.out_degree_rows(every))
    assert local.largest_out_degree() == remote.largest_out_degree()
    types = local.types_of(every)
    for t, node_type in enumerate(store.schema.node_types):
        nodes = every[types == t]
        assert np.array_equal(local.feature_rows(nodes), remote.feature_rows(nodes))
        ids = local.external_ids(nodes)
        assert ids == remote.external_ids(nodes)
        found = local.lookup(ids, node_type=node_type.name)
        assert np.array_equal(found, remote.lookup(ids, node_type=node_type.name))
    relations = mine.relations
    for r in range(len(store.schema.relations)):
        edges = mine.edge_ids[relations == r]
        assert np.array_equal(local.edge_feature_rows(edges), remote.edge_feature_rows(edges))
    before = local.changes_so_far().in_lists_before
    assert before.keys() == remote.changes_so_far().in_lists_before.keys()
