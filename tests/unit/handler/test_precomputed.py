"""Precomputed archives (model.precompute, handler.graph.precomputed): answers read stored rows
and stay equal to PyG's full-graph forward on the graph version they report, through random
streams of live updates, on every worker, whatever the fanouts."""

from __future__ import annotations

import json
import logging
import random
import time

import numpy as np
import pytest
import redis
import torch
from ts.context import RequestProcessor

from graph_assets import RawGraph, StoreError, open_store, write_store
from graph_assets.live.update_log import UpdateLog
from graph_assets.remote.connect import guarded
from handler.live.live_graph import LiveGraph, UpdateRequest
from handler.settings import ServingSettings
from handler.tasks.link.task import TASK as LINK
from handler.tasks.node.extras import NodeExtrasEngine
from handler.tasks.spec import Archive, Loaded
from model import build_model
from model.config import ModelConfig
from model.export import load_model
from model.link_assets import write_link_assets
from model.precompute import Precomputed, open_precomputed, precompute, weights_digest
from tests.edge_graph import edge_feature_store
from tests.live_reference import materialized_embeddings, materialized_forward, random_update
from tests.precomputed_engines import link_worker, node_worker, served

from .conftest import FEATURES, random_model, started

ARCHS = ["gcn", "sage", "gat", "gin"]


def engine_extras(engine):
    return NodeExtrasEngine(engine.ego, "1.0")


@pytest.mark.parametrize("arch", ARCHS)
def test_stored_rows_equal_the_full_graph_forward(int_store, tmp_path, arch):
    model = random_model(int_store, arch)
    engine, _ = node_worker(int_store, model, tmp_path / "rows")
    x = torch.from_numpy(np.array(int_store.features))
    with torch.no_grad():
        expected = torch.softmax(model(x, torch.from_numpy(int_store.edge_index())), dim=-1)
    ids = int_store.external_ids(np.arange(int_store.num_nodes))
    assert float((served(engine, ids) - expected).abs().max()) <= 1e-5


@pytest.mark.parametrize("arch", ARCHS)
def test_exact_after_300_random_updates_on_two_workers(int_store, tmp_path, arch):
    model = random_model(int_store, arch)
    log = tmp_path / "updates.log"
    first, live = node_worker(int_store, model, tmp_path / "rows", log)
    second, second_live = node_worker(int_store, model, tmp_path / "rows", log)
    rng, counter = random.Random(11), [0]
    for step in range(300):
        taker = live if step % 3 else second_live  # both workers take updates
        taker.update(UpdateRequest(random_update(rng, taker, counter)))
    ids, expected = materialized_forward(live, model)
    for engine in (first, second):
        assert float((served(engine, ids) - expected).abs().max()) <= 1e-5
    assert first.ego.precomputed.stats.updates > 0


@pytest.mark.parametrize("arch", ["gcn", "gat"])
def test_a_worker_started_after_the_updates_catches_up(int_store, tmp_path, arch):
    model = random_model(int_store, arch)
    log = tmp_path / "updates.log"
    _, live = node_worker(int_store, model, tmp_path / "rows", log)
    rng, counter = random.Random(5), [0]
    for _ in range(60):
        live.update(UpdateRequest(random_update(rng, live, counter)))
    late, late_live = node_worker(int_store, model, tmp_path / "rows", log)
    assert late_live.version == live.version
    ids, expected = materialized_forward(late_live, model)
    assert float((served(late, ids) - expected).abs().max()) <= 1e-5


def test_embeddings_are_the_stored_last_hidden_layer(int_store, tmp_path):
    model = random_model(int_store, "gat")
    engine, _ = node_worker(int_store, model, tmp_path / "rows")
    x = torch.from_numpy(np.array(int_store.features))
    with torch.no_grad():
        _, embedding = model.forward_with_embedding(x, torch.from_numpy(int_store.edge_index()))
    ids = int_store.external_ids(np.arange(5))
    (answer,) = engine_extras(engine).handle(
        [{"body": {"node_ids": ids, "return_embedding": True}}]
    )
    got = torch.tensor([p["embedding"] for p in answer.body["predictions"]])
    assert float((got - embedding[:5]).abs().max()) <= 1e-5


@pytest.mark.parametrize("direction", ["in", "out", "both"])
@pytest.mark.parametrize("arch", ARCHS)
def test_a_new_node_is_exact_from_the_stored_rows(int_store, tmp_path, arch, direction):
    model = random_model(int_store, arch, num_layers=3)
    engine, _ = node_worker(int_store, model, tmp_path / "rows", fanouts=(2, 2, 2))
    neighbours = int_store.external_ids(np.array([1, 5, 9, 30]))
    features = [0.25] * FEATURES
    body = {"new_node": {"x": features, "neighbors": neighbours, "direction": direction}}
    (answer,) = engine_extras(engine).handle([{"body": body}])
    assert answer.status == 200, answer.body
    n = int_store.num_nodes
    x = torch.cat((torch.from_numpy(np.array(int_store.features)), torch.tensor([features])))
    rows = int_store.lookup(neighbours).tolist()
    added = []
    if direction in ("in", "both"):
        added.append(torch.tensor([rows, [n] * len(rows)]))
    if direction in ("out", "both"):
        added.append(torch.tensor([[n] * len(rows), rows]))
    edge_index = torch.cat((torch.from_numpy(int_store.edge_index()), *added), dim=1)
    with torch.no_grad():
        expected = torch.softmax(model(x, edge_index), dim=-1)[n]
    assert float((torch.tensor(answer.body["probabilities"]) - expected).abs().max()) <= 1e-5


def test_a_hub_and_a_read_right_after_an_update_to_its_neighbour(tmp_path):
    """A node with 100,000 in-neighbours is answered exactly, before and after an update."""
    fans = 100_000
    rng = np.random.default_rng(0)
    ids = np.arange(fans + 1, dtype=np.int64)
    src = np.concatenate((np.arange(1, fans + 1), rng.integers(1, fans + 1, 2000)))
    dst = np.concatenate((np.zeros(fans, dtype=np.int64), rng.integers(1, fans + 1, 2000)))
    keep = src != dst
    raw = RawGraph(
        ids=ids,
        features=rng.standard_normal((fans + 1, FEATURES)).astype(np.float32),
        labels=rng.integers(0, 3, fans + 1),
        src=src[keep],
        dst=dst[keep],
        class_names=None,
        feature_names=[f"f{i}" for i in range(FEATURES)],
    )
    write_store(raw, tmp_path / "store")
    store = open_store(tmp_path / "store")
    model = random_model(store, "gcn")
    engine, live = node_worker(store, model, tmp_path / "rows", tmp_path / "updates.log")
    # The reference is PyG's forward on the raw arrays (IDs are row numbers here): reading the
    # live graph back node by node (materialized_forward) took 30 s of Python at this size.
    x = torch.from_numpy(raw.features.copy())
    edge_index = torch.from_numpy(np.stack((raw.src, raw.dst)))
    with torch.no_grad():
        expected = torch.softmax(model(x, edge_index), dim=-1)
    (answer,) = engine.handle([{"body": {"node_id": 0}}])
    assert float((torch.tensor(answer.body["probabilities"]) - expected[0]).abs().max()) <= 1e-5
    live.update(UpdateRequest([{"type": "set_features", "id": 7, "x": [3.0] * FEATURES}]))
    (after,) = engine.handle([{"body": {"node_id": 0}}])
    x[7] = 3.0
    with torch.no_grad():
        expected = torch.softmax(model(x, edge_index), dim=-1)
    assert after.body["graph_version"].endswith("+1")
    assert float((torch.tensor(after.body["probabilities"]) - expected[0]).abs().max()) <= 1e-5
    assert after.body["probabilities"] != answer.body["probabilities"]


def test_rows_of_other_weights_or_another_graph_are_refused(int_store, str_store, tmp_path):
    model = random_model(int_store, "sage")
    precompute(model, int_store, tmp_path / "p", "weights", progress=False)
    with pytest.raises(StoreError, match="other weights"):
        open_precomputed(tmp_path / "p", int_store, "other")
    with pytest.raises(StoreError, match="computed from graph"):
        open_precomputed(tmp_path / "p", str_store, "weights")
    layer = tmp_path / "p" / "layer_1.npy"
    data = bytearray(layer.read_bytes())
    data[-1] ^= 1
    layer.write_bytes(bytes(data))
    with pytest.raises(StoreError, match=r"layer_1\.npy has blake3"):
        open_precomputed(tmp_path / "p", int_store, "weights")


def link_model(store, arch):
    """A seeded link model of ``arch``."""
    torch.manual_seed(0)
    config = {"task": "link", "arch": arch, "in_dim": store.feature_dim, "out_dim": 8}
    return build_model({**config, "hidden_dim": 16}).eval()


@pytest.mark.parametrize("arch", ARCHS)
def test_link_pair_scores_read_the_stored_embeddings(int_store, tmp_path, arch):
    model = link_model(int_store, arch)
    engine, _ = link_worker(int_store, model, tmp_path)
    ids = int_store.external_ids(np.arange(int_store.num_nodes))
    pairs = [[ids[i], ids[(7 * i + 3) % len(ids)]] for i in range(40)]
    (answer,) = engine.handle([{"body": {"pairs": pairs}}])
    x = torch.from_numpy(np.array(int_store.features))
    with torch.no_grad():
        z = model(x, torch.from_numpy(int_store.edge_index()))
        rows = [(i, (7 * i + 3) % len(ids)) for i in range(40)]
        expected = torch.sigmoid(model.score(z[[a for a, _ in rows]], z[[b for _, b in rows]]))
    got = torch.tensor([p["score"] for p in answer.body["predictions"]])
    assert float((got - expected).abs().max()) <= 1e-5


@pytest.mark.parametrize("arch", ["gcn", "gat"])
def test_a_live_link_archive_scores_and_ranks_the_updated_graph(int_store, tmp_path, arch):
    model = link_model(int_store, arch)
    log = tmp_path / "updates.log"
    workers = [link_worker(int_store, model, tmp_path, log) for _ in range(2)]  # one log
    engines = [engine for engine, _ in workers]
    lives = [live for _, live in workers]
    rng, counter = random.Random(3), [0]
    for step in range(120):
        taker = lives[step % 2]
        taker.update(UpdateRequest(random_update(rng, taker, counter)))
    lives[0].sync()
    ids, z, edges = materialized_embeddings(lives[0], model)
    pairs = [[ids[i], ids[(7 * i + 3) % len(ids)]] for i in range(40)]
    expected = torch.sigmoid(
        model.score(z[[i for i in range(40)]], z[[(7 * i + 3) % len(ids) for i in range(40)]])
    )
    src = 5
    neighbours = {a for a, b in edges if b == src} | {b for a, b in edges if a == src} | {src}
    logits = model.score_against(z[src], z)
    ranked = [i for i in torch.argsort(logits, descending=True).tolist() if i not in neighbours]
    for engine in engines:
        (answer,) = engine.handle([{"body": {"pairs": pairs}}])
        assert answer.status == 200, answer.body
        assert answer.body["graph_version"].endswith("+120")
        got = torch.tensor([p["score"] for p in answer.body["predictions"]])
        assert float((got - expected).abs().max()) <= 1e-5
        (top,) = engine.handle([{"body": {"src": ids[src], "top_k": 5}}])
        assert [r["dst"] for r in top.body["recommendations"]] == [ids[i] for i in ranked[:5]]
        scores = torch.tensor([r["score"] for r in top.body["recommendations"]])
        assert float((scores - torch.sigmoid(logits[ranked[:5]])).abs().max()) <= 1e-5


def test_a_link_archive_that_takes_updates_without_precomputed_rows_is_refused(int_store, tmp_path):
    config = ModelConfig.from_dict(
        {"task": "link", "arch": "sage", "in_dim": int_store.feature_dim, "out_dim": 8}
    )
    model = build_model(config).eval()
    write_link_assets(model, int_store, tmp_path / "link")
    settings = ServingSettings.from_yaml_section({"task": "link", "updates_enabled": True})
    archive = Archive(tmp_path, settings, torch.device("cpu"), "1.0", "link")
    with pytest.raises(ValueError, match="needs precomputed rows"):
        LINK.start(archive, Loaded(model=model, config=config, store=int_store))


def test_the_handler_serves_a_precomputed_archive_and_reports_its_refreshes(
    model_dir, tmp_path, monkeypatch
):
    """Through GNNHandler: the archive's precomputed/ is found and checked, an update refreshes
    rows, the metrics and describe say so, and answers stay exact."""
    store = open_store(model_dir / "graph")
    model, _config = load_model(model_dir)
    precompute(
        model,
        store,
        model_dir / "precomputed",
        weights_digest(model_dir / "model.pt"),
        progress=False,
    )
    monkeypatch.setenv("GNNSERVE_UPDATE_SECRET", "s" * 24)
    handler, context = started(
        model_dir,
        2,
        fanouts=[2, 2],
        updates_enabled=True,
        update_state_dir=str(tmp_path / "state"),
        metrics_interval_s=0,
    )
    ids = store.external_ids(np.array([3, 6]))
    context.request_processor = [
        RequestProcessor({"x-gnnserve-update-key": "s" * 24}),
        RequestProcessor({}),
    ]
    update = {"op": "update", "operations": [{"type": "add_edge", "src": ids[0], "dst": ids[1]}]}
    data = [{"body": update}, {"body": {"node_id": ids[1]}}]
    bodies = [json.loads(item) for item in handler.handle(data, context)]
    assert [context.get_response_status(i)[0] for i in range(2)] == [200, 200], bodies
    recorded = dict(context.metrics.recorded)
    assert recorded["GnnPrecomputedRefreshRows"] > 0
    assert "GnnPrecomputedRefreshTime" in recorded and "GnnPrecomputedReadsRefreshed" in recorded
    described = json.loads(handler.describe_handle())
    assert described["precomputed"]["layers"] == 2
    assert described["precomputed"]["refreshed_updates"] == 1
    ids_now, expected = materialized_forward(handler.live, model)
    position = ids_now.index(ids[1])
    got = torch.tensor(bodies[1]["probabilities"])
    assert float((got - expected[position]).abs().max()) <= 1e-5


def test_an_update_marks_rows_and_a_read_recomputes_only_those_it_needs(int_store, tmp_path):
    model = random_model(int_store, "sage")
    engine, live = node_worker(int_store, model, tmp_path / "rows", tmp_path / "updates.log")
    rows = engine.ego.precomputed
    ids = int_store.external_ids(np.arange(int_store.num_nodes))
    live.update(UpdateRequest([{"type": "set_features", "id": ids[0], "x": [2.0] * FEATURES}]))
    marked = rows.pending_rows
    assert marked > 0 and rows.stats.rows == 0  # acknowledged after marking only
    far = next(i for i in range(int_store.num_nodes) if all(i not in p for p in rows.pending))
    served(engine, [ids[far]])
    assert rows.stats.rows == 0 and rows.stats.reads_refreshed == 0
    near = min(rows.pending[-1])
    served(engine, [ids[near]])
    assert 0 < rows.stats.rows < marked and rows.stats.reads_refreshed == 1
    while rows.drain(4):  # the follower's background steps, 4 rows at a time
        pass
    assert rows.pending_rows == 0
    everyone, expected = materialized_forward(live, model)
    assert float((served(engine, everyone) - expected).abs().max()) <= 1e-5


def test_set_edge_features_marks_the_destination_like_an_edge_change(tmp_path):
    """A set_edge_features changes its destination's in-edges as a layer sees them: the rows
    it reaches are marked as an added edge's would be, on a worker running and on one that
    starts after it; answers stay exact through updates that carry edge features."""
    store = edge_feature_store(tmp_path / "graph")
    model = random_model(store, "sage")
    log = tmp_path / "updates.log"
    engine, live = node_worker(store, model, tmp_path / "rows", log)
    hub = int(live.overlay.lookup(["acct_0"])[0])
    (source,) = live.overlay.external_ids(live.overlay.in_list(hub)[:1])
    operation = {"type": "set_edge_features", "src": source, "dst": "acct_0", "attr": [1, 2]}
    live.update(UpdateRequest([operation]))
    rows = engine.ego.precomputed
    assert all(hub in pending for pending in rows.pending)
    late, _ = node_worker(store, model, tmp_path / "rows", log)
    assert all(hub in pending for pending in late.ego.precomputed.pending)
    rng, counter = random.Random(4), [0]
    for _ in range(40):
        live.update(UpdateRequest(random_update(rng, live, counter)))
    ids, expected = materialized_forward(live, model)
    assert float((served(engine, ids) - expected).abs().max()) <= 1e-5


def test_the_follower_recomputes_marked_rows_in_the_background(int_store, tmp_path):
    model = random_model(int_store, "gcn")
    log = tmp_path / "updates.log"
    writer = LiveGraph(int_store, log)
    engine, live = node_worker(int_store, model, tmp_path / "rows", log, follow_interval_s=0.005)
    assert live is not None
    try:
        rng, counter = random.Random(2), [0]
        for _ in range(20):
            writer.update(UpdateRequest(random_update(rng, writer, counter)))
        rows = engine.ego.precomputed
        deadline = time.monotonic() + 30
        while (live.seq < 20 or rows.pending_rows) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert live.seq == 20 and rows.pending_rows == 0 and rows.stats.rows > 0
        assert rows.stats.reads_refreshed == 0
        ids, expected = materialized_forward(live, model)
        assert float((served(engine, ids) - expected).abs().max()) <= 1e-5
    finally:
        live.close()
        writer.close()


KEY = "s" * 24


def ask(handler, context, body: dict, key: str | None = None) -> tuple[int, dict]:
    """One request through GNNHandler: its status and JSON body."""
    context.request_processor = [RequestProcessor({"x-gnnserve-update-key": key} if key else {})]
    [raw] = handler.handle([{"body": body}], context)
    return context.get_response_status(0)[0], json.loads(raw)


def predicted(handler, context, ids: list) -> tuple[set[int], torch.Tensor | None, list]:
    """Every node's probabilities (None unless every request answered 200), the statuses and
    bodies."""
    answers = [ask(handler, context, {"node_ids": ids[i : i + 32]}) for i in range(0, len(ids), 32)]
    statuses = {status for status, _ in answers}
    if statuses != {200}:
        return statuses, None, [body for _, body in answers]
    rows = [p["probabilities"] for _, body in answers for p in body["predictions"]]
    return statuses, torch.tensor(rows), [body for _, body in answers]


def test_a_refresh_that_times_out_keeps_the_update_applied_and_never_serves_stale_rows(
    model_dir, tmp_path, monkeypatch, caplog
):
    """Redis times out while an update's rows are marked (the out-lists of rows kept in Redis,
    through the real connect.guarded): the update is durable and applied, answered 200 with
    rows_rebuilding (never "nothing was applied", so no client sends it again and no edge is
    doubled); predictions answer 503 until the rows are marked, then exactly; a worker whose
    replay met the same timeout moves on and keeps taking updates."""
    store = open_store(model_dir / "graph")
    model, _config = load_model(model_dir)
    precompute(
        model,
        store,
        model_dir / "precomputed",
        weights_digest(model_dir / "model.pt"),
        progress=False,
    )
    monkeypatch.setenv("GNNSERVE_UPDATE_SECRET", KEY)
    gnn = {
        "fanouts": [2, 2],
        "updates_enabled": True,
        "update_state_dir": str(tmp_path / "state"),
        "update_follow_interval_ms": 0,  # no follower: each batch catches up, in this order
        "metrics_interval_s": 0,
    }
    writer, writer_context = started(model_dir, 1, **gnn)
    replica, replica_context = started(model_dir, 1, **gnn)
    workers = [(writer, writer_context), (replica, replica_context)]
    down = {writer.task.precomputed.precomputed, replica.task.precomputed.precomputed}
    real_out_lists = Precomputed.out_neighbours

    def timed_out() -> None:
        raise redis.TimeoutError("Timeout reading from socket")

    def out_lists(self, nodes):
        if self in down:
            guarded("redis://graph:6379", timed_out)
        return real_out_lists(self, nodes)

    monkeypatch.setattr(Precomputed, "out_neighbours", out_lists)
    ids = store.external_ids(np.arange(store.num_nodes))
    src, dst = 3, 6
    before = int((writer.live.overlay.in_list(dst) == src).sum())
    add = {"op": "update", "operations": [{"type": "add_edge", "src": ids[src], "dst": ids[dst]}]}

    with caplog.at_level(logging.ERROR, logger="handler.live.live_graph"):
        status, body = ask(writer, writer_context, add, KEY)
    assert status == 200, body
    assert body["status"] == "applied" and body["seq"] == 1 and body["rows_rebuilding"] is True
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert "update seq 1 is applied" in line and "RemoteUnavailable" in line
    records, _ = UpdateLog.open(writer.live.log.path, writable=False).read_from(0)
    assert [r.seq for r in records] == [1] and len(records[0].operations) == 1
    assert int((writer.live.overlay.in_list(dst) == src).sum()) == before + 1
    assert json.loads(writer.describe_handle())["precomputed"]["unmarked_updates"] == 1

    for handler, context in workers:  # still down: 503, never the rows before the update
        statuses, rows, bodies = predicted(handler, context, ids)
        assert statuses == {503} and rows is None
        assert bodies[0]["type"] == "Unavailable" and "precomputed rows" in bodies[0]["message"]
    assert replica.live.seq == 1 and replica.live.failure is None and replica.live.lag == 0
    assert replica.task.precomputed.drain(256) == 0  # the follower's step: no error, no rows

    # The worker whose replay met the timeout takes the next update: not a duplicate, no 503.
    status, body = ask(replica, replica_context, add, KEY)
    assert status == 200 and body["seq"] == 2 and body["rows_rebuilding"] is True
    down.clear()  # Redis answers again
    assert writer.task.precomputed.drain(10_000) > 0  # the follower's step repairs, unread
    assert json.loads(writer.describe_handle())["precomputed"]["unmarked_updates"] == 0
    ids_now, expected = materialized_forward(replica.live, model)  # the writer is behind it
    for handler, context in workers:
        statuses, rows, bodies = predicted(handler, context, ids_now)
        assert statuses == {200} and rows is not None
        assert float((rows - expected).abs().max()) <= 1e-5
        assert bodies[0]["graph_version"].endswith("+2")
        assert json.loads(handler.describe_handle())["precomputed"]["unmarked_updates"] == 0
        assert int((handler.live.overlay.in_list(dst) == src).sum()) == before + 2
    records, _ = UpdateLog.open(writer.live.log.path, writable=False).read_from(0)
    assert [r.seq for r in records] == [1, 2]

    status, body = ask(writer, writer_context, add, KEY)  # later updates: as before the fault
    assert status == 200 and body["seq"] == 3 and body["rows_rebuilding"] is False
    ids_now, expected = materialized_forward(writer.live, model)
    statuses, rows, _ = predicted(writer, writer_context, ids_now)
    assert rows is not None and float((rows - expected).abs().max()) <= 1e-5
