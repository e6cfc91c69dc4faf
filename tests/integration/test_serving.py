"""Node classification through a real TorchServe with token authorization on."""

from __future__ import annotations

import io
import json
import shutil
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests
import torch

from graph_assets import open_store
from model import build_model
from tests.servers.torchserve import largest_batches

pytestmark = pytest.mark.integration


def predict(server, payload, token=True, raw: bytes | None = None) -> requests.Response:
    headers = {"Content-Type": "application/json"}
    if token:
        headers.update(server.auth("inference"))
    data = raw if raw is not None else json.dumps(payload)
    return requests.post(
        f"{server.inference_url}/predictions/gnn", data=data, headers=headers, timeout=60
    )


def test_single_prediction_echoes_string_id(server):
    response = predict(server, {"node_id": "acct_5"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["node_id"] == "acct_5" and body["model_version"] == "1.0"
    assert body["predicted_label"] in ("fraud", "legit", "review")
    assert abs(sum(body["probabilities"]) - 1) < 1e-5


def test_list_prediction_keeps_order_and_types(server):
    response = predict(server, {"node_ids": ["acct_1", "acct_119", "acct_1"]})
    assert response.status_code == 200, response.text
    predictions = response.json()["predictions"]
    assert [p["node_id"] for p in predictions] == ["acct_1", "acct_119", "acct_1"]
    assert predictions[0] == predictions[2]


def test_served_answers_equal_the_full_graph_forward(server, tmp_path):
    archive = zipfile.ZipFile(server.model_store / "gnn.mar")
    archive.extractall(tmp_path, [n for n in archive.namelist() if n.startswith("graph/")])
    store = open_store(tmp_path / "graph")
    model = build_model(json.loads(archive.read("model_config.json")))
    model.load_state_dict(torch.load(io.BytesIO(archive.read("model.pt")), weights_only=True))
    model.eval()
    with torch.no_grad():
        x = torch.from_numpy(np.array(store.features))
        expected = torch.softmax(model(x, torch.from_numpy(store.edge_index())), dim=-1)
    ids = store.external_ids(np.arange(store.num_nodes))
    served = []
    for start in range(0, len(ids), 16):
        response = predict(server, {"node_ids": ids[start : start + 16]})
        assert response.status_code == 200, response.text
        served += [p["probabilities"] for p in response.json()["predictions"]]
    assert float((torch.tensor(served) - expected).abs().max()) <= 1e-5


@pytest.mark.parametrize(
    ("payload", "raw", "status", "kind"),
    [
        (None, b"{not json", 400, "BadRequest"),
        ({"node_id": 1.5}, None, 400, "BadRequest"),
        ({"node_id": "acct_5", "node_ids": ["acct_5"]}, None, 400, "BadRequest"),
        ({"node_ids": []}, None, 400, "BadRequest"),
        ({"node_id": "nobody"}, None, 404, "NotFound"),
        ({"node_ids": ["acct_1"] * 17}, None, 413, "TooLarge"),
    ],
)
def test_errors_are_json_with_their_status(server, payload, raw, status, kind):
    response = predict(server, payload, raw=raw)
    assert response.status_code == status, response.text
    body = response.json()
    assert body["code"] == status and body["type"] == kind and body["message"]


def test_concurrent_burst_with_bad_requests_in_the_batches(server):
    log = server.home / "logs" / "model_log.log"
    seen = len(log.read_text())  # the shared server's log holds other modules' batches too
    good = [{"node_id": f"acct_{i}"} for i in range(40)]
    bad = [{"node_id": "ghost"}, {"node_ids": []}, {"node_id": None}]
    payloads = [p for i, g in enumerate(good) for p in ([g, bad[i % 3]] if i % 4 == 0 else [g])]
    with ThreadPoolExecutor(max_workers=16) as pool:
        responses = list(pool.map(lambda p: predict(server, p), payloads))
    for payload, response in zip(payloads, responses, strict=True):
        if payload in good:
            assert response.status_code == 200, response.text
            assert response.json()["node_id"] == payload["node_id"]
        else:
            assert response.status_code in (400, 404), response.text
    # TorchServe did batch them: the handler logs the largest batch of each metrics interval
    # (1 s by default), so one more request after the interval makes it report the burst.
    time.sleep(1.2)
    alone = predict(server, {"node_id": "acct_3"}).json()
    batched = responses[payloads.index({"node_id": "acct_3"})].json()
    # The same ego-graph bit for bit; BLAS picks kernels by the batch's row count, so the
    # probabilities agree to float32 rounding (docs/architecture.md, "Sampling").
    assert np.allclose(batched.pop("probabilities"), alone.pop("probabilities"), atol=1e-6)
    assert batched == alone
    deadline = time.monotonic() + 10
    while max(largest_batches(log.read_text()[seen:]), default=0) <= 1:
        assert time.monotonic() < deadline, "no batch larger than one was logged"
        time.sleep(0.2)


def test_requests_without_the_right_token_are_refused(server):
    """TorchServe 0.12 answers a missing or wrong token with 400 InvalidKeyException."""
    refused = [
        predict(server, {"node_id": "acct_5"}, token=False),
        requests.post(
            f"{server.inference_url}/predictions/gnn",
            json={"node_id": "acct_5"},
            headers={"Authorization": "Bearer wrong"},
            timeout=30,
        ),
        requests.get(f"{server.management_url}/models", timeout=30),
        requests.get(
            f"{server.management_url}/models", headers=server.auth("inference"), timeout=30
        ),
    ]
    for response in refused:
        assert response.status_code == 400
        assert response.json()["type"] == "InvalidKeyException"
    listed = requests.get(
        f"{server.management_url}/models", headers=server.auth("management"), timeout=30
    )
    assert listed.status_code == 200


def test_management_api_describes_the_model(server):
    response = requests.get(
        f"{server.management_url}/models/gnn", headers=server.auth("management"), timeout=30
    )
    assert response.status_code == 200
    (described,) = response.json()
    assert described["modelName"] == "gnn" and described["modelVersion"] == "1.0"
    assert described["batchSize"] == 8 and described["maxBatchDelay"] == 100
    assert described["workers"] and described["workers"][0]["status"] == "READY"
    custom = requests.get(
        f"{server.management_url}/models/gnn?customized=true",
        headers=server.auth("management"),
        timeout=30,
    )
    assert custom.status_code == 200
    metadata = custom.json()[0]["customizedMetadata"]  # TorchServe parses our JSON
    assert metadata["graph"]["nodes"] == 120 and metadata["fanouts"] == [-1, -1]


def test_shipped_config_registers_archives_only_from_the_model_store(server):
    headers = server.auth("management")
    url = f"{server.management_url}/models"
    from_store = requests.post(
        url, params={"url": "gnn.mar", "model_name": "gnn_copy"}, headers=headers, timeout=120
    )
    assert from_store.status_code == 200, from_store.text
    outside = requests.post(
        url,
        params={"url": "http://127.0.0.1:9/gnn.mar", "model_name": "evil"},
        headers=headers,
        timeout=60,
    )
    assert outside.status_code == 404
    assert "does not match any allowed URL" in outside.json()["message"]
    # a file URL is refused too, even when its folder is also called model_store
    elsewhere = server.home / "elsewhere" / "model_store"
    elsewhere.mkdir(parents=True)
    shutil.copy(server.model_store / "gnn.mar", elsewhere / "evil.mar")
    by_file = requests.post(
        url,
        params={"url": f"file://{elsewhere / 'evil.mar'}", "model_name": "evil"},
        headers=headers,
        timeout=60,
    )
    assert by_file.status_code == 404
    assert "does not match any allowed URL" in by_file.json()["message"]
    assert "evil" not in requests.get(url, headers=headers, timeout=30).text
    removed = requests.delete(f"{url}/gnn_copy", headers=headers, timeout=60)
    assert removed.status_code == 200, removed.text


def v2_body(node: str, request_id: str) -> dict:
    return {
        "id": request_id,
        "inputs": [{"name": "node_ids", "shape": [1], "datatype": "BYTES", "data": [node]}],
    }


@pytest.mark.parametrize("path", ["/predictions/gnn", "/v2/models/gnn/infer"])
def test_kserve_v2_bodies_are_served_natively_and_batched(server, path):
    url = server.inference_url + path
    headers = server.auth("inference")
    bodies = [v2_body(f"acct_{i}", f"req-{i}") for i in range(24)]
    with ThreadPoolExecutor(max_workers=12) as pool:
        responses = list(
            pool.map(lambda b: requests.post(url, json=b, headers=headers, timeout=60), bodies)
        )
    for i, response in enumerate(responses):
        assert response.status_code == 200, response.text
        answer = response.json()
        assert answer["id"] == f"req-{i}" and answer["model_name"] == "gnn"
        outputs = {o["name"]: o for o in answer["outputs"]}
        assert outputs["node_id"]["data"] == [f"acct_{i}"]
        plain = predict(server, {"node_id": f"acct_{i}"}).json()
        assert outputs["predicted_class"]["data"] == [plain["predicted_class"]]
        assert np.allclose(outputs["probabilities"]["data"], plain["probabilities"], atol=1e-6)
