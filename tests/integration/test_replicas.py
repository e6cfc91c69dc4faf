"""Three TorchServe instances following one Redis update log, as replicas behind a load
balancer: every read that names an acknowledged update sees it, all instances end on the same
graph and equal PyG's full-graph forward on it, and kills of an instance or of Redis lose
nothing acknowledged."""

from __future__ import annotations

import contextlib
import io
import json
import random
import zipfile
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
import torch

from graph_assets import open_store
from graph_assets.live.redis_log import RedisLogConfig
from handler.live.live_graph import LiveGraph
from model import build_model
from tests.live_reference import materialized_forward, random_update
from tests.servers.redis_server import RedisServer
from tests.servers.torchserve import TorchServe

from .archives import build_archive, build_next_version, write_small_graph

pytestmark = pytest.mark.integration
SECRET = "replica-update-secret-42"
PROTECTED = [f"acct_{i}" for i in range(10)]  # never removed: every read targets one of them
MODELS = "gnn=gnn.mar"


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def replica_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("replicas")
    graph = write_small_graph(root / "graph")
    return build_archive(
        root / "model_store",
        graph,
        *("--arch", "gcn", "--epochs", "2", "--fanouts", "-1,-1", "--max-ids", "16"),
        *("--batch-size", "4", "--max-batch-delay", "5", "--min-workers", "2"),
        *("--max-workers", "2", "--enable-updates"),
    )


@pytest.fixture(scope="module")
def replicas(serve, replica_store, redis) -> Iterator[list[TorchServe]]:
    # Servers of their own: three replicas on one Redis log (its URL reaches the workers
    # through the environment), one of them killed and restarted.
    env = {"GNNSERVE_UPDATE_SECRET": SECRET, "GNNSERVE_UPDATE_LOG_URL": redis.url}
    with contextlib.ExitStack() as stack:
        yield [
            stack.enter_context(serve(replica_store, MODELS, name=f"replica{i}", env=env))
            for i in range(3)
        ]


@pytest.fixture(scope="module")
def reference(
    replica_store, redis, tmp_path_factory
) -> Iterator[tuple[LiveGraph, torch.nn.Module]]:
    """The archive's graph and weights in this process, following the same stream."""
    work = tmp_path_factory.mktemp("reference")
    with zipfile.ZipFile(replica_store / "gnn.mar") as archive:
        archive.extractall(work, [n for n in archive.namelist() if n.startswith("graph/")])
        model = build_model(json.loads(archive.read("model_config.json")))
        model.load_state_dict(torch.load(io.BytesIO(archive.read("model.pt")), weights_only=True))
    live = LiveGraph(open_store(work / "graph"), None, redis_log=RedisLogConfig(redis.url))
    try:
        yield live, model.eval()
    finally:
        live.close()


def update(server: TorchServe, operations: list[dict], path: str = "gnn") -> requests.Response:
    headers = {**server.auth("inference"), "X-Gnnserve-Update-Key": SECRET}
    body = {"op": "update", "operations": operations}
    return requests.post(
        f"{server.inference_url}/predictions/{path}", json=body, headers=headers, timeout=60
    )


def predict(server: TorchServe, body: dict) -> requests.Response:
    url = f"{server.inference_url}/predictions/gnn"
    return requests.post(url, json=body, headers=server.auth("inference"), timeout=60)


def seq_of(version: str) -> int:
    return int(version.rsplit("+", 1)[1])


def next_operations(rng: random.Random, reference: LiveGraph, counter: list[int]) -> list[dict]:
    reference.sync()
    operations = random_update(rng, reference, counter)
    if operations[0]["type"] == "remove_node" and operations[0]["id"] in PROTECTED:
        return [{"type": "set_features", "id": operations[0]["id"], "x": [0.5] * 8}]
    return operations


def send_stream(replicas, reference, rng, count: int, counter: list[int]) -> list[dict]:
    """``count`` updates, each to a random replica, each read back at another random replica
    with its ``min_graph_version`` while the stream goes on; returns the acknowledged answers."""
    acknowledged, reads = [], []
    with ThreadPoolExecutor(4) as pool:
        for _ in range(count):
            answer = update(rng.choice(replicas), next_operations(rng, reference, counter))
            assert answer.status_code == 200, answer.text
            acknowledged.append(answer.json())
            body = {
                "node_id": rng.choice(PROTECTED),
                "min_graph_version": answer.json()["graph_version"],
            }
            reads.append((answer.json()["seq"], pool.submit(predict, rng.choice(replicas), body)))
        check_reads(reads)
    return acknowledged


def check_reads(reads: list[tuple[int, Future[requests.Response]]]) -> None:
    for seq, future in reads:
        read = future.result()
        assert read.status_code == 200, read.text
        assert seq_of(read.json()["graph_version"]) >= seq  # it saw its write


def served_everywhere(replicas, ids: list, version: str) -> list[torch.Tensor]:
    """Every replica's answers for ``ids``, each read asking for ``version`` at least (a worker
    whose follower has not read the log yet catches up first)."""
    tables = []
    for replica in replicas:
        rows = []
        for start in range(0, len(ids), 16):
            body = {"node_ids": ids[start : start + 16], "min_graph_version": version}
            answer = predict(replica, body)
            assert answer.status_code == 200, answer.text
            rows += [p["probabilities"] for p in answer.json()["predictions"]]
        tables.append(torch.tensor(rows))
    return tables


def assert_all_equal_pyg(replicas, reference: tuple[LiveGraph, torch.nn.Module], seq: int) -> None:
    live, model = reference
    assert live.catch_up(seq, timeout_s=10)
    ids, expected = materialized_forward(live, model)
    for table in served_everywhere(replicas, ids, live.version):
        assert float((table - expected).abs().max()) <= 1e-5


def test_a_random_stream_is_read_back_everywhere_and_ends_equal_to_pyg(replicas, reference):
    rng, counter = random.Random(11), [0]
    acknowledged = send_stream(replicas, reference[0], rng, 60, counter)
    last = acknowledged[-1]["seq"]
    versions = {
        predict(
            r, {"node_id": "acct_0", "min_graph_version": acknowledged[-1]["graph_version"]}
        ).json()["graph_version"]
        for r in replicas
    }
    assert versions == {acknowledged[-1]["graph_version"]}
    assert_all_equal_pyg(replicas, reference, last)


def test_an_instance_killed_mid_stream_catches_up(replicas, reference):
    rng, counter = random.Random(12), [500]
    send_stream(replicas, reference[0], rng, 10, counter)
    victim = replicas[1]
    victim.kill()
    survivors = [replicas[0], replicas[2]]
    acknowledged = send_stream(survivors, reference[0], rng, 15, counter)
    victim.start(MODELS)
    body = {"node_id": "acct_1", "min_graph_version": acknowledged[-1]["graph_version"]}
    answer = predict(victim, body)
    assert answer.status_code == 200, answer.text
    assert_all_equal_pyg(replicas, reference, acknowledged[-1]["seq"])


def test_redis_killed_after_a_burst_keeps_every_acknowledged_update(replicas, reference, redis):
    x = [0.75] * 8
    with ThreadPoolExecutor(6) as pool:
        answers = list(
            pool.map(
                lambda i: update(
                    replicas[i % 3], [{"type": "add_node", "id": f"burst_{i}", "x": x}]
                ),
                range(24),
            )
        )
    assert all(a.status_code == 200 for a in answers), [
        a.text for a in answers if a.status_code != 200
    ]
    newest = max(answers, key=lambda a: a.json()["seq"]).json()["graph_version"]
    redis.kill()
    redis.start()
    for replica in replicas:
        # Each read carries the version, as a client that must see its writes does: without
        # it, the replica's other worker may answer before its follower has read the log.
        for ids in (range(16), range(16, 24)):
            body = {"node_ids": [f"burst_{i}" for i in ids], "min_graph_version": newest}
            read = predict(replica, body)
            assert read.status_code == 200, read.text
    assert_all_equal_pyg(replicas, reference, seq_of(newest))


def test_with_redis_stopped_reads_go_on_and_updates_wait(replicas, redis):
    before = [predict(r, {"node_id": "acct_2"}).json()["graph_version"] for r in replicas]
    redis.stop()
    try:
        for replica, version in zip(replicas, before, strict=True):
            read = predict(replica, {"node_id": "acct_2"})
            assert read.status_code == 200 and read.json()["graph_version"] == version
            refused = update(replica, [{"type": "add_node", "id": "while_down", "x": [0.1] * 8}])
            assert refused.status_code == 503, refused.text
    finally:
        redis.start()
    assert (
        predict(replicas[0], {"node_id": "while_down"}).status_code == 404
    )  # nothing half-applied
    back = update(replicas[1], [{"type": "add_node", "id": "after_restart", "x": [0.1] * 8}])
    assert back.status_code == 200, back.text
    for replica in replicas:
        read = predict(
            replica, {"node_id": "after_restart", "min_graph_version": back.json()["graph_version"]}
        )
        assert read.status_code == 200, read.text


def test_a_replica_started_while_redis_is_down_does_not_become_ready(replicas, redis):
    server = replicas[0]
    redis.stop()
    try:
        response = requests.post(
            f"{server.management_url}/models",
            params={"url": "gnn.mar", "model_name": "late", "synchronous": "true"},
            headers=server.auth("management"),
            timeout=120,
        )
    finally:
        redis.start()
    assert response.status_code == 500, response.text
    text = server.wait_for_log(r"-late_1\.0-.*gnn worker refuses to start: update log redis://")
    refusals = [line for line in text.splitlines() if "-late_1.0-" in line and "refuses" in line]
    assert all(f"127.0.0.1:{redis.port}" in line and "unreachable" in line for line in refusals)
    requests.delete(
        f"{server.management_url}/models/late", headers=server.auth("management"), timeout=60
    )


def test_a_compacted_version_continues_the_stream_on_every_replica(
    replicas, replica_store, redis, tmp_path
):
    """Updates sent to either version on any replica while each replica registers 2.0 and
    makes it the default: none is lost, on either version, anywhere."""
    before = update(replicas[0], [{"type": "add_node", "id": "before_compaction", "x": [0.2] * 8}])
    assert before.status_code == 200, before.text
    checksum = build_next_version(replica_store, ["--log-url", redis.url], tmp_path)
    sent, ids = [], ["before_compaction"]

    def send(replica: TorchServe, path: str) -> None:
        ids.append(f"switch_{len(ids)}")
        answer = update(replica, [{"type": "add_node", "id": ids[-1], "x": [0.3] * 8}], path)
        assert answer.status_code == 200, answer.text
        sent.append(answer.json())

    send(replicas[1], "gnn")  # after compaction read the stream: 2.0 must still see it
    for replica in replicas:
        headers = replica.auth("management")
        registered = requests.post(
            f"{replica.management_url}/models",
            params={"url": "gnn_v2.0.mar", "initial_workers": 1, "synchronous": "true"},
            headers=headers,
            timeout=300,
        )
        assert registered.status_code == 200, registered.text
        send(replicas[0], "gnn/2.0")
        send(replicas[2], "gnn/1.0")
        moved = requests.put(
            f"{replica.management_url}/models/gnn/2.0/set-default", headers=headers, timeout=60
        )
        assert moved.status_code == 200, moved.text
    newest = max(sent, key=lambda answer: answer["seq"])
    for replica in replicas:
        for path in ("gnn/1.0", "gnn/2.0"):
            body = {"node_ids": ids, "min_graph_version": newest["graph_version"]}
            read = requests.post(
                f"{replica.inference_url}/predictions/{path}",
                json=body,
                headers=replica.auth("inference"),
                timeout=60,
            )
            assert read.status_code == 200, read.text
            assert seq_of(read.json()["graph_version"]) >= newest["seq"]
        version = predict(replica, {"node_id": "before_compaction"}).json()["graph_version"]
        assert version.startswith(checksum[:12])  # 2.0, the compacted graph, is the default
