"""Clients users already have, against a real TorchServe: tritonclient's HTTP client on the
KServe v2 route of every archive kind. Answers equal the JSON API's, errors are readable by the
client, the health calls answer what TorchServe 0.12 serves, and a burst mixing the client's
good and bad requests with JSON ones keeps every good answer 200 and every worker up."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests
from tritonclient.utils import InferenceServerException

from tests.servers.torchserve import TorchServe, worker_pids

from .v2_clients import (
    graph_tensors,
    node_tensors,
    pair_tensors,
    rest,
    strings,
    triton_client,
    triton_infer,
)

pytestmark = pytest.mark.integration

GRAPH = {"x": [[1.0] + [0.0] * 7] * 4, "edge_index": [[0, 0, 0, 1, 2, 3], [1, 2, 3, 0, 0, 0]]}


@pytest.fixture(scope="module")
def server(shared_server: TorchServe) -> TorchServe:
    """The session's shared server: it serves the three task archives."""
    return shared_server


def json_probabilities(server: TorchServe, ids: list[str]) -> np.ndarray:
    answer = rest(server, "gnn", {"node_ids": ids})
    assert answer.status_code == 200, answer.text
    return np.array([p["probabilities"] for p in answer.json()["predictions"]])


def infer(server: TorchServe, ids: list[str], shape: list[int], binary: bool = False):
    return triton_infer(server, "gnn", node_tensors(ids, shape, binary))


@pytest.mark.parametrize("shape", [[3], [3, 1]])
def test_tritonclient_answers_equal_the_json_api(server, shape):
    ids = ["acct_1", "acct_2", "acct_42"]
    result = infer(server, ids, shape)
    assert result.get_response()["id"] == "req-7"
    assert strings(result.as_numpy("node_id")) == ids
    probabilities = result.as_numpy("probabilities")
    assert np.allclose(probabilities, json_probabilities(server, ids), atol=1e-6)


def test_tritonclient_link_pairs_equal_the_json_api(server):
    pairs = [["acct_1", "acct_2"], ["acct_5", "acct_9"], ["acct_2", "acct_1"]]
    result = triton_infer(server, "link", pair_tensors(pairs))
    assert result.get_response()["id"] == "req-7"
    assert strings(result.as_numpy("src")) == [src for src, _ in pairs]
    assert strings(result.as_numpy("dst")) == [dst for _, dst in pairs]
    answer = rest(server, "link", {"pairs": pairs}).json()
    expected = [p["score"] for p in answer["predictions"]]
    assert np.allclose(result.as_numpy("score"), expected, atol=1e-6)


def test_tritonclient_inline_graph_equals_the_json_api(server):
    result = triton_infer(server, "graphs", graph_tensors(GRAPH))
    answer = rest(server, "graphs", {"graph": GRAPH}).json()
    assert result.as_numpy("predicted_class").tolist() == [answer["predicted_class"]]
    probabilities = result.as_numpy("probabilities")
    assert probabilities.shape == (1, len(answer["probabilities"]))
    assert np.allclose(probabilities[0], answer["probabilities"], atol=1e-6)


def test_tritonclient_reads_the_errors(server):
    with pytest.raises(InferenceServerException, match=r"node\(s\) not in the graph: 'nobody'"):
        infer(server, ["nobody"], [1])
    binary = [  # tritonclient's default encoding, refused for every archive kind
        ("gnn", node_tensors(["acct_1"], [1], binary=True)),
        ("link", pair_tensors([["acct_1", "acct_2"]], binary=True)),
        ("graphs", graph_tensors(GRAPH, binary=True)),
    ]
    for model, inputs in binary:
        with pytest.raises(InferenceServerException, match="binary_data=False") as refused:
            triton_infer(server, model, inputs)
        assert refused.value.status() == "400"
    with pytest.raises(InferenceServerException, match=r"not in the graph: 'nobody'"):
        triton_infer(server, "link", pair_tensors([["acct_1", "nobody"]]))
    bad = {"x": GRAPH["x"], "edge_index": [[0], [7]]}
    with pytest.raises(InferenceServerException, match=r"outside \[0, 3\]") as refused:
        triton_infer(server, "graphs", graph_tensors(bad))
    assert refused.value.status() == "400"


def test_health_calls_answer_what_torchserve_serves(server):
    """With ts_open_inference_protocol=true (the shipped config) TorchServe 0.12 serves
    /v2/health/live and /v2/health/ready, but no /v2/models/<m>/ready nor /v2/models/<m>:
    tritonclient's is_model_ready is false, and model metadata is TorchServe's 404, on a
    healthy server whose workers are all up (gRPC ModelReady answers it: test_grpc.py)."""
    ping = requests.get(
        f"{server.inference_url}/ping", headers=server.auth("inference"), timeout=30
    )
    assert ping.status_code == 200 and ping.json() == {"status": "Healthy"}  # as without it
    client = triton_client(server)
    headers = server.auth
    assert client.is_server_live(headers=dict(headers("inference")))
    assert client.is_server_ready(headers=dict(headers("inference")))
    for model in ("gnn", "link", "graphs"):
        assert not client.is_model_ready(model, headers=dict(headers("inference")))
    with pytest.raises(InferenceServerException, match="ResourceNotFoundException"):
        client.get_model_metadata("gnn", headers=dict(headers("inference")))
    assert triton_infer(server, "gnn", node_tensors(["acct_1"], [1])).as_numpy("node_id").size


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
