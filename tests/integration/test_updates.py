"""Live graph updates through a real TorchServe with 4 workers: consistency and durability."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from tests.servers.torchserve import TorchServe

from .archives import build_archive, build_next_version, write_small_graph

pytestmark = pytest.mark.integration
SECRET = "integration-update-secret-42"
UPDATE_ENV = {"GNNSERVE_UPDATE_SECRET": SECRET}  # the workers inherit the server's environment


@pytest.fixture(scope="module")
def updates_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("updates")
    graph = write_small_graph(root / "graph")
    state = root / "state"
    store = build_archive(
        root / "model_store",
        graph,
        "--arch",
        "gcn",
        "--epochs",
        "2",
        "--fanouts",
        "-1,-1",
        "--batch-size",
        "1",
        "--min-workers",
        "4",
        "--max-workers",
        "4",
        "--enable-updates",
        "--update-state-dir",
        str(state),
    )
    return store, state


@pytest.fixture(scope="module")
def live_server(serve, updates_store) -> Iterator[TorchServe]:
    # A server of its own: the tests register a 2.0 of a model named gnn (the shared server's
    # node model), switch its default, and read which of its workers logged each batch.
    store, _ = updates_store
    with serve(store, "gnn=gnn.mar", name="live", env=UPDATE_ENV) as started:
        yield started


def update(server: TorchServe, operations: list[dict], key: str | None = SECRET, path: str = "gnn"):
    headers = server.auth("inference")
    if key is not None:
        headers["X-Gnnserve-Update-Key"] = key
    return requests.post(
        f"{server.inference_url}/predictions/{path}",
        json={"op": "update", "operations": operations},
        headers=headers,
        timeout=60,
    )


def predict(server: TorchServe, node, path: str = "gnn") -> requests.Response:
    return requests.post(
        f"{server.inference_url}/predictions/{path}",
        json={"node_id": node},
        headers=server.auth("inference"),
        timeout=60,
    )


def test_update_through_one_worker_is_read_by_all_four(live_server):
    x = [0.25] * 8
    response = update(
        live_server,
        [
            {"type": "add_node", "id": "acct_new", "x": x},
            {"type": "add_edge", "src": "acct_new", "dst": "acct_1"},
        ],
    )
    assert response.status_code == 200, response.text
    version = response.json()["graph_version"]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: predict(live_server, "acct_new"), range(48)))
    assert all(a.status_code == 200 for a in answers), [
        a.text for a in answers if a.status_code != 200
    ]
    assert {a.json()["graph_version"] for a in answers} == {version}
    # Each worker logs its first batch at once (handler.pipeline.metrics); the line may reach the
    # file after the answer reached us. Two different workers' lines: served by several.
    batch_line = r"(W-\d+)-\S+ MODEL_LOG - gnn batches:"
    live_server.wait_for_log(rf"{batch_line}[\s\S]*(?!\1)(W-\d+)-\S+ MODEL_LOG - gnn batches:")


def test_updates_need_the_update_key(live_server):
    for key in (None, "not-the-secret-at-all", live_server.keys()["inference"]):
        refused = update(live_server, [{"type": "remove_node", "id": "acct_2"}], key=key)
        assert refused.status_code == 403 and refused.json()["type"] == "Forbidden"
    assert predict(live_server, "acct_2").status_code == 200


def test_invalid_update_names_the_item_and_changes_nothing(live_server):
    before = predict(live_server, "acct_1").json()
    refused = update(
        live_server,
        [
            {"type": "add_edge", "src": "acct_3", "dst": "acct_1"},
            {"type": "add_edge", "src": "ghost", "dst": "acct_1"},
        ],
    )
    assert refused.status_code == 404 and "operation 1" in refused.json()["message"]
    assert predict(live_server, "acct_1").json() == before


def test_removed_node_answers_404(live_server):
    assert update(live_server, [{"type": "remove_node", "id": "acct_9"}]).status_code == 200
    gone = predict(live_server, "acct_9")
    assert gone.status_code == 404 and gone.json()["type"] == "NotFound"


def test_after_compaction_neither_version_loses_an_update(live_server, updates_store, tmp_path):
    model_store, state = updates_store
    management = live_server.auth("management")
    assert update(live_server, [{"type": "remove_node", "id": "acct_8"}]).status_code == 200
    log = next(state.glob("*/updates.log"))
    checksum = build_next_version(model_store, ["--log", str(log)], tmp_path)
    # acknowledged by 1.0 after compaction read the log: 2.0 must still see it
    late = update(live_server, [{"type": "add_node", "id": "acct_late", "x": [0.5] * 8}])
    assert late.status_code == 200, late.text
    registered = requests.post(
        f"{live_server.management_url}/models",
        params={"url": "gnn_v2.0.mar", "initial_workers": 1, "synchronous": "true"},
        headers=management,
        timeout=300,
    )
    assert registered.status_code == 200, registered.text
    moved = requests.put(
        f"{live_server.management_url}/models/gnn/2.0/set-default", headers=management, timeout=60
    )
    assert moved.status_code == 200, moved.text
    answer = predict(live_server, "acct_late")
    assert answer.status_code == 200, answer.text
    assert answer.json()["model_version"] == "2.0"
    assert answer.json()["graph_version"] == f"{checksum[:12]}+{late.json()['seq']}"
    assert predict(live_server, "acct_8").status_code == 404  # removed before compaction

    # sent to 2.0 (now the default), read on 1.0; a removed ID is refused by both
    sent = update(live_server, [{"type": "add_node", "id": "acct_from_v2", "x": [1.0] * 8}])
    assert sent.status_code == 200 and sent.json()["seq"] == late.json()["seq"] + 1, sent.text
    read = predict(live_server, "acct_from_v2", path="gnn/1.0")
    assert read.status_code == 200, read.text
    assert read.json()["graph_version"].endswith(f"+{sent.json()['seq']}")
    for path in ("gnn/1.0", "gnn/2.0"):
        again = update(
            live_server, [{"type": "add_node", "id": "acct_8", "x": [0.0] * 8}], path=path
        )
        assert again.status_code == 409 and "IDs are not reused" in again.json()["message"]
    assert len(list(state.glob("*/updates.log"))) == 1  # one log for the whole lineage


def test_kill_9_right_after_an_acknowledged_update_loses_nothing(serve, tmp_path, updates_store):
    store, state = updates_store
    # A server of its own: it is killed with kill -9 and started again.
    with serve(store, "gnn=gnn.mar", home=tmp_path / "crash", env=UPDATE_ENV) as server:
        acknowledged = update(server, [{"type": "add_node", "id": "acct_durable", "x": [1.0] * 8}])
        assert acknowledged.status_code == 200
        server.kill()
        server.start("gnn=gnn.mar")
        answer = predict(server, "acct_durable")
        assert answer.status_code == 200, answer.text
        assert answer.json()["graph_version"] == acknowledged.json()["graph_version"]

        # a torn tail (a crash mid-append) is reported and skipped; earlier updates survive
        server.stop()
        log = next(state.glob("*/updates.log"))
        with log.open("ab") as tail:
            tail.write(b"GNUP\x40\x00\x00\x00garbage")
        server.start("gnn=gnn.mar")
        assert predict(server, "acct_durable").status_code == 200
        model_log = (server.home / "logs" / "model_log.log").read_text()
        assert "torn" in model_log and "truncated payload" in model_log


@pytest.fixture()
def tiny_state_volume(tmp_path: Path) -> Iterator[Path]:
    """A 3 MiB tmpfs for the update log, as a small or full state volume would be."""
    mount = tmp_path / "state-volume"
    mount.mkdir(mode=0o700)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=3m,mode=0700", "tmpfs", str(mount)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"mounting a tmpfs needs root: {mounted.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        if subprocess.run(["umount", str(mount)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(mount)], check=False)


def write_until_full(server: TorchServe, writer: int) -> dict[str, list]:
    """One client sending 150-node updates (~13 KB records) until the volume has refused it
    three times; returns the acknowledged requests' node IDs and every status seen."""
    acknowledged: list[list[str]] = []
    statuses: list[int] = []
    for i in range(400):
        ids = [f"w{writer}_{i}_{j}" for j in range(150)]
        answer = update(server, [{"type": "add_node", "id": n, "x": [0.5] * 8} for n in ids])
        statuses.append(answer.status_code)
        if answer.status_code == 200:
            acknowledged.append(ids)
        else:
            assert answer.json()["type"] == "InsufficientStorage", answer.text
        if statuses[-3:] == [507, 507, 507]:
            break
    return {"acknowledged": acknowledged, "statuses": statuses}


def test_a_full_state_volume_loses_no_acknowledged_update(serve, tmp_path, tiny_state_volume):
    graph = write_small_graph(tmp_path / "graph")
    options = ["--arch", "gcn", "--epochs", "2", "--fanouts", "-1,-1", "--batch-size", "4"]
    workers = ["--min-workers", "2", "--max-workers", "2", "--enable-updates"]
    store = build_archive(
        tmp_path / "model_store",
        graph,
        *options,
        *workers,
        "--update-state-dir",
        str(tiny_state_volume),
    )
    # A server of its own: it is killed with kill -9 and started again on the full volume.
    with serve(store, "gnn=gnn.mar", home=tmp_path / "server", env=UPDATE_ENV) as server:
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda w: write_until_full(server, w), range(8)))
        statuses = [status for result in results for status in result["statuses"]]
        assert set(statuses) == {200, 507}, "the volume never filled, or another status came"
        acknowledged = [ids for result in results for ids in result["acknowledged"]]
        probes = [ids[k] for ids in acknowledged for k in (0, -1)]  # each record's ends

        def answered(node: str) -> tuple[int, str]:
            answer = predict(server, node)
            return answer.status_code, answer.json().get("graph_version", answer.text)

        with ThreadPoolExecutor(8) as pool:  # both workers, while the volume is still full
            seen = list(pool.map(answered, probes * 2))
        assert {status for status, _ in seen} == {200}
        assert len({version for _, version in seen}) == 1
        model_log = (server.home / "logs" / "model_log.log").read_text()
        assert "unreadable" not in model_log and "cannot apply" not in model_log

        server.kill()
        server.start("gnn=gnn.mar")
        with ThreadPoolExecutor(8) as pool:
            after = list(pool.map(answered, probes))
        assert after == [seen[0]] * len(probes)  # every acknowledged node, same graph version
