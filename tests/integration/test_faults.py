"""Faults injected into a real TorchServe under load: the server never gives a wrong answer.

One server for the module, serving ``gnn`` (the fault archive: 2 workers, the test-only
fault_handler.py, full neighbourhoods) and ``tiny`` (the production handler with a 20-node
ego-graph limit). Every load is bounded in requests and seconds; workers are killed by PID.
The measured figures are printed (``pytest -s``) for the reliability report.
"""

from __future__ import annotations

import json
import os
import signal
import time
import zipfile
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from tests.servers.torchserve import Serve, TorchServe

from .archives import build_archive
from .faults import (
    FAULT_HANDLER,
    LONER_ID,
    MARKER_IDS,
    UNICODE_ID,
    LoadDriver,
    reference_answers,
    repack,
    summary,
    wait_for_exit,
    wait_for_workers,
    worker_pids,
    write_fault_graph,
)

pytestmark = pytest.mark.integration
BATCH_SIZE = 8
WORKERS = 2
RECOVERY_LIMIT_S = 60.0  # a fresh worker imports torch and maps the graph; slower on a loaded host
GRACE_S = 2.0  # after a restart, for each client to meet the new keys once
GOOD_NODES = [f"acct_{i}" for i in range(0, 120, 3)] + [UNICODE_ID, LONER_ID]


@pytest.fixture(scope="module")
def archives(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fault_archives")
    built = build_archive(
        root / "built",
        write_fault_graph(root / "graph"),
        "--arch",
        "gcn",
        "--epochs",
        "3",  # answers are held to the archive's own, not to its accuracy
        "--fanouts",
        "-1,-1",
        "--batch-size",
        str(BATCH_SIZE),
        "--max-batch-delay",
        "20",
        "--min-workers",
        str(WORKERS),
        "--max-workers",
        str(WORKERS),
        "--device",
        "cpu",
    )
    store = root / "model_store"
    store.mkdir()
    repack(built / "gnn.mar", store / "gnn.mar", handler=FAULT_HANDLER)
    repack(
        built / "gnn.mar",
        store / "tiny.mar",
        yaml_changes={"minWorkers": 1, "maxWorkers": 1, "gnn": {"max_subgraph_nodes": 20}},
    )
    return store


@pytest.fixture(scope="module")
def server(serve: Serve, archives: Path) -> Iterator[TorchServe]:
    # A server of its own: these tests kill its workers, stop and restart it under load, and
    # read its logs for the fault archive's lines.
    with serve(archives, "gnn=gnn.mar,tiny=tiny.mar", name="fault_server") as started:
        yield started


@pytest.fixture(scope="module")
def expected(server: TorchServe) -> dict[str, list[float]]:
    return reference_answers(server, GOOD_NODES)


def post(server: TorchServe, payload: dict, model: str = "gnn") -> requests.Response:
    return requests.post(
        f"{server.inference_url}/predictions/{model}",
        json=payload,
        headers=server.auth("inference"),
        timeout=60,
    )


def burst(server: TorchServe, payloads: list[dict]) -> list[requests.Response]:
    """All at once, so TorchServe batches them (maxBatchDelay 20 ms)."""
    with ThreadPoolExecutor(max_workers=len(payloads)) as pool:
        return list(pool.map(lambda p: post(server, p), payloads))


def model_log(server: TorchServe) -> str:
    return (server.home / "logs" / "model_log.log").read_text(errors="replace")


def report(name: str, **figures: object) -> None:
    print(f"\n[fault] {name}: " + json.dumps(figures, default=str))


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("bug", "the model failed on this request"),
        ("oom", "ran out of memory during model"),
        ("cuda_oom", "ran out of memory during model"),
    ],
)
def test_a_request_that_breaks_the_model_gets_500_alone(server, expected, fault, message):
    before = worker_pids(server, "gnn")
    good = GOOD_NODES[:7]
    payloads = [{"node_id": n} for n in good[:3]] + [{"node_id": MARKER_IDS[fault]}]
    payloads += [{"node_id": n} for n in good[3:]]
    responses = burst(server, payloads)
    statuses = [r.status_code for r in responses]
    assert statuses == [200] * 3 + [500] + [200] * 4, [r.text[:200] for r in responses]
    error = responses[3].json()
    assert error["code"] == 500 and error["type"] == "InternalError"
    assert message in error["message"]
    for node, response in zip(good, responses[:3] + responses[4:], strict=True):
        assert response.json()["node_id"] == node
        got, want = response.json()["probabilities"], expected[node]
        assert max(abs(a - b) for a, b in zip(got, want, strict=True)) <= 1e-5
    assert worker_pids(server, "gnn") == before  # no worker died
    batched = "batch forward failed; retrying its requests one by one" in model_log(server)
    report(f"model {fault}", statuses=statuses, retried_in_batch=batched, same_workers=True)


def test_an_oversized_ego_graph_is_refused_up_front(server):
    before = worker_pids(server, "tiny")
    start = time.monotonic()
    hub = post(server, {"node_ids": [f"acct_{i}" for i in range(16)]}, model="tiny")
    elapsed = time.monotonic() - start
    assert hub.status_code == 413, hub.text
    body = hub.json()
    assert body["type"] == "TooLarge" and "max_subgraph_nodes" in body["message"]
    assert elapsed < 5, "refused before sampling it all, far from the 60 s response timeout"
    alone = post(server, {"node_id": LONER_ID}, model="tiny")
    assert alone.status_code == 200, alone.text
    assert worker_pids(server, "tiny") == before
    report("oversized ego-graph", status=413, seconds=round(elapsed, 3), message=body["message"])


def test_kill_9_one_worker_under_load(server, expected):
    driver = LoadDriver(server, expected, connections=32, max_requests=20_000, max_seconds=90)
    driver.start()
    try:
        driver.wait_for(200)
        victim = worker_pids(server, "gnn")[0]
        killed_at = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        recovery = wait_for_workers(server, "gnn", WORKERS, {victim}, RECOVERY_LIMIT_S)
        recovered_at = time.monotonic()
        driver.wait_for(500)
    finally:
        records = driver.stop()
    check_worker_loss(records, killed_at, recovered_at, recovery, "kill -9 one worker")


def test_a_cuda_error_ends_the_worker_and_it_comes_back(server, expected):
    """A sticky CUDA error (simulated) makes the worker exit; TorchServe starts a fresh one."""
    before = set(worker_pids(server, "gnn"))
    driver = LoadDriver(server, expected, connections=32, max_requests=20_000, max_seconds=90)
    driver.start()
    try:
        driver.wait_for(200)
        failed_at = time.monotonic()
        poisoned = post(server, {"node_id": MARKER_IDS["cuda_error"]})
        victim = wait_for_exit(before, timeout=10)
        recovery = wait_for_workers(server, "gnn", WORKERS, {victim}, RECOVERY_LIMIT_S)
        recovered_at = time.monotonic()
        driver.wait_for(500)
    finally:
        records = driver.stop()
    assert poisoned.status_code >= 500  # it died with its worker: TorchServe's "Worker died"
    assert len(before - set(worker_pids(server, "gnn"))) == 1, "exactly one worker was replaced"
    assert "unrecoverable device error" in model_log(server)
    check_worker_loss(records, failed_at, recovered_at, recovery, "CUDA error in one worker")


def check_worker_loss(records, fault_at, recovered_at, recovery, name) -> None:
    """Only requests in flight on the lost worker (one batch) fail; nothing is ever wrong;
    every request sent after the replacement is READY is answered correctly."""
    figures = summary(records)
    not_ok = [r for r in records if r.outcome != "ok"]
    assert not [r for r in records if r.outcome == "wrong"], figures
    assert len(not_ok) <= BATCH_SIZE, figures
    assert all(r.sent <= fault_at + 1.0 for r in not_ok), figures
    after = [r for r in records if r.sent >= recovered_at]
    assert after and all(r.outcome == "ok" for r in after), figures
    first_ok = min((r.done for r in records if r.sent > fault_at and r.outcome == "ok"), default=0)
    report(
        name,
        requests=len(records),
        failed=len(not_ok),
        failed_statuses=[r.status for r in not_ok],
        replacement_ready_s=round(recovery, 2),
        first_correct_answer_after_s=round(first_ok - fault_at, 3),
    )


def test_a_corrupt_archive_fails_to_register_with_one_clear_line(server, archives, expected):
    def wrong_arch(name: str, data: bytes) -> bytes:
        if name != "model_config.json":
            return data
        return json.dumps({**json.loads(data), "arch": "gat"}).encode()

    def tampered_graph(name: str, data: bytes) -> bytes:
        if name == "graph/features.0.npy":
            return data[:-1] + bytes([data[-1] ^ 0xFF])
        if name == "graph/meta.json":  # a graph the shared cache has not seen yet
            meta = json.loads(data)
            meta["checksum"] = "0" * 64
            return json.dumps(meta).encode()
        return data

    cases = {
        "wrongarch": (wrong_arch, "model.pt do not match the GAT that the model config"),
        "tampered": (tampered_graph, "graph/features.0.npy has blake3"),
    }
    for name, (edit, problem) in cases.items():
        repack(archives / "tiny.mar", archives / f"{name}.mar", edit=edit)
        response = requests.post(
            f"{server.management_url}/models",
            params={"url": f"{name}.mar", "model_name": name, "synchronous": "true"},
            headers=server.auth("management"),
            timeout=120,
        )
        assert response.status_code == 500, response.text
        assert "Failed to start workers" in response.json()["message"]
        lines = [
            line
            for line in model_log(server).splitlines()
            if f"-{name}_1.0-" in line and "gnn worker refuses to start: " in line
        ]
        assert lines and all(problem in line for line in lines), lines
        # A worker that dies while loading (ValueError) gets the model unregistered; one that
        # answers the load with an error (RuntimeError, e.g. StoreError) leaves it registered
        # with no worker (TorchServe 0.12). Either way it never answers a prediction.
        registered = (
            name
            in requests.get(
                f"{server.management_url}/models", headers=server.auth("management"), timeout=10
            ).text
        )
        if registered:
            assert not worker_pids(server, name)
            refused = post(server, {"node_id": GOOD_NODES[0]}, model=name)
            assert refused.status_code == 503, refused.text
            removed = requests.delete(
                f"{server.management_url}/models/{name}",
                headers=server.auth("management"),
                timeout=60,
            )
            assert removed.status_code == 200, removed.text
        report(
            f"corrupt archive {name}",
            status=500,
            left_registered=registered,
            log_line=lines[0].split("MODEL_LOG - ")[-1],
        )
    assert reference_answers(server, GOOD_NODES[:5]) == {n: expected[n] for n in GOOD_NODES[:5]}


def test_stop_and_start_the_server_under_load(server, expected):
    """Runs last: the restarted server has new keys and new workers."""
    driver = LoadDriver(server, expected, connections=32, max_requests=30_000, max_seconds=150)
    driver.start()
    try:
        driver.wait_for(200)
        stopped_at = time.monotonic()
        server.restart("gnn=gnn.mar,tiny=tiny.mar")
        restarted_at = time.monotonic()
        time.sleep(GRACE_S + 1)  # every client's stale token has been refused and re-read
        driver.wait_for(500)
    finally:
        records = driver.stop()
    figures = summary(records)
    assert not [r for r in records if r.outcome == "wrong"], figures
    window = (stopped_at - 1, restarted_at + GRACE_S)
    # the batches in flight when the workers got SIGTERM fail ("Worker died."); nothing else
    failed = [r for r in records if r.outcome == "failed"]
    assert len(failed) <= WORKERS * BATCH_SIZE, figures
    assert all(window[0] <= r.sent <= stopped_at + 1 for r in failed), figures
    refused = [r for r in records if r.outcome == "refused"]
    assert refused and all(window[0] <= r.sent <= window[1] for r in refused), figures
    after = [r for r in records if r.sent > restarted_at + GRACE_S]
    assert after and all(r.outcome == "ok" for r in after), figures
    again = reference_answers(server, GOOD_NODES)
    assert again == {n: expected[n] for n in GOOD_NODES}, "answers changed across the restart"
    gap = [r for r in records if r.sent >= stopped_at]
    first_ok = min(r.done for r in gap if r.outcome == "ok")
    report(
        "stop and start under load",
        requests=len(records),
        failed_in_flight=len(failed),
        refused=len(refused),
        refusal_kinds=dict(Counter(f"{r.status} {r.detail[:40]}" for r in refused)),
        restart_s=round(restarted_at - stopped_at, 2),
        first_correct_answer_after_s=round(first_ok - stopped_at, 2),
        identical_after_restart=True,
    )


def test_the_fault_archive_serves_unicode_isolated_and_repeated_edges(archives, expected):
    """Built from a graph with a unicode ID, an isolated node, a self-loop and parallel edges
    (kept as given and counted in meta.json, as docs/graph-format.md says)."""
    meta = json.loads(zipfile.ZipFile(archives / "gnn.mar").read("graph/meta.json"))
    assert meta["stats"]["self_loops_kept"] >= 1
    assert meta["stats"]["duplicate_edges_kept"] >= 2
    assert UNICODE_ID in expected and LONER_ID in expected  # both served 200 by the server
