"""Loading a store into a real Redis Cluster and a real single Redis: a load stopped midway
continues where it stopped, a finished one is verified (and what differs is written again),
another graph under the same prefix is refused, the CLI reports in a few lines and in one on
failure, a password is used but never printed nor stored, and Redis's memory per node, edge
and feature byte stays what docs/redis-cluster.md says."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from graph_assets import GraphStore, generate_synthetic, open_store
from graph_assets.__main__ import main
from graph_assets.remote import RemoteGraphError, load_store, open_remote_store
from graph_assets.remote.connect import PASSWORD_FILE_VARIABLE, Client, connect
from graph_assets.remote.layout import Keys, RemoteLayout
from graph_assets.remote.loader import plan
from tests.servers.ports import free_ports
from tests.servers.redis_cluster import LocalCluster
from tests.servers.redis_server import RedisServer

BLOCK = 8


@pytest.fixture(params=["cluster", "single"])
def url(request: pytest.FixtureRequest) -> str:
    server = request.getfixturevalue(
        "redis_cluster" if request.param == "cluster" else "single_redis"
    )
    assert isinstance(server, LocalCluster | RedisServer)
    return server.url


@pytest.fixture()
def client(url: str) -> Iterator[Client]:
    connected = connect(url, 5000)
    try:
        yield connected
    finally:
        connected.close()


def same_reads(url: str, prefix: str, store: GraphStore) -> None:
    """A few batched reads of the loaded graph equal the store's."""
    view = open_remote_store(url, prefix, store.checksum, cache_mb=0, timeout_ms=2000)
    nodes = np.arange(store.num_nodes)
    try:
        assert np.array_equal(view.in_lists(nodes).indices, store.indices)
        assert view.external_ids(nodes) == store.external_ids(nodes)
        users = np.arange(store.schema.target_type.num_nodes)
        assert np.array_equal(view.feature_rows(users), store.feature_rows(users))
    finally:
        view.close()


def test_a_stopped_load_continues_then_verifies(
    url: str, client: Client, typed_store: GraphStore, request: pytest.FixtureRequest
) -> None:
    prefix = f"resumed-{request.node.callspec.id}"
    first = load_store(typed_store, client, prefix, shown_url=url, block_size=BLOCK, max_chunks=2)
    everything = typed_store.num_nodes * 2 + typed_store.num_edges  # nodes, IDs, edges
    assert (first.written, first.already, first.complete) == (2, 0, False)
    assert 0 < first.rows < everything

    second = load_store(typed_store, client, prefix, shown_url=url, block_size=BLOCK)
    assert (second.written, second.already, second.complete) == (first.chunks - 2, 2, True)
    assert second.verified == 0
    assert first.rows + second.rows == everything
    same_reads(url, prefix, typed_store)

    third = load_store(typed_store, client, prefix, shown_url=url, block_size=BLOCK)
    assert (third.written, third.verified, third.repaired, third.complete) == (
        0,
        first.chunks,
        [],
        True,
    )


def test_verifying_writes_again_what_differs(
    url: str, client: Client, one_type_store: GraphStore, request: pytest.FixtureRequest
) -> None:
    prefix = f"damaged-{request.node.callspec.id}"
    load_store(one_type_store, client, prefix, shown_url=url, block_size=BLOCK)
    keys = Keys(prefix)
    client.set(keys.block(3, "adj"), b"\x00" * 12)  # overwritten
    client.delete(keys.id_shard(0, 0))  # evicted
    with pytest.raises(RemoteGraphError):
        same_reads(url, prefix, one_type_store)

    report = load_store(one_type_store, client, prefix, shown_url=url, block_size=BLOCK)
    chunks = plan(one_type_store, RemoteLayout.of_store(one_type_store, BLOCK))
    assert [c.name for c in chunks] == ["s0", "b0", "i0.0"]  # block 3 is in chunk b0
    assert sorted(report.repaired) == ["b0", "i0.0"]
    assert report.verified == report.chunks == len(chunks)
    same_reads(url, prefix, one_type_store)


def test_another_graph_or_layout_under_the_prefix_is_refused(
    url: str,
    client: Client,
    typed_store: GraphStore,
    one_type_store: GraphStore,
    request: pytest.FixtureRequest,
) -> None:
    prefix = f"taken-{request.node.callspec.id}"
    load_store(typed_store, client, prefix, shown_url=url, block_size=BLOCK)
    with pytest.raises(RemoteGraphError) as other:
        load_store(one_type_store, client, prefix, shown_url=url, block_size=BLOCK)
    assert "\n" not in str(other.value)
    assert f"holds graph {typed_store.checksum[:12]}" in str(other.value)
    with pytest.raises(RemoteGraphError, match="blocks of 8 nodes, this load asks for 16"):
        load_store(typed_store, client, prefix, shown_url=url, block_size=16)
    same_reads(url, prefix, typed_store)


def test_the_cli_loads_into_a_cluster_and_verifies(
    redis_cluster: LocalCluster, typed_store: GraphStore, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["load-redis", "--store", str(typed_store.path), "--url", redis_cluster.url]
    args += ["--prefix", "cli"]
    assert main([*args, "--block-size", "16"]) == 0
    out = capsys.readouterr().out
    assert "(a cluster of 3 primaries), prefix cli" in out
    assert "(0 were already there)" in out and typed_store.checksum in out
    assert main([*args, "--block-size", "16"]) == 0
    assert "already loaded: verified 5 chunks against their recorded sha256: all match" in (
        capsys.readouterr().out
    )
    assert main(args) == 2  # the default block size is another layout
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "in blocks of 16 nodes, this load asks for 32" in err
    same_reads(redis_cluster.url, "cli", typed_store)


def test_the_cli_refuses_in_one_line(
    typed_store: GraphStore, capsys: pytest.CaptureFixture[str]
) -> None:
    (port,) = free_ports(1)
    args = ["load-redis", "--store", str(typed_store.path), "--url"]
    assert main([*args, f"redis://127.0.0.1:{port}", "--timeout-ms", "500"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: Redis at redis://127.0.0.1:")
    with pytest.raises(SystemExit):
        main([*args, f"redis://127.0.0.1:{port}", "--prefix", "a/b"])
    assert "prefix is 1-100 letters" in capsys.readouterr().err


def test_a_password_is_used_never_printed_nor_stored(
    own_redis_server: RedisServer,
    one_type_store: GraphStore,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    secret = "s3cret-Pa55"
    admin = own_redis_server.client()
    admin.config_set("requirepass", secret)
    admin.close()
    password_file = tmp_path / "password"
    password_file.write_text(secret + "\n")
    os.chmod(password_file, 0o600)
    args = ["load-redis", "--store", str(one_type_store.path), "--url", own_redis_server.url]

    assert main(args) == 2  # no password: refused in one line
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "authenticated" in err

    monkeypatch.setenv(PASSWORD_FILE_VARIABLE, str(password_file))
    assert main(args) == 0
    in_url = f"redis://:{secret}@127.0.0.1:{own_redis_server.port}"
    assert main([*args[:-1], in_url]) == 0
    printed = capsys.readouterr()
    assert secret not in printed.out + printed.err and ":***@127.0.0.1" in printed.out
    same_reads(own_redis_server.url, "graph", one_type_store)

    reader = connect(own_redis_server.url, 2000)
    stored = [
        reader.get(key) if reader.type(key) == b"string" else repr(reader.hgetall(key)).encode()
        for key in reader.scan_iter()
    ]
    reader.close()
    assert stored and not any(secret.encode() in value for value in stored)  # type: ignore[operator]

    os.chmod(password_file, 0o644)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "chmod 600" in err and secret not in err


def graph_memory(client: Any, prefix: str) -> int:
    """The bytes Redis holds for the graph under ``prefix``: MEMORY USAGE of each of its keys
    (key, value, allocator size classes). Not the difference of ``used_memory`` around the load:
    that also counts the key table, which grows in powers of two with whatever keys other tests
    left on the server, and client buffers, both tens of KB at this size."""
    keys = client.scan_iter(match=f"*{prefix}[:}}]*", count=1000)
    return sum(int(client.memory_usage(key, samples=0)) for key in keys)


def test_redis_memory_per_node_edge_and_feature_byte(
    single_redis: RedisServer, tmp_path: Path
) -> None:
    """Three synthetic graphs that differ in edges or in feature width only, loaded with the
    default layout: the differences in the memory Redis holds for each price an edge and a
    feature byte (docs/redis-cluster.md, "Sizing"), whatever else the server holds."""
    nodes, edges = 4000, 40_000
    client = connect(single_redis.url, 10_000)
    used: dict[str, int] = {}
    counts: dict[str, int] = {}
    for name, edge_count, width in (
        ("base", edges, 1),
        ("wide", edges, 65),
        ("dense", 2 * edges, 1),
    ):
        generate_synthetic(nodes, edge_count, tmp_path / name, feature_dim=width, seed=0)
        store = open_store(tmp_path / name)
        assert load_store(store, client, f"size-{name}", shown_url=single_redis.url).complete
        used[name] = graph_memory(client, f"size-{name}")
        counts[name] = store.num_edges
    client.close()
    per_feature_byte = (used["wide"] - used["base"]) / (nodes * 64 * 4)
    per_edge = (used["dense"] - used["base"]) / (counts["dense"] - counts["base"])
    per_node = (used["base"] - per_edge * counts["base"] - per_feature_byte * 4 * nodes) / nodes
    assert 1.0 <= per_feature_byte <= 1.3  # float32 rows, in jemalloc's size classes
    assert 4.0 <= per_edge <= 5.0  # an int32 source; edge IDs are CSC positions, not stored
    assert 40 <= per_node <= 120  # pointers, degrees, label, ID and its map entry, key overhead
