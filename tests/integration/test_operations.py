"""Operating a real TorchServe: versions, default switch, scaling, metrics, logs, shared graph.

Every management call goes through scripts/gnnctl.py, the CLI operators use, while a client
loop keeps sending predictions; the loops count every failed request.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from tests.servers.torchserve import TorchServe, worker_processes

from .archives import ROOT, build_archive, write_small_graph

pytestmark = pytest.mark.integration
SECRET = "acct_secret_marker_7f3a"


@pytest.fixture(scope="module")
def versions_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """gnn.mar (1.0, sage) and gnn_v2.0.mar (2.0, gcn) built from one graph."""
    root = tmp_path_factory.mktemp("versions")
    graph = write_small_graph(root / "graph")
    store = root / "model_store"
    common = [
        "--epochs",
        "3",  # no test here checks accuracy
        "--batch-size",
        "4",
        "--max-batch-delay",
        "20",
        # bounds how long a request lost by a scaled-down worker hangs (see the scaling test)
        "--response-timeout",
        "10",
    ]
    build_archive(store, graph, "--arch", "sage", *common)
    build_archive(store, graph, "--arch", "gcn", "--version", "2.0", *common)
    return store


@pytest.fixture(scope="module")
def ops_server(serve, versions_store) -> Iterator[TorchServe]:
    # A server of its own: gnnctl registers versions of a model named gnn (the shared server's
    # node model), switches its default and scales it, and the tests read its metrics and logs.
    with serve(versions_store, "gnn=gnn.mar", name="ops") as started:
        yield started


def gnnctl(server: TorchServe, *args: str) -> dict | list:
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "gnnctl.py"),
            "--management",
            server.management_url,
            "--key-file",
            str(server.home / "key_file.json"),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


class ClientLoop:
    """Sends predictions until stopped; records every status and the versions answering."""

    def __init__(self, server: TorchServe, path: str = "/predictions/gnn") -> None:
        self.url = server.inference_url + path
        self.headers = server.auth("inference")
        self.statuses: Counter[int] = Counter()
        self.versions: list[str] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,)) for i in range(4)]

    def _run(self, worker: int) -> None:
        session = requests.Session()
        sent = 0
        while not self._stop.is_set() and sent < 5000:
            node = f"acct_{(worker * 31 + sent) % 120}"
            sent += 1
            try:
                response = session.post(
                    self.url, json={"node_id": node}, headers=self.headers, timeout=20
                )
            except requests.RequestException as error:
                self.failures.append(repr(error))
                continue
            self.statuses[response.status_code] += 1
            if response.status_code == 200:
                self.versions.append(response.json()["model_version"])
            else:
                self.failures.append(response.text[:200])

    def __enter__(self) -> ClientLoop:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=120)


def test_register_second_version_beside_the_first(ops_server):
    # POST /models?url=gnn_v2.0.mar&initial_workers=2: the archives name no worker count, so
    # the register call's initial_workers applies, and the start's default_workers_per_model=1.
    registered = gnnctl(ops_server, "register", "gnn_v2.0.mar", "--workers", "2")
    assert "registered" in json.dumps(registered).lower() or "2.0" in json.dumps(registered)
    described = gnnctl(ops_server, "status", "gnn")
    workers = {entry["modelVersion"]: len(entry["workers"]) for entry in described}
    assert workers == {"1.0": 1, "2.0": 2}
    for version in ("1.0", "2.0"):
        response = requests.post(
            f"{ops_server.inference_url}/predictions/gnn/{version}",
            json={"node_id": "acct_1"},
            headers=ops_server.auth("inference"),
            timeout=60,
        )
        assert response.status_code == 200 and response.json()["model_version"] == version


def test_registering_an_existing_version_again_is_refused(ops_server):
    response = requests.post(
        f"{ops_server.management_url}/models",
        params={"url": "gnn_v2.0.mar"},
        headers=ops_server.auth("management"),
        timeout=60,
    )
    assert response.status_code == 409
    assert "already registered" in response.json()["message"]


def test_set_default_switches_traffic_with_no_failed_request(ops_server):
    with ClientLoop(ops_server) as loop:
        while sum(loop.statuses.values()) < 40:
            threading.Event().wait(0.05)
        gnnctl(ops_server, "set-default", "gnn", "2.0")
        before = len(loop.versions)
        while len(loop.versions) < before + 60:
            threading.Event().wait(0.05)
    assert loop.failures == [] and set(loop.statuses) == {200}
    assert loop.versions[-1] == "2.0" and "1.0" in loop.versions
    # once switched, it stays switched
    switched = loop.versions.index("2.0")
    assert set(loop.versions[switched + 8 :]) == {"2.0"}


def wait_for_more_answers(loop: ClientLoop, count: int) -> None:
    served = sum(loop.statuses.values())
    while sum(loop.statuses.values()) < served + count:
        threading.Event().wait(0.05)


def default_workers(server: TorchServe) -> int:
    described = gnnctl(server, "status", "gnn")
    return len(next(e for e in described if e["modelVersion"] == "2.0")["workers"])


def test_scaling_up_under_load_fails_no_request(ops_server):
    with ClientLoop(ops_server) as loop:
        wait_for_more_answers(loop, 20)
        gnnctl(ops_server, "scale", "gnn", "3")
        assert default_workers(ops_server) == 3
        wait_for_more_answers(loop, 40)
    print(f"scale 2 -> 3: {dict(loop.statuses)}")
    assert loop.failures == [] and set(loop.statuses) == {200}


def test_scaling_down_under_load_loses_at_most_the_removed_workers_batches(ops_server):
    """TorchServe 0.12 stops a scaled-down worker without draining it: the batch it was running
    is answered 500 "Worker died." or, when the frontend loses it, not at all until the
    client gives up. That batch is all that may fail; docs/operations.md."""
    batch_size = 4
    with ClientLoop(ops_server) as loop:
        wait_for_more_answers(loop, 20)
        gnnctl(ops_server, "scale", "gnn", "1")
        assert default_workers(ops_server) == 1
        wait_for_more_answers(loop, 40)
    print(f"scale 3 -> 1: {dict(loop.statuses)}, failures {loop.failures}")
    assert set(loop.statuses) <= {200, 500}
    assert all('"Worker died."' in f or "ReadTimeout" in f for f in loop.failures)
    assert len(loop.failures) <= 2 * batch_size


def test_versions_with_one_graph_map_the_same_files(ops_server):
    mapped = set()
    for worker in worker_processes(ops_server):
        maps = Path(f"/proc/{worker.pid}/maps").read_text()
        files = maps.splitlines()
        mapped |= {line.split()[-1] for line in files if line.endswith("/features.0.npy")}
    assert len(worker_processes(ops_server)) >= 2
    assert len(mapped) == 1, mapped  # both versions' workers map one cached copy
    assert "gnnserve-graph-cache" in next(iter(mapped))


def test_handler_metrics_reach_prometheus(ops_server):
    names = [
        "HandlerTime",  # TorchServe's, written with the interval report (docs/operations.md)
        "PredictionTime",
        "GnnBatchSize",
        "GnnSeedNodes",
        "GnnSampledNodes",
        "GnnSampledEdges",
        "GnnParseTime",
        "GnnSampleTime",
        "GnnGatherTime",
        "GnnForwardTime",
        "GnnFormatTime",
        "GnnErrorResponses",
    ]

    def missing() -> list[str]:
        url = f"http://127.0.0.1:{ops_server.metrics_port}/metrics"
        metrics = requests.get(url, timeout=30).text
        pattern = r"^{}\{{[^}}]*\}} [0-9.eE+-]+$"
        return [name for name in names if not re.search(pattern.format(name), metrics, re.M)]

    # PredictionTime comes with the report after the batch it times: keep predicting until a
    # report has come after one (an interval is 1 s; the deadline leaves room for a slow VM).
    deadline = time.monotonic() + 60
    while missing() and time.monotonic() < deadline:
        requests.post(
            f"{ops_server.inference_url}/predictions/gnn",
            json={"node_id": "acct_1"},
            headers=ops_server.auth("inference"),
            timeout=60,
        )
    assert not missing(), f"{missing()} missing from /metrics"
    metrics = requests.get(f"http://127.0.0.1:{ops_server.metrics_port}/metrics", timeout=30).text
    sampled = re.findall(r"^GnnSampledNodes\{[^}]*\} ([0-9.eE+-]+)$", metrics, re.MULTILINE)
    assert max(float(v) for v in sampled) >= 1


def test_errors_are_logged_with_index_and_reason_but_not_the_body(ops_server):
    response = requests.post(
        f"{ops_server.inference_url}/predictions/gnn",
        json={"node_id": SECRET},
        headers=ops_server.auth("inference"),
        timeout=60,
    )
    assert response.status_code == 404
    bad = requests.post(
        f"{ops_server.inference_url}/predictions/gnn",
        data=b'{"node_id": "' + SECRET.encode() + b'", broken',
        headers={**ops_server.auth("inference"), "Content-Type": "application/json"},
        timeout=60,
    )
    assert bad.status_code == 400
    log = ops_server.wait_for_log(r"request \d+: 404 NotFound", r"request \d+: 400 BadRequest")
    assert SECRET not in log


def test_a_describe_header_on_predictions_gets_predictions(ops_server):
    """TorchServe's BaseHandler answers a batch whose first request carries `describe: True`
    with one description, and the frontend then fails every request of the batch with 503."""
    url = f"{ops_server.inference_url}/predictions/gnn"
    headers = {**ops_server.auth("inference"), "describe": "True"}

    def predict(node: int) -> requests.Response:
        return requests.post(url, json={"node_id": f"acct_{node}"}, headers=headers, timeout=60)

    with ThreadPoolExecutor(max_workers=8) as pool:  # batches of up to 4 (--batch-size 4)
        answers = list(pool.map(predict, range(8)))
    assert [answer.status_code for answer in answers] == [200] * 8
    assert [answer.json()["node_id"] for answer in answers] == [f"acct_{i}" for i in range(8)]
    described = requests.get(
        f"{ops_server.management_url}/models/gnn?customized=true",
        headers=ops_server.auth("management"),
        timeout=30,
    )
    assert described.status_code == 200
    assert described.json()[0]["customizedMetadata"]["task"] == "node"


def test_token_refresh_issues_a_working_inference_key(ops_server):
    old_key = ops_server.keys()["inference"]
    gnnctl(ops_server, "token", "inference")
    new_key = ops_server.keys()["inference"]
    assert new_key != old_key
    response = requests.post(
        f"{ops_server.inference_url}/predictions/gnn",
        json={"node_id": "acct_1"},
        headers={"Authorization": f"Bearer {new_key}"},
        timeout=60,
    )
    assert response.status_code == 200


def test_retiring_the_old_version(ops_server):
    gnnctl(ops_server, "unregister", "gnn", "1.0")
    gone = requests.post(
        f"{ops_server.inference_url}/predictions/gnn/1.0",
        json={"node_id": "acct_1"},
        headers=ops_server.auth("inference"),
        timeout=60,
    )
    assert gone.status_code == 404
    assert [e["modelVersion"] for e in gnnctl(ops_server, "status", "gnn")] == ["2.0"]


def test_snapshot_restores_versions_default_and_workers(serve, tmp_path, versions_store):
    # A server of its own: it is stopped and restarted from its snapshot.
    with serve(versions_store, "gnn=gnn.mar", home=tmp_path / "snap") as server:
        gnnctl(server, "register", "gnn_v2.0.mar")
        gnnctl(server, "set-default", "gnn", "2.0")
        gnnctl(server, "scale", "gnn", "2")
        before = gnnctl(server, "status", "gnn")
        answer = requests.post(
            f"{server.inference_url}/predictions/gnn",
            json={"node_id": "acct_7"},
            headers=server.auth("inference"),
            timeout=60,
        ).json()
        server.stop()
        assert list((server.home / "logs" / "config").glob("*-shutdown.cfg"))
        server.start_from_snapshot()
        after = gnnctl(server, "status", "gnn")
        summary = {(e["modelVersion"], len(e["workers"])) for e in after}
        assert summary == {(e["modelVersion"], len(e["workers"])) for e in before}
        assert summary == {("1.0", 1), ("2.0", 2)}
        default = requests.get(
            f"{server.management_url}/models/gnn", headers=server.auth("management"), timeout=30
        ).json()
        assert default[0]["modelVersion"] == "2.0"
        again = requests.post(
            f"{server.inference_url}/predictions/gnn",
            json={"node_id": "acct_7"},
            headers=server.auth("inference"),
            timeout=60,
        ).json()
        assert again == answer
