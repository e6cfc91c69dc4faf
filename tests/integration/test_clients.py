"""Clients users already have, against a real TorchServe: tritonclient's HTTP client on the
KServe v2 route. Answers equal the JSON API's, errors are readable by the client, and a burst
mixing the client's good and bad requests with JSON ones keeps every good answer 200 and every
worker up."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from bench.harness.torchserve import TorchServe, worker_pids

pytestmark = pytest.mark.integration


def client(server: TorchServe) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(server.inference_url.removeprefix("http://"))


def infer(server: TorchServe, ids: list[str], shape: list[int], binary: bool = False):
    tensor = triton.InferInput("node_ids", shape, "BYTES")
    tensor.set_data_from_numpy(np.array(ids, dtype=object).reshape(shape), binary_data=binary)
    outputs = [
        triton.InferRequestedOutput(n, binary_data=False) for n in ("node_id", "probabilities")
    ]
    # tritonclient adds its own headers to the dict it is given: a fresh one per call
    return client(server).infer(
        "gnn", [tensor], outputs=outputs, request_id="req-7", headers=dict(server.auth("inference"))
    )


def json_probabilities(server: TorchServe, ids: list[str]) -> np.ndarray:
    answer = requests.post(
        f"{server.inference_url}/predictions/gnn",
        json={"node_ids": ids},
        headers=server.auth("inference"),
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    return np.array([p["probabilities"] for p in answer.json()["predictions"]])


@pytest.mark.parametrize("shape", [[3], [3, 1]])
def test_tritonclient_answers_equal_the_json_api(server, shape):
    ids = ["acct_1", "acct_2", "acct_42"]
    result = infer(server, ids, shape)
    assert result.get_response()["id"] == "req-7"
    assert [i.decode() if isinstance(i, bytes) else i for i in result.as_numpy("node_id")] == ids
    probabilities = result.as_numpy("probabilities")
    assert np.allclose(probabilities, json_probabilities(server, ids), atol=1e-6)


def test_tritonclient_reads_the_errors(server):
    with pytest.raises(InferenceServerException, match=r"node\(s\) not in the graph: 'nobody'"):
        infer(server, ["nobody"], [1])
    with pytest.raises(InferenceServerException, match="binary_data=False"):
        infer(server, ["acct_1"], [1], binary=True)  # tritonclient's default encoding


def test_a_burst_of_client_and_bad_requests_keeps_good_answers_and_workers(server):
    before = worker_pids(server)

    def one(i: int) -> str:
        kind = ("good", "missing", "binary", "json")[i % 4]
        if kind == "json":
            json_probabilities(server, [f"acct_{i % 100}"])
            return kind
        try:
            if kind == "good":
                infer(server, [f"acct_{i % 100}"], [1, 1])
                return kind
            infer(server, ["nobody"] if kind == "missing" else ["acct_1"], [1], kind == "binary")
        except InferenceServerException as error:
            assert error.status() == ("404" if kind == "missing" else "400"), error
            return kind
        raise AssertionError(f"a {kind} request was answered 200")

    with ThreadPoolExecutor(8) as pool:
        kinds = list(pool.map(one, range(64)))
    assert sorted(set(kinds)) == ["binary", "good", "json", "missing"]
    assert worker_pids(server) == before
