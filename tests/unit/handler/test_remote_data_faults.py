"""Graph data in Redis that is lost or corrupt is never served: values poisoned in a real
redis-server (features scaled at their length, a NaN row under a matching checksum, an ID-map
entry pointing at the next node's row, a deleted key) answer the requests that read them 503
naming what is wrong, the key in the worker log, never a class and never "the model failed";
the same batch's other requests and the next request answer as the local store does, and so
does the poisoned request once the load is run again (its verify pass rewrites the value)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import torch

from graph_assets import GraphStore
from graph_assets.remote import load_store, open_remote_store
from graph_assets.remote.connect import Client, connect
from graph_assets.remote.layout import (
    CHECK_BYTES,
    Keys,
    RemoteLayout,
    id_shards,
    key_array,
    sealed,
    unsealed,
)
from handler.settings import ServingSettings
from handler.tasks.node.engine import NodeClassificationEngine
from handler.tasks.node.task import node_router
from tests.servers.redis_server import RedisServer

from .conftest import random_model

BLOCK = 8
POISONED = 2  # the block whose values are poisoned: nodes 16-23
SEED = 2 * BLOCK + 3  # a node of it, requested
CORRUPT = (
    "graph data this request needs is corrupt in the graph store (a value that fails its "
    "checks); the server log names the key and how to restore it"
)
LOST = (
    "graph data this request needs is missing from the graph store (a lost key); the server "
    "log names the key and how to restore it"
)

Answers = list[tuple[int, dict]]


@pytest.fixture()
def graph(redis_server: RedisServer, int_store: GraphStore) -> Iterator[tuple[str, Client]]:
    """The store loaded under ``faulty`` (blocks of 8 nodes), and a client to poison it."""
    client = connect(redis_server.url, 5000)
    try:
        report = load_store(
            int_store, client, "faulty", shown_url=redis_server.url, block_size=BLOCK
        )
        assert report.complete
        yield redis_server.url, client
    finally:
        client.close()


def answering(graph: GraphStore | str, store: GraphStore) -> Callable[[list[dict]], Answers]:
    """``bodies -> [(status, body)]`` from a node engine on ``graph`` (the store itself, or a
    Redis URL holding it under ``faulty``, read through a cold cache)."""
    served = graph
    if isinstance(graph, str):
        served = open_remote_store(graph, "faulty", store.checksum, cache_mb=4, timeout_ms=5000)
    settings = ServingSettings.from_yaml_section({"fanouts": [-1, -1]})
    model = random_model(store, "sage")
    engine = NodeClassificationEngine.create(served, model, settings, torch.device("cpu"), "1.0")
    router = node_router(engine, "1.0")
    return lambda bodies: [(r.status, r.body) for r in router.handle([{"body": b} for b in bodies])]


def same(answer: tuple[int, dict], expected: tuple[int, dict]) -> bool:
    """The same answer: status, node, class and label; probabilities within float rounding (a
    batch of one and a batch of two sum in another order)."""
    (status, body), (want_status, want) = answer, expected
    if status != want_status or body.keys() != want.keys():
        return False
    gap = np.abs(np.array(body["probabilities"]) - np.array(want["probabilities"])).max()
    rest = {k: v for k, v in body.items() if k != "probabilities"}
    return gap <= 1e-6 and rest == {k: v for k, v in want.items() if k != "probabilities"}


def clean_node(store: GraphStore) -> int:
    """A node with no in-edges outside the poisoned block: its ego-graph reads none of it."""
    nodes = np.arange(store.num_nodes)
    alone = nodes[np.diff(np.asarray(store.indptr)) == 0]
    alone = alone[alone // BLOCK != POISONED]
    assert len(alone)
    return int(alone[-1])


def reload(url: str, client: Client, store: GraphStore) -> list[str]:
    report = load_store(store, client, "faulty", shown_url=url, block_size=BLOCK)
    assert report.complete and report.verified == report.chunks
    return report.repaired


def check_refused_then_served(
    url: str,
    client: Client,
    store: GraphStore,
    message: str,
    key: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The poisoned request answers 503 ``message`` (the key logged), its batch's clean one and
    the next request 200 as the local store answers; after a reload, the poisoned one too."""
    seed_id, clean_id = store.external_ids(np.array([SEED, clean_node(store)]))
    local = answering(store, store)
    expected = local([{"node_id": seed_id}, {"node_id": clean_id}])
    assert [status for status, _ in expected] == [200, 200]
    remote = answering(url, store)
    with caplog.at_level(logging.ERROR):
        (status, body), clean = remote([{"node_id": seed_id}, {"node_id": clean_id}])
    assert status == 503 and body["type"] == "Unavailable" and body["message"] == message
    assert "predicted_class" not in body and url not in body["message"]
    assert key in caplog.text
    assert same(clean, expected[1])
    assert same(remote([{"node_id": clean_id}])[0], expected[1])  # the next request
    assert remote([{"node_id": seed_id}])[0][0] == 503  # refused until reloaded, not cached
    assert reload(url, client, store) == ["b0"]
    assert same(remote([{"node_id": seed_id}])[0], expected[0])


def test_features_changed_at_their_length_are_refused_by_their_checksum(
    graph: tuple[str, Client], int_store: GraphStore, caplog: pytest.LogCaptureFixture
) -> None:
    url, client = graph
    key = Keys("faulty").block(POISONED, "x0")
    raw = client.get(key)
    assert isinstance(raw, bytes)
    scaled = np.frombuffer(raw[:-CHECK_BYTES], dtype="<f4") * -3  # changed a class before
    client.set(key, scaled.astype("<f4").tobytes() + raw[-CHECK_BYTES:])
    check_refused_then_served(url, client, int_store, CORRUPT, key, caplog)


def test_a_nan_feature_row_is_refused_even_under_a_matching_checksum(
    graph: tuple[str, Client], int_store: GraphStore, caplog: pytest.LogCaptureFixture
) -> None:
    url, client = graph
    key = Keys("faulty").block(POISONED, "x0")
    raw = client.get(key)
    assert isinstance(raw, bytes)
    rows = np.frombuffer(unsealed(raw), dtype="<f4").reshape(BLOCK, -1).copy()  # type: ignore[arg-type]
    rows[SEED % BLOCK] = np.nan
    client.set(key, sealed(rows.tobytes()))
    check_refused_then_served(url, client, int_store, CORRUPT, key, caplog)


def test_a_lost_key_is_missing_graph_data_not_a_model_failure(
    graph: tuple[str, Client], int_store: GraphStore, caplog: pytest.LogCaptureFixture
) -> None:
    url, client = graph
    key = Keys("faulty").block(POISONED, "x0")
    assert client.delete(key) == 1
    check_refused_then_served(url, client, int_store, LOST, key, caplog)


def test_an_id_pointed_at_another_nodes_row_is_refused_not_answered_for_it(
    graph: tuple[str, Client], int_store: GraphStore, caplog: pytest.LogCaptureFixture
) -> None:
    """ID of node 5 pointed at node 6's row answered node 6's prediction labelled with node
    5's ID: refused naming the map's key; node 6 itself is still answered."""
    url, client = graph
    store = int_store
    asked, other = store.external_ids(np.array([5, 6]))
    layout = RemoteLayout.of_store(store, BLOCK)
    array = key_array([asked], layout.id_dtypes[0])
    key = Keys("faulty").id_shard(0, int(id_shards(array, layout.id_shards[0])[0]))
    remote = answering(url, store)
    assert client.hget(key, str(asked)) == b"5"
    client.hset(key, str(asked), b"6")
    expected = answering(store, store)([{"node_id": asked}, {"node_id": other}])
    with caplog.at_level(logging.ERROR):
        (status, body), found = remote([{"node_id": asked}, {"node_id": other}])
    assert status == 503 and body["type"] == "Unavailable" and body["message"] == CORRUPT
    assert f"key {key} holds ID {asked!r} -> node 6, whose row holds ID {other!r}" in caplog.text
    assert same(found, expected[1])
    assert same(remote([{"node_id": other}])[0], expected[1])  # the next request
    assert reload(url, client, store) == ["i0.0"]
    assert same(remote([{"node_id": asked}])[0], expected[0])
