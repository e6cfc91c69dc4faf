"""Precomputed archives of a graph served from a real Redis Cluster (model.precompute's rows
loaded beside the graph, graph_assets.remote.rows): a node archive (a recipe, a typed recipe)
and a link archive answer as the same archive over the local store, then again after the same
seeded random stream of live updates (<= 1e-6, the same classes, the same top-k); rows of
another build are refused at start in one line."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from graph_assets import GraphStore, StoreError
from graph_assets.remote import RemoteDataCorrupt, RemoteDataLost, RemoteStore, open_remote_store
from graph_assets.remote.connect import connect
from graph_assets.remote.layout import CHECK_BYTES, sealed, unsealed
from graph_assets.remote.loader import load_store
from graph_assets.remote.rows import OUT_FIELD, rows_field
from handler.graph.ego import EgoGraphs
from handler.live.live_graph import LiveGraph, UpdateRequest
from handler.settings import ServingSettings
from handler.tasks.link.engine import LinkEngine
from handler.tasks.node.engine import NodeClassificationEngine
from handler.tasks.node.extras import NodeExtrasEngine
from model import build_model
from model.link_assets import open_link_assets, write_link_assets
from model.precompute import (
    Precomputed,
    load_to_redis,
    open_precomputed,
    open_remote_precomputed,
    precompute,
)
from tests.live_reference import live_ids, random_update
from tests.servers.redis_cluster import LocalCluster
from tests.typed_graphs import fraud_store, node_recipe
from tests.typed_live_reference import live_nodes, random_typed_update

from .conftest import random_model

UPDATES = 60
TOLERANCE = 1e-6


@pytest.fixture(scope="module")
def cluster(redis_cluster: LocalCluster) -> LocalCluster:
    """The session's Redis Cluster (tests/conftest.py), empty for this module."""
    return redis_cluster


@dataclass
class Pair:
    """The same archive's rows over the local store and over the cluster."""

    local: Precomputed
    remote: Precomputed
    graph: RemoteStore


def pair(
    cluster: LocalCluster, store: GraphStore, model: torch.nn.Module, home: Path, prefix: str
) -> Pair:
    """Precomputes ``model``'s rows, loads the graph and then the rows into the cluster under
    ``prefix`` (small blocks: a read spans many groups), and opens both."""
    directory = home / "precomputed"
    precompute(model, store, directory, "weights", chunk_edges=64, progress=False)
    client = connect(cluster.url, 5000)
    try:
        assert load_store(store, client, prefix, shown_url=cluster.url, block_size=8).complete
    finally:
        client.close()
    load_to_redis(directory, f"{cluster.url}/{prefix}", store.checksum)
    graph = open_remote_store(cluster.url, prefix, store.checksum, cache_mb=1, timeout_ms=5000)
    return Pair(
        open_precomputed(directory, store, "weights"),
        open_remote_precomputed(directory, graph, "weights"),
        graph,
    )


def node_engines(
    rows: Pair, store: GraphStore, model: torch.nn.Module, home: Path
) -> list[tuple[NodeClassificationEngine, LiveGraph]]:
    """A worker over the local store and one over the cluster, each on its own log."""
    settings = ServingSettings.from_yaml_section({"fanouts": [2, 2]})
    engines = []
    for name, graph, precomputed in (
        ("local", store, rows.local),
        ("remote", rows.graph, rows.remote),
    ):
        live = LiveGraph(graph, home / f"{name}.log")
        engine = NodeClassificationEngine.create(
            graph, model, settings, torch.device("cpu"), "1.0", live, precomputed=precomputed
        )
        engines.append((engine, live))
    return engines


def answers(engine: NodeClassificationEngine, ids: list, node_type: str | None) -> torch.Tensor:
    typed = {} if node_type is None else {"node_type": node_type}
    bodies = [{"node_ids": ids[i : i + 32], **typed} for i in range(0, len(ids), 32)]
    replies = engine.handle([{"body": body} for body in bodies])
    assert all(r.status == 200 for r in replies), [r.body for r in replies if r.status != 200]
    return torch.tensor([p["probabilities"] for r in replies for p in r.body["predictions"]])


def same_answers(
    engines: list[tuple[NodeClassificationEngine, LiveGraph]], node_type: str | None
) -> None:
    (local, live), (remote, _) = engines
    if node_type is None:
        ids = live_ids(live)
    else:
        nodes = live_nodes(live, live.store.schema.type_index(node_type))
        ids = live.overlay.external_ids(nodes)
    mine, theirs = answers(local, ids, node_type), answers(remote, ids, node_type)
    assert float((mine - theirs).abs().max()) <= TOLERANCE
    assert torch.equal(mine.argmax(dim=1), theirs.argmax(dim=1))


def stream(engines: list[tuple[NodeClassificationEngine, LiveGraph]], typed: bool) -> None:
    """The same seeded random updates, drawn from the local worker's graph, to both."""
    rng, counter = random.Random(11), [0]
    local = engines[0][1]
    for _ in range(UPDATES):
        raw = (random_typed_update if typed else random_update)(rng, local, counter)
        for _, live in engines:
            live.update(UpdateRequest(raw))


def same_extras(engines: list[tuple[NodeClassificationEngine, LiveGraph]]) -> None:
    """Embeddings and a new node's answer (both directions) alike on both workers."""
    ids = live_ids(engines[0][1])
    features = [0.25] * engines[0][1].store.feature_dim
    bodies = [
        {"node_ids": ids[:20], "return_embedding": True},
        {"new_node": {"x": features, "neighbors": ids[1:9:2], "direction": "both"}},
    ]
    (a, b) = (
        NodeExtrasEngine(engine.ego, "1.0").handle([{"body": body} for body in bodies])
        for engine, _ in engines
    )
    assert all(r.status == 200 for r in a + b), [r.body for r in a + b]
    mine = torch.tensor([p["embedding"] for p in a[0].body["predictions"]])
    theirs = torch.tensor([p["embedding"] for p in b[0].body["predictions"]])
    assert float((mine - theirs).abs().max()) <= TOLERANCE
    gap = np.abs(np.subtract(a[1].body["probabilities"], b[1].body["probabilities"])).max()
    assert gap <= TOLERANCE


@pytest.mark.parametrize("arch", ["gcn", "sage"])
def test_a_node_archive_answers_alike_from_the_cluster_before_and_after_updates(
    cluster: LocalCluster, int_store: GraphStore, tmp_path: Path, arch: str
) -> None:
    model = random_model(int_store, arch)
    rows = pair(cluster, int_store, model, tmp_path, f"rows_{arch}")
    engines = node_engines(rows, int_store, model, tmp_path)
    try:
        same_answers(engines, None)
        stream(engines, typed=False)
        same_answers(engines, None)
        same_extras(engines)
        assert rows.graph.counters.round_trips > 0
    finally:
        for _, live in engines:
            live.close()
        rows.graph.close()


def test_a_typed_node_archive_answers_alike_from_the_cluster_before_and_after_updates(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    store = fraud_store(tmp_path / "fraud", 120, 20, 30, 500, seed=4)
    model = node_recipe(store, "sage", hidden=8)
    rows = pair(cluster, store, model, tmp_path, "rows_typed")
    engines = node_engines(rows, store, model, tmp_path)
    try:
        same_answers(engines, store.schema.target)
        stream(engines, typed=True)
        same_answers(engines, store.schema.target)
    finally:
        for _, live in engines:
            live.close()
        rows.graph.close()


def test_a_link_archive_scores_and_ranks_alike_from_the_cluster_before_and_after_updates(
    cluster: LocalCluster, int_store: GraphStore, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    config = {"task": "link", "arch": "gcn", "in_dim": int_store.feature_dim, "out_dim": 8}
    model = build_model({**config, "hidden_dim": 16}).eval()
    write_link_assets(model, int_store, tmp_path / "link")
    rows = pair(cluster, int_store, model, tmp_path, "rows_link")
    settings = ServingSettings.from_yaml_section({"task": "link", "fanouts": [2, 2]})
    engines, lives = [], []
    for name, graph, precomputed in (
        ("local", int_store, rows.local),
        ("remote", rows.graph, rows.remote),
    ):
        live = LiveGraph(graph, tmp_path / f"{name}.log")
        ego = EgoGraphs.create(graph, model, settings, torch.device("cpu"), live, precomputed)
        assets = open_link_assets(tmp_path / "link", int_store)
        engines.append(LinkEngine(ego, assets, "1.0"))
        lives.append(live)

    def check() -> None:
        ids = live_ids(lives[0])
        pairs = [[ids[i], ids[(7 * i + 3) % len(ids)]] for i in range(40)]
        bodies = [{"pairs": pairs}] + [{"src": ids[i], "top_k": 10} for i in (0, 5, 17)]
        local, remote = (e.handle([{"body": body} for body in bodies]) for e in engines)
        assert all(a.status == 200 for a in local + remote), [a.body for a in local + remote]
        mine = torch.tensor([p["score"] for p in local[0].body["predictions"]])
        theirs = torch.tensor([p["score"] for p in remote[0].body["predictions"]])
        assert float((mine - theirs).abs().max()) <= TOLERANCE
        for a, b in zip(local[1:], remote[1:], strict=True):
            found = [r["dst"] for r in a.body["recommendations"]]
            assert found == [r["dst"] for r in b.body["recommendations"]]
            scores = [r["score"] for r in a.body["recommendations"]]
            other = [r["score"] for r in b.body["recommendations"]]
            assert np.allclose(scores, other, atol=TOLERANCE, rtol=0)

    try:
        check()
        rng, counter = random.Random(5), [0]
        for _ in range(UPDATES):
            raw = random_update(rng, lives[0], counter)
            for live in lives:
                live.update(UpdateRequest(raw))
        check()
    finally:
        for live in lives:
            live.close()
        rows.graph.close()


def test_two_builds_rows_live_side_by_side_and_unloaded_rows_are_refused_in_one_line(
    cluster: LocalCluster, int_store: GraphStore, tmp_path: Path
) -> None:
    model = random_model(int_store, "sage")
    rows = pair(cluster, int_store, model, tmp_path / "first", "rows_refused")
    try:
        again = tmp_path / "second" / "precomputed"
        other = random_model(int_store, "gcn")
        precompute(other, int_store, again, "other", chunk_edges=64, progress=False)
        with pytest.raises(StoreError, match=r"holds no precomputed rows \w+ of this") as error:
            open_remote_precomputed(again, rows.graph, "other")
        assert "\n" not in str(error.value)
        load_to_redis(again, f"{cluster.url}/rows_refused", int_store.checksum)
        second = open_remote_precomputed(again, rows.graph, "other")
        nodes = np.arange(int_store.num_nodes, dtype=np.int64)
        local = open_precomputed(again, int_store, "other")
        assert np.array_equal(second.read(1, nodes), local.read(1, nodes))
        assert np.array_equal(rows.remote.read(1, nodes), rows.local.read(1, nodes))
    finally:
        rows.graph.close()


def test_a_read_of_many_rows_or_out_lists_is_one_round_trip(
    cluster: LocalCluster, int_store: GraphStore, tmp_path: Path
) -> None:
    model = random_model(int_store, "gcn")
    rows = pair(cluster, int_store, model, tmp_path, "rows_rounds")
    try:
        nodes = np.arange(0, int_store.num_nodes, 3, dtype=np.int64)
        for read in (
            lambda: rows.remote.read(1, nodes),
            lambda: rows.remote.out_neighbours(nodes),
        ):
            before = rows.graph.counters.round_trips
            read()
            assert rows.graph.counters.round_trips == before + 1
            read()  # now from the rows' cache
            assert rows.graph.counters.round_trips == before + 1
        expected = rows.local.read(1, nodes)
        assert np.array_equal(rows.remote.read(1, nodes), expected)
        assert np.array_equal(rows.remote.out_neighbours(nodes), rows.local.out_neighbours(nodes))
    finally:
        rows.graph.close()


def test_lost_changed_or_non_finite_rows_are_refused_naming_their_key(
    cluster: LocalCluster, int_store: GraphStore, tmp_path: Path
) -> None:
    """The rows carry checksums as the graph's blocks do: rows scaled at their length, a NaN
    row under a matching checksum and a deleted out-list are refused (the error table answers
    them 503), never served; the other blocks are still read."""
    model = random_model(int_store, "sage")
    rows = pair(cluster, int_store, model, tmp_path, "rows_poisoned")
    try:
        remote = rows.remote.remote
        assert remote is not None
        keys = rows.graph.keys
        scaled = keys.block(1, rows_field(remote.rows, 1))
        nan = keys.block(2, rows_field(remote.rows, 1))
        lost = keys.block(3, OUT_FIELD)
        client = connect(cluster.url, 5000)
        try:
            raw = client.get(scaled)
            assert isinstance(raw, bytes)
            values = np.frombuffer(raw[:-CHECK_BYTES], dtype="<f4") * -3  # its checksum kept
            client.set(scaled, values.astype("<f4").tobytes() + raw[-CHECK_BYTES:])
            raw = client.get(nan)
            assert isinstance(raw, bytes)
            values = np.frombuffer(unsealed(raw), dtype="<f4").copy()  # type: ignore[arg-type]
            values[3] = np.nan
            client.set(nan, sealed(values.tobytes()))
            assert client.delete(lost) == 1
        finally:
            client.close()
        block = np.arange(8, dtype=np.int64)
        for nodes, read, kind, key, what in (
            (block + 8, remote.read, RemoteDataCorrupt, scaled, "fails its checksum"),
            (block + 16, remote.read, RemoteDataCorrupt, nan, "holds a non-finite value"),
            (block + 24, lambda _, nodes: remote.out_neighbours(nodes), RemoteDataLost, lost,
             "is missing (evicted or deleted?)"),
        ):  # fmt: skip
            with pytest.raises(kind) as refused:
                read(1, nodes)
            assert refused.value.key == key
            assert f"the precomputed rows' key {key} {what}; rebuild the archive" in str(
                refused.value
            )
        assert np.array_equal(remote.read(1, block), rows.local.read(1, block))
    finally:
        rows.graph.close()
