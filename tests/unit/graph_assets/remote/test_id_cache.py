"""The ID cache and the worker's cache budget: lookups through the cache equal the store's
(one-type int IDs, typed string IDs), warm ones make no round trip, IDs Redis lacks are never
kept, and everything the caches hold stays within ``cache_mb``."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from graph_assets import GraphStore, open_store, read_graph_dir, write_store
from graph_assets.remote import RemoteStore, load_store, open_remote_store
from graph_assets.remote.connect import connect
from graph_assets.remote.id_cache import IdCache
from tests.servers.redis_cluster import LocalCluster
from tests.unit.handler.conftest import write_graph_csv

_MB = 1 << 20


@pytest.fixture(scope="module")
def int_store(tmp_path_factory: pytest.TempPathFactory) -> GraphStore:
    root = tmp_path_factory.mktemp("int_graph")
    write_store(read_graph_dir(write_graph_csv(root / "input", string_ids=False)), root / "store")
    return open_store(root / "store")


def _opened(cluster: LocalCluster, store: GraphStore, prefix: str, cache_mb: float) -> RemoteStore:
    client = connect(cluster.url, 5000)
    try:
        assert load_store(store, client, prefix, shown_url=cluster.url, block_size=8).complete
    finally:
        client.close()
    return open_remote_store(
        cluster.url, prefix, store.checksum, cache_mb=cache_mb, timeout_ms=5000
    )


@pytest.mark.parametrize("graph", ["one_type", "typed"])
def test_lookups_through_the_id_cache_equal_the_stores_and_warm_ones_make_no_round_trip(
    redis_cluster: LocalCluster,
    typed_store: GraphStore,
    int_store: GraphStore,
    graph: str,
) -> None:
    store = typed_store if graph == "typed" else int_store
    remote = _opened(redis_cluster, store, f"ids_{graph}", cache_mb=1)
    try:
        kinds = {kind.id_kind for kind in store.schema.node_types}
        assert kinds == ({"int", "str"} if graph == "typed" else {"int"})
        every = np.arange(store.num_nodes, dtype=np.int64)
        types = store.types_of(every)
        for t, kind in enumerate(store.schema.node_types):
            ids = store.external_ids(every[types == t])
            missing: list[int | str] = [99_999_999] if kind.id_kind == "int" else ["nobody"]
            asked = [*ids[::2], *missing, *ids[1::2]]
            expected = store.lookup(asked, node_type=kind.name)
            assert expected[len(ids[::2])] == -1
            cold = remote.counters
            assert np.array_equal(remote.lookup(asked, node_type=kind.name), expected)
            # The map, then the found rows' stored IDs (checked against the asked ones)
            assert remote.counters.round_trips == cold.round_trips + 2
            warm = remote.counters
            found = remote.lookup(ids, node_type=kind.name)
            assert np.array_equal(found, store.lookup(ids, node_type=kind.name))
            assert remote.counters.round_trips == warm.round_trips  # every found ID is cached
            assert remote.counters.id_hits == warm.id_hits + len(ids)
            again = remote.counters
            assert remote.lookup(missing, node_type=kind.name).tolist() == [-1]
            assert remote.counters.round_trips == again.round_trips + 1  # never cached
    finally:
        remote.close()


def test_the_caches_stay_within_cache_mb_when_filled_past_it(
    redis_cluster: LocalCluster, typed_store: GraphStore
) -> None:
    cache_mb = 0.05  # far below the graph: every read evicts
    remote = _opened(redis_cluster, typed_store, "ids_budget", cache_mb)
    try:
        every = np.arange(typed_store.num_nodes, dtype=np.int64)
        types = typed_store.types_of(every)
        rng = np.random.default_rng(5)
        for _ in range(3):
            for t, kind in enumerate(typed_store.schema.node_types):
                nodes = rng.permutation(every[types == t])
                for chunk in np.array_split(nodes, 4):
                    remote.feature_rows(np.sort(chunk))
                    remote.lookup(typed_store.external_ids(chunk), node_type=kind.name)
                    remote.in_lists(chunk)
                    assert remote.cache_bytes <= cache_mb * _MB
        assert remote.counters.cache_hits > 0 and remote.ids.nbytes > 0
        assert remote.cache.footprint > remote.cache.nbytes > 0
    finally:
        remote.close()


def test_the_id_caches_estimate_covers_the_memory_its_entries_take() -> None:
    cache = IdCache(1 * _MB)
    keys = [10**9 + i for i in range(20_000)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for start in range(0, len(keys), 1000):
            part = keys[start : start + 1000]
            cache.put(0, part, np.arange(start, start + len(part), dtype=np.int64))
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert 0 < cache.nbytes <= cache.capacity_bytes
    assert held <= cache.capacity_bytes
    kept = cache.get(0, keys)
    assert (kept[-1000:] == np.arange(19_000, 20_000)).all()  # the newest are kept
    assert (kept[:1000] == -1).all()  # the oldest went first
