"""Live graphs of several servers on one Redis stream: the same records in seq order on every
one, writers racing for a seq, read-your-writes by version, and Redis going away and back."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest
import redis
import torch

from graph_assets.errors import UpdateLogUnavailable
from graph_assets.live.redis_log import RedisLogConfig
from handler.live.errors import UpdatesHalted
from handler.live.live_graph import LiveGraph, UpdatePolicy, UpdateRequest
from tests.live_reference import live_ids, materialized_forward, random_update

from .conftest import answer_update, make_engine, random_model


def replicas(store, redis_server, count: int = 2, **kwargs) -> list[LiveGraph]:
    config = RedisLogConfig(redis_server.url, timeout_s=0.5)
    return [LiveGraph(store, None, redis_log=config, **kwargs) for _ in range(count)]


def answers(live: LiveGraph, model, ids) -> torch.Tensor:
    engine = make_engine(live.store, model=model, live=live, fanouts=[-1, -1])
    responses = engine.handle([{"body": {"node_ids": list(ids)}}])
    assert responses[0].status == 200, responses[0].body
    return torch.tensor([p["probabilities"] for p in responses[0].body["predictions"]])


@pytest.mark.parametrize("arch", ["gcn", "sage"])
def test_random_updates_at_random_replicas_give_one_graph_equal_to_pyg(
    int_store, redis_server, arch
):
    rng = random.Random(7)
    lives = replicas(int_store, redis_server, count=3)
    model, counter = random_model(int_store, arch), [0]
    for _ in range(120):
        writer = rng.choice(lives)
        writer.sync()
        seq = writer.update(UpdateRequest(random_update(rng, writer, counter))).seq
        reader = rng.choice(lives)
        assert reader.catch_up(seq, timeout_s=5)  # read-your-writes at another replica
        assert reader.seq >= seq
    for live in lives:
        live.sync()
    assert {live.version for live in lives} == {lives[0].version}
    ids, expected = materialized_forward(lives[0], model)
    for live in lives:
        assert (answers(live, model, ids) - expected).abs().max() <= 1e-5


def test_racing_writers_never_share_a_seq(int_store, redis_server):
    """Each replica validates against the graph it holds; the loser of a race for a seq
    catches up and validates again, so both updates land, in some order, once each."""
    first, second = replicas(int_store, redis_server)
    x = [0.1] * int_store.feature_dim
    assert first.update(UpdateRequest([{"type": "add_node", "id": 90_001, "x": x}])).seq == 1
    # second has not seen seq 1: its write of seq 1 loses, it catches up and writes seq 2
    assert second.update(UpdateRequest([{"type": "add_node", "id": 90_002, "x": x}])).seq == 2
    first.sync()
    assert first.version == second.version
    assert (first.overlay.lookup([90_001, 90_002]) >= 0).all()


def test_redis_down_serves_the_last_version_and_refuses_updates(int_store, own_redis_server):
    live, other = replicas(int_store, own_redis_server)
    model = random_model(int_store, "sage")
    x = [0.2] * int_store.feature_dim
    live.update(UpdateRequest([{"type": "add_node", "id": 90_010, "x": x}]))
    some = live_ids(live)[:3]
    served = answers(live, model, some)
    own_redis_server.kill()
    assert torch.equal(answers(live, model, some), served)  # the last version, no error
    assert live.unreachable is not None and live.log_errors >= 1
    with pytest.raises(UpdateLogUnavailable, match="unreachable"):  # 503
        live.update(UpdateRequest([{"type": "add_node", "id": 90_011, "x": x}]))
    assert live.seq == 1 and live.overlay.lookup([90_011])[0] < 0  # nothing half-applied
    own_redis_server.start()
    assert live.update(UpdateRequest([{"type": "add_node", "id": 90_012, "x": x}])).seq == 2
    assert live.unreachable is None
    assert other.catch_up(2, timeout_s=5) and other.version == live.version


def test_an_append_whose_answer_times_out_is_not_called_unapplied(
    int_store, redis_server, monkeypatch
):
    """Redis wrote the record, then its answer timed out: the 503 says the update may be in
    the log as seq 1 (a client checks graph_version instead of sending an add_edge twice), and
    the writer applies its own record from the log once Redis answers, once."""
    live, other = replicas(int_store, redis_server)
    src, dst = int_store.external_ids(np.array([3, 6]))
    before = int((live.overlay.in_list(6) == 3).sum())
    real = live.log._append_after

    def written_then_timed_out(*args, **kwargs):
        real(*args, **kwargs)
        raise redis.TimeoutError("Timeout reading from socket")

    monkeypatch.setattr(live.log, "_append_after", written_then_timed_out)
    status, body = answer_update(
        {"op": "update", "operations": [{"type": "add_edge", "src": src, "dst": dst}]},
        "update-secret-0123456789",
        live,
        UpdatePolicy(secret="update-secret-0123456789", max_operations=10),
    )
    assert status == 503 and body["type"] == "Unavailable"
    assert "may have been written as seq 1" in body["message"] and "below +1" in body["message"]
    assert "nothing was applied" not in body["message"]
    monkeypatch.undo()
    assert live.catch_up(1, timeout_s=5) and other.catch_up(1, timeout_s=5)
    for replica in (live, other):  # the edge once, on every replica
        assert replica.seq == 1 and int((replica.overlay.in_list(6) == 3).sum()) == before + 1
    assert redis_server.client().xlen(live.log.key) == 1


def test_acknowledged_updates_survive_redis_killed(int_store, own_redis_server):
    live, _ = replicas(int_store, own_redis_server)
    x = [0.3] * int_store.feature_dim
    for i in range(40):
        live.update(UpdateRequest([{"type": "add_node", "id": 91_000 + i, "x": x}]))
    own_redis_server.kill()  # appendfsync always: what was acknowledged is on disk
    own_redis_server.start()
    fresh = replicas(int_store, own_redis_server, count=1)[0]
    assert fresh.seq == 40
    assert (fresh.overlay.lookup([91_000 + i for i in range(40)]) >= 0).all()


def test_a_log_that_lost_records_stops_updates(int_store, own_redis_server):
    live, _ = replicas(int_store, own_redis_server)
    x = [0.4] * int_store.feature_dim
    live.update(UpdateRequest([{"type": "add_node", "id": 92_000, "x": x}]))
    own_redis_server.client().flushall()  # what a Redis without its append-only file does
    with pytest.raises(UpdatesHalted):  # 503: the append sees it: nothing is written after a gap
        live.update(UpdateRequest([{"type": "add_node", "id": 92_001, "x": x}]))
    assert live.failure is not None and "lost acknowledged records" in live.failure.reason
    assert own_redis_server.client().xlen(live.log.key) == 0


def test_the_follower_applies_other_replicas_updates_and_comes_back(int_store, own_redis_server):
    writer, follower = replicas(int_store, own_redis_server, count=1) + replicas(
        int_store, own_redis_server, count=1, follow_interval_s=0.005
    )
    try:
        x = [0.5] * int_store.feature_dim
        writer.update(UpdateRequest([{"type": "add_node", "id": 93_000, "x": x}]))
        wait_for(lambda: follower.seq == 1)
        own_redis_server.kill()
        wait_for(lambda: follower.unreachable is not None)
        own_redis_server.start()
        writer.update(UpdateRequest([{"type": "add_node", "id": 93_001, "x": x}]))
        wait_for(lambda: follower.seq == 2 and follower.unreachable is None)
        assert follower.lag == 0 and follower.log_errors >= 1
        assert sorted(map(str, live_ids(follower))) == sorted(map(str, live_ids(writer)))
    finally:
        follower.close()


def wait_for(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the condition did not hold in time"
        time.sleep(0.005)


def test_catch_up_gives_up_at_its_deadline(int_store, redis_server):
    (live,) = replicas(int_store, redis_server, count=1)
    assert live.catch_up(0, timeout_s=0) and not live.catch_up(1, timeout_s=0.05)
    assert np.array_equal(live.overlay.lookup([0]), int_store.lookup([0]))
