"""RemoteStore against a real Redis Cluster and a real single Redis: every read equals the
memory-mapped store's, each batched read is one pipelined round (not one per node, whatever
shards it touches), the block cache hits, stays bounded and drops what it is told, and a wrong
checksum, a missing graph, an unfinished load and an unreachable server are refused in one
line."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from graph_assets import GraphStore
from graph_assets.graph_view import GraphView
from graph_assets.remote import (
    RemoteDataCorrupt,
    RemoteDataLost,
    RemoteGraphError,
    RemoteStore,
    RemoteUnavailable,
    load_store,
    open_remote_store,
)
from graph_assets.remote.connect import connect
from graph_assets.remote.layout import CHECK_BYTES, Keys, id_shards, key_array, sealed, unsealed
from tests.servers.ports import free_ports
from tests.servers.redis_cluster import LocalCluster
from tests.servers.redis_server import RedisServer

BLOCK = 8  # small blocks: the test graphs span many of them, on every shard

Loader = Callable[[str, str], tuple[str, str, GraphStore]]


@pytest.fixture(scope="module")
def loaded(
    redis_cluster: LocalCluster,
    single_redis: RedisServer,
    typed_store: GraphStore,
    one_type_store: GraphStore,
) -> Loader:
    """``(target, graph) -> (url, prefix, store)``, loading each pair once."""
    urls = {"cluster": redis_cluster.url, "single": single_redis.url}
    stores = {"typed": typed_store, "one_type": one_type_store}
    done: dict[tuple[str, str], tuple[str, str, GraphStore]] = {}

    def load(target: str, graph: str) -> tuple[str, str, GraphStore]:
        if (target, graph) not in done:
            url, store = urls[target], stores[graph]
            client = connect(url, 5000)
            try:
                report = load_store(store, client, graph, shown_url=url, block_size=BLOCK)
            finally:
                client.close()
            assert report.complete
            done[target, graph] = (url, graph, store)
        return done[target, graph]

    return load


def remote(url: str, prefix: str, store: GraphStore, cache_mb: float = 1.0) -> RemoteStore:
    return open_remote_store(url, prefix, store.checksum, cache_mb=cache_mb, timeout_ms=2000)


@pytest.mark.parametrize("graph", ["typed", "one_type"])
@pytest.mark.parametrize("target", ["cluster", "single"])
def test_every_read_equals_the_local_store(loaded: Loader, target: str, graph: str) -> None:
    url, prefix, store = loaded(target, graph)
    view: GraphView = remote(url, prefix, store)  # the reads serving makes of any graph
    assert isinstance(view, RemoteStore)
    rng = np.random.default_rng(0)
    nodes = rng.permutation(np.concatenate([np.arange(store.num_nodes)] * 2))  # repeats too
    assert (view.meta, view.checksum, view.schema) == (store.meta, store.checksum, store.schema)
    assert (view.num_classes, view.class_names) == (store.num_classes, store.class_names)
    assert (view.num_nodes, view.num_edges) == (store.num_nodes, store.num_edges)

    lists = view.in_lists(nodes)
    starts, ends = np.asarray(store.indptr)[nodes], np.asarray(store.indptr)[nodes + 1]
    assert np.array_equal(lists.indptr, np.concatenate([[0], np.cumsum(ends - starts)]))
    positions = np.concatenate([np.arange(s, e) for s, e in zip(starts, ends, strict=True)])
    assert np.array_equal(lists.edge_ids, positions)
    assert np.array_equal(lists.indices, np.asarray(store.indices)[positions])
    assert np.array_equal(lists.relations, store.edge_relations(positions))
    assert lists.indices.dtype == lists.edge_ids.dtype == np.int64

    edges = rng.permutation(store.num_edges)
    assert np.array_equal(view.edge_relations(edges), store.edge_relations(edges))
    for r in range(len(store.schema.relations)):
        of_r = edges[store.edge_relations(edges) == r]
        assert np.array_equal(view.edge_feature_rows(of_r), store.edge_feature_rows(of_r))
    assert view.degree_rows(nodes).tolist() == store.degree_rows(nodes).tolist()
    assert view.in_degree_rows(nodes).tolist() == store.in_degree[nodes].tolist()
    assert view.out_degree_rows(nodes).tolist() == store.out_degree_rows(nodes).tolist()
    assert view.largest_out_degree() == store.largest_out_degree()
    assert view.external_ids(nodes) == store.external_ids(nodes)  # types mixed in one call
    targets = nodes[nodes < store.schema.target_type.num_nodes]
    assert view.label_rows(targets).tolist() == store.labels[targets].tolist()
    for node_type in store.schema.node_types:
        of_type = nodes[store.types_of(nodes) == store.schema.type_index(node_type.name)]
        rows = view.feature_rows(of_type)
        assert rows.dtype == np.float32 and np.array_equal(rows, store.feature_rows(of_type))
        asked: list[Any] = [
            *store.external_ids(of_type[:50]),
            "missing",
            10**12,
            -1,
            True,
            "0042",
            3.0,
        ]
        found = view.lookup(asked, node_type.name)
        assert found.tolist() == store.lookup(asked, node_type.name).tolist()
        assert (found[:50] == of_type[:50]).all()
    none = np.empty(0, dtype=np.int64)
    assert view.in_lists(none).indptr.tolist() == [0] and view.external_ids(none) == []
    assert view.feature_rows(none).shape == (0, store.feature_dim)
    assert view.edge_feature_rows(none).shape == store.edge_feature_rows(none).shape
    if graph == "typed":
        with pytest.raises(ValueError, match="several types"):
            view.feature_rows(np.arange(store.num_nodes))


def test_each_batched_read_is_one_round_trip_across_shards(
    loaded: Loader, redis_cluster: LocalCluster
) -> None:
    url, prefix, store = loaded("cluster", "typed")
    view = remote(url, prefix, store, cache_mb=0)  # no cache: every read goes to Redis
    nodes = np.arange(0, store.num_nodes, 3)
    users = nodes[nodes < store.schema.target_type.num_nodes]
    keys = Keys(prefix)
    shards = {
        view.client.get_node_from_key(keys.block(int(b), "adj")).name  # type: ignore[union-attr]
        for b in np.unique(nodes // BLOCK)
    }
    assert len(shards) == 3  # the batch needs every primary

    def round_trips(read: Callable[[], object]) -> int:
        before = view.counters
        read()
        after = view.counters
        assert after.bytes_read > before.bytes_read and after.read_seconds > before.read_seconds
        return after.round_trips - before.round_trips

    lists = view.in_lists(nodes)
    pays = lists.edge_ids[lists.relations == store.schema.relation_index("user__pays__merchant")]
    assert round_trips(lambda: view.in_lists(nodes)) == 1
    assert round_trips(lambda: view.feature_rows(users)) == 1
    assert round_trips(lambda: view.degree_rows(nodes)) == 1
    assert round_trips(lambda: view.external_ids(nodes)) == 1
    # The ID map, then the found rows' IDs (checked against the asked ones) and in-lists:
    assert round_trips(lambda: view.lookup(store.external_ids(users), "user")) == 2
    assert round_trips(lambda: view.edge_relations(lists.edge_ids)) == 1
    # The edges' relations first, then the relation's rows: two rounds without a cache...
    assert round_trips(lambda: view.edge_feature_rows(pays)) == 2
    cached = remote(url, prefix, store, cache_mb=4)
    cached.in_lists(nodes)
    before = cached.counters.round_trips
    cached.edge_feature_rows(pays)  # ... one when in_lists cached the relations
    assert cached.counters.round_trips == before + 1


@pytest.mark.parametrize("target", ["cluster", "single"])
def test_a_read_is_one_command_per_group_of_blocks(loaded: Loader, target: str) -> None:
    """Redis costs per command more than per key: a read sends one MGET per group of blocks
    it touches on a cluster (their keys share a slot), one on a single Redis."""
    url, prefix, store = loaded(target, "typed")
    view = remote(url, prefix, store, cache_mb=0)
    keys = view.keys
    for nodes in (np.arange(3), np.arange(0, store.num_nodes, 2), np.arange(store.num_nodes)):
        blocks = np.unique(nodes // BLOCK)
        groups = len({keys.group(int(b)) for b in blocks})
        before = view.counters
        view.in_lists(nodes)
        view.degree_rows(nodes)
        after = view.counters
        assert after.round_trips - before.round_trips == 2
        assert after.commands - before.commands == (2 * groups if target == "cluster" else 2)
    assert len(blocks) > keys.slot_groups  # the last batch: more blocks than groups


def test_the_cache_hits_stays_bounded_and_drops_invalidated_blocks(loaded: Loader) -> None:
    url, prefix, store = loaded("single", "typed")
    view = remote(url, prefix, store, cache_mb=1)
    users = np.arange(0, store.schema.target_type.num_nodes, 5)
    blocks = len(np.unique(users // BLOCK))
    first = view.feature_rows(users)
    counters = view.counters
    assert (counters.round_trips, counters.cache_misses, counters.cache_hits) == (1, blocks, 0)
    assert np.array_equal(view.feature_rows(users), first)
    counters = view.counters
    assert (counters.round_trips, counters.cache_hits) == (1, blocks)  # no trip: all cached
    view.invalidate(users[:1])
    view.feature_rows(users)
    counters = view.counters
    assert (counters.round_trips, counters.cache_misses) == (2, blocks + 1)

    tiny = remote(url, prefix, store, cache_mb=0.005)  # 5 KB: about 2 KB of blocks held
    for start in range(0, store.num_nodes, 40):
        tiny.degree_rows(np.arange(start, min(start + 40, store.num_nodes)))
        assert 0 < tiny.cache.nbytes <= tiny.cache.capacity_bytes


@pytest.mark.parametrize("graph", ["typed", "one_type"])
def test_reads_through_a_small_cache_equal_the_local_store(loaded: Loader, graph: str) -> None:
    """Batches that find some blocks cached and fetch the rest, while the cache evicts,
    compacts and drops invalidated blocks, still read exactly what the store holds."""
    url, prefix, store = loaded("single", graph)
    view = remote(url, prefix, store, cache_mb=0.02)  # 20 KB: part of the graph
    rng = np.random.default_rng(7)
    relations = range(len(store.schema.relations))
    for _ in range(40):
        nodes = rng.choice(store.num_nodes, int(rng.integers(1, 60)))
        lists = view.in_lists(nodes)
        local = store.in_lists(nodes)
        for name in ("indptr", "indices", "edge_ids", "relations"):
            assert np.array_equal(getattr(lists, name), getattr(local, name)), name
        assert np.array_equal(view.degree_rows(nodes), store.degree_rows(nodes))
        assert view.external_ids(nodes) == store.external_ids(nodes)
        t = int(store.types_of(nodes[:1])[0])
        of_type = nodes[store.types_of(nodes) == t]
        assert np.array_equal(view.feature_rows(of_type), store.feature_rows(of_type))
        edges = rng.choice(store.num_edges, int(rng.integers(1, 80)))
        view.prefetch(nodes, edges)
        assert np.array_equal(view.edge_relations(edges), store.edge_relations(edges))
        for r in relations:
            of_r = edges[store.edge_relations(edges) == r]
            assert np.array_equal(view.edge_feature_rows(of_r), store.edge_feature_rows(of_r))
        if rng.random() < 0.2:
            view.invalidate(rng.choice(store.num_nodes, 20))
        assert 0 < view.cache.nbytes <= view.cache.capacity_bytes
    counters = view.counters
    assert counters.cache_hits > 0 and counters.cache_misses > 0


def test_a_wrong_or_missing_graph_is_refused_in_one_line(
    loaded: Loader, single_redis: RedisServer
) -> None:
    url, prefix, store = loaded("single", "one_type")
    with pytest.raises(RemoteGraphError) as wrong:
        open_remote_store(url, prefix, "f" * 64, cache_mb=1, timeout_ms=1000)
    message = str(wrong.value)
    assert "\n" not in message and store.checksum[:12] in message and "ffffffffffff" in message
    with pytest.raises(RemoteGraphError, match="holds no graph: load it with") as missing:
        open_remote_store(url, "nothing-here", store.checksum, cache_mb=1, timeout_ms=1000)
    assert "\n" not in str(missing.value)
    with pytest.raises(RemoteGraphError, match="prefix is 1-100 letters"):
        open_remote_store(url, "no{braces}", store.checksum, cache_mb=1, timeout_ms=1000)


def test_a_load_of_an_older_layout_is_refused_with_how_to_reload(
    single_redis: RedisServer, one_type_store: GraphStore
) -> None:
    client = connect(single_redis.url, 5000)
    try:
        load_store(one_type_store, client, "stale", shown_url=single_redis.url, block_size=BLOCK)
        graph = Keys("stale").graph
        record = json.loads(client.hget(graph, "layout"))  # type: ignore[arg-type]
        record["format"] = 2  # the layout before checksums
        client.hset(graph, "layout", json.dumps(record))
        with pytest.raises(RemoteGraphError) as loading:
            load_store(one_type_store, client, "stale", shown_url=single_redis.url)
    finally:
        client.close()
    with pytest.raises(RemoteGraphError) as opening:
        remote(single_redis.url, "stale", one_type_store)
    for refused in (loading, opening):
        message = str(refused.value)
        assert "\n" not in message and "loaded in layout format 2, this gnnserve reads 3" in message
        assert "reload it with `python -m graph_assets load-redis` under a new --prefix" in message


def test_an_unfinished_load_is_refused(single_redis: RedisServer, typed_store: GraphStore) -> None:
    client = connect(single_redis.url, 5000)
    try:
        report = load_store(
            typed_store, client, "half", shown_url=single_redis.url, block_size=BLOCK, max_chunks=1
        )
    finally:
        client.close()
    assert not report.complete
    with pytest.raises(RemoteGraphError, match=r"the load is not finished \(1 chunks so far\)"):
        remote(single_redis.url, "half", typed_store)


def test_an_unreachable_redis_is_refused_in_one_line(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    started = time.monotonic()
    url = f"redis://127.0.0.1:{port}"
    with pytest.raises(RemoteUnavailable) as unreachable:
        open_remote_store(url, "graph", "0" * 64, cache_mb=1, timeout_ms=500)
    assert time.monotonic() - started < 5
    message = str(unreachable.value)
    assert "\n" not in message and f"127.0.0.1:{port}" in message
    with pytest.raises(RemoteGraphError, match="redis://host:port or rediss://"):
        open_remote_store(f"http://127.0.0.1:{port}", "graph", "0" * 64, cache_mb=1, timeout_ms=500)


def test_a_lost_or_overwritten_value_is_refused_not_answered(
    single_redis: RedisServer, one_type_store: GraphStore
) -> None:
    """Each value carries its checksum; the checks behind it (sizes, pointers) refuse a value
    sealed by something else than the load of this layout."""
    keys = Keys("lossy")
    client = connect(single_redis.url, 5000)
    try:
        load_store(one_type_store, client, "lossy", shown_url=single_redis.url, block_size=BLOCK)
        client.delete(keys.block(2, "x0"))
        client.set(keys.block(3, "deg"), sealed(b"\0" * 24))  # one row of three int64
        client.set(keys.block(5, "x0"), sealed(b"\0" * 3))
        lists = bytearray(unsealed(client.get(keys.block(4, "adj"))))  # type: ignore[arg-type]
        lists[:8] = (int.from_bytes(lists[:8], "little") + 1).to_bytes(8, "little")
        client.set(keys.block(4, "adj"), sealed(bytes(lists)))  # the right length, shifted
    finally:
        client.close()
    view = remote(single_redis.url, "lossy", one_type_store, cache_mb=0)
    assert view.feature_rows(np.arange(BLOCK)).shape == (BLOCK, one_type_store.feature_dim)
    with pytest.raises(RemoteDataLost, match=r"lost key .*noeviction") as lost:
        view.feature_rows(np.arange(2 * BLOCK, 3 * BLOCK))
    assert lost.value.key == keys.block(2, "x0")
    with pytest.raises(RemoteDataCorrupt, match="holds 1 rows, the layout says 8") as short:
        view.degree_rows(np.arange(3 * BLOCK, 4 * BLOCK))
    with pytest.raises(RemoteDataCorrupt, match="pointers outside its edges") as shifted:
        view.in_lists(np.arange(4 * BLOCK, 5 * BLOCK))
    with pytest.raises(RemoteDataCorrupt, match="3 bytes, not whole rows") as torn:
        view.feature_rows(np.arange(5 * BLOCK, 6 * BLOCK))
    assert all("\n" not in str(e.value) for e in (lost, short, shifted, torn))


def reload(url: str, prefix: str, store: GraphStore) -> list[str]:
    """Runs the load again (it finds the load complete and verifies it): the chunks repaired."""
    client = connect(url, 5000)
    try:
        report = load_store(store, client, prefix, shown_url=url, block_size=BLOCK)
    finally:
        client.close()
    assert report.complete and report.verified == report.chunks
    return report.repaired


@pytest.mark.parametrize("target", ["cluster", "single"])
def test_a_value_changed_at_its_length_fails_its_checksum_until_loaded_again(
    loaded: Loader, target: str
) -> None:
    """Features scaled by -3 keep their length (and changed a class when they were served):
    the block's checksum refuses them, naming the key; the load's verify pass rewrites it."""
    url, prefix, store = loaded(target, "one_type")
    key = Keys(prefix).block(3, "x0")
    client = connect(url, 5000)
    try:
        raw = client.get(key)
        assert isinstance(raw, bytes)
        rows = np.frombuffer(raw[:-CHECK_BYTES], dtype="<f4") * -3
        client.set(key, rows.astype("<f4").tobytes() + raw[-CHECK_BYTES:])
    finally:
        client.close()
    view = remote(url, prefix, store, cache_mb=0)
    nodes = np.arange(3 * BLOCK, 4 * BLOCK)
    with pytest.raises(RemoteDataCorrupt) as corrupt:
        view.feature_rows(nodes)
    assert corrupt.value.key == key
    message = str(corrupt.value)
    assert "\n" not in message and f"key {key} holds a value that fails its checksum" in message
    assert "run `python -m graph_assets load-redis` again to restore it" in message
    others = np.arange(4 * BLOCK, 5 * BLOCK)  # the next read of another block is answered
    assert np.array_equal(view.feature_rows(others), store.feature_rows(others))
    assert reload(url, prefix, store) == ["b0"]  # the chunk holding block 3, rewritten
    assert np.array_equal(view.feature_rows(nodes), store.feature_rows(nodes))


def test_a_non_finite_feature_is_refused_as_corrupt(
    single_redis: RedisServer, one_type_store: GraphStore
) -> None:
    """A NaN row, even under a checksum that matches it (a value sealed by another tool),
    never reaches the model: refused naming its key and row; the reload restores it."""
    prefix = "nan"
    client = connect(single_redis.url, 5000)
    key = Keys(prefix).block(2, "x0")
    try:
        load_store(one_type_store, client, prefix, shown_url=single_redis.url, block_size=BLOCK)
        rows = np.frombuffer(unsealed(client.get(key)), dtype="<f4").copy()  # type: ignore[arg-type]
        rows = rows.reshape(BLOCK, -1)
        rows[5, 1] = np.nan
        client.set(key, sealed(rows.tobytes()))
    finally:
        client.close()
    view = remote(single_redis.url, prefix, one_type_store, cache_mb=0)
    nodes = np.arange(2 * BLOCK, 3 * BLOCK)
    with pytest.raises(
        RemoteDataCorrupt, match=f"key {re.escape(key)} holds a non-finite value in row 5"
    ) as corrupt:
        view.feature_rows(nodes)
    assert corrupt.value.key == key
    others = np.arange(3 * BLOCK, 4 * BLOCK)  # the next read of another block is answered
    assert np.array_equal(view.feature_rows(others), one_type_store.feature_rows(others))
    assert reload(single_redis.url, prefix, one_type_store) == ["b0"]
    assert np.array_equal(view.feature_rows(nodes), one_type_store.feature_rows(nodes))


def set_field(url: str, key: str, field: bytes, value: bytes) -> None:
    client = connect(url, 5000)
    try:
        client.hset(key, field, value)
    finally:
        client.close()


@pytest.mark.parametrize(("target", "node_type"), [("cluster", "user"), ("single", "merchant")])
def test_an_id_map_entry_pointing_at_another_row_is_refused(
    loaded: Loader, target: str, node_type: str
) -> None:
    """An ID pointed at the next node's row would answer for that node under the asked ID:
    the row's stored ID disagrees, so the lookup is refused naming the map's key (string and
    int IDs); other IDs are still found; the load's verify pass rewrites the entry."""
    url, prefix, store = loaded(target, "typed")
    t = store.schema.type_index(node_type)
    offset = store.schema.node_types[t].offset
    asked, other = store.external_ids(np.array([offset + 5, offset + 6]))
    view = remote(url, prefix, store)
    layout = view.layout
    canonical = asked.encode() if isinstance(asked, str) else asked
    array = key_array([canonical], layout.id_dtypes[t])
    key = Keys(prefix).id_shard(t, int(id_shards(array, layout.id_shards[t])[0]))
    field = str(asked).encode()
    set_field(url, key, field, b"6")  # the next node's index within its type
    with pytest.raises(RemoteDataCorrupt) as corrupt:
        view.lookup([asked], node_type)
    assert corrupt.value.key == key
    message = str(corrupt.value)
    assert "\n" not in message
    assert f"key {key} holds ID {asked!r} -> node {offset + 6}, whose row holds ID {other!r}" in (
        message
    )
    assert view.lookup([other], node_type).tolist() == [offset + 6]  # the next lookup answers
    set_field(url, key, field, b"-7")
    with pytest.raises(RemoteDataCorrupt, match=f"key {re.escape(key)} holds b'-7' for ID"):
        remote(url, prefix, store).lookup([asked], node_type)
    assert reload(url, prefix, store) == [f"i{t}.0"]
    assert remote(url, prefix, store).lookup([asked], node_type).tolist() == [offset + 5]


def test_the_cluster_fixture_has_three_primaries_each_with_a_replica(
    redis_cluster: LocalCluster,
) -> None:
    client = connect(redis_cluster.url, 2000)
    try:
        primaries = {node.port for node in client.get_primaries()}  # type: ignore[union-attr]
    finally:
        client.close()
    roles = {}
    for node in redis_cluster.nodes:
        admin = node.client()
        roles[node.port] = admin.info("replication")
        admin.close()
    assert {port for port, info in roles.items() if info["role"] == "master"} == primaries
    replicas = [info for info in roles.values() if info["role"] == "slave"]
    assert len(primaries) == len(replicas) == 3
    assert {info["master_port"] for info in replicas} == primaries
    assert all(info["master_link_status"] == "up" for info in replicas)
