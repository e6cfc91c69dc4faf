"""TorchServe's gRPC APIs against a real TorchServe serving a node, a link and a graph archive,
with stubs compiled at test time from the protos in TorchServe's jar (grpc_stubs.py):

- its own inference API (``inference.proto``, ``Predictions`` with ``input={"body": ...}`` or
  ``{"data": ...}``): answers equal the JSON API's, batched; a bad request comes back with gRPC
  status OK and the handler's JSON error as the prediction bytes;
- the Open Inference Protocol's ``GRPCInferenceService`` (``open_inference_grpc.proto``; the
  shipped config turns ``ts_open_inference_protocol`` on): health, readiness, metadata and
  ``ModelInfer`` with each archive kind's tensors, answers equal the v2 REST route's; errors come
  back as an ``error`` output, and no worker dies;
- a burst mixing both, tritonclient and bad requests keeps every good answer and every worker.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import grpc
import numpy as np
import pytest
import requests
import tritonclient.grpc as triton_grpc
from google.protobuf import empty_pb2
from tritonclient.utils import InferenceServerException

from tests.servers.torchserve import (
    TorchServe,
    largest_batches,
    model_worker_pids,
    worker_pids,
)

from .grpc_stubs import compile_stubs
from .v2_clients import assert_same_answer, node_tensors, rest, triton_infer

pytestmark = pytest.mark.integration

MODELS = ("gnn", "link", "graphs")
# A 4-node star: x [4, 8], edge_index [2, 6] (the centre and its three leaves, both ways).
GRAPH = {"x": [[1.0] + [0.0] * 7] * 4, "edge_index": [[0, 0, 0, 1, 2, 3], [1, 2, 3, 0, 0, 0]]}
Spec = list[tuple[str, str, list[int], list[Any]]]  # (name, datatype, shape, flat values)


@dataclass
class Grpc:
    """One client of both gRPC inference services of a server, with its inference token."""

    stubs: dict[str, ModuleType]
    channel: grpc.Channel
    metadata: list[tuple[str, str]]

    def predictions(self, model: str, body: bytes, key: str = "body") -> bytes:
        """TorchServe's ``Predictions``: the prediction bytes (a non-OK status raises)."""
        request = self.stubs["inference_pb2"].PredictionsRequest(
            model_name=model, input={key: body} if key else {}
        )
        stub = self.stubs["inference_pb2_grpc"].InferenceAPIsServiceStub(self.channel)
        return stub.Predictions(request, metadata=self.metadata, timeout=60).prediction

    @property
    def oip(self) -> Any:
        return self.stubs["open_inference_grpc_pb2_grpc"].GRPCInferenceServiceStub(self.channel)

    @property
    def messages(self) -> ModuleType:
        return self.stubs["open_inference_grpc_pb2"]

    def infer(self, model: str, spec: Spec, request_id: str = "r1", **fields: Any) -> Any:
        """``ModelInfer`` of the tensors ``spec``, their values in ``contents``."""
        messages = self.messages
        inputs = []
        for name, datatype, shape, values in spec:
            contents = messages.InferTensorContents(**{_CONTENTS[datatype]: _encode(values)})
            inputs.append(
                messages.ModelInferRequest.InferInputTensor(
                    name=name, datatype=datatype, shape=shape, contents=contents
                )
            )
        request = messages.ModelInferRequest(
            model_name=model, id=request_id, inputs=inputs, **fields
        )
        return self.oip.ModelInfer(request, metadata=self.metadata, timeout=60)


_CONTENTS = {"BYTES": "bytes_contents", "INT64": "int64_contents", "FP32": "fp32_contents"}


def _encode(values: list[Any]) -> list[Any]:
    return [v.encode() if isinstance(v, str) else v for v in values]


def outputs_of(response: Any) -> dict[str, tuple[str, list[int], list[Any]]]:
    """A ``ModelInferResponse``'s outputs as ``name -> (datatype, shape, values)``. TorchServe's
    converter writes each BYTES element as its JSON text (a string in quotes): decoded here."""
    outputs = {}
    for tensor in response.outputs:
        contents = tensor.contents
        if tensor.datatype == "BYTES":
            values = [json.loads(item) for item in contents.bytes_contents]
        else:
            values = list(getattr(contents, _CONTENTS[tensor.datatype]))
        outputs[tensor.name] = (tensor.datatype, list(tensor.shape), values)
    return outputs


def v2_rest(server: TorchServe, model: str, spec: Spec, request_id: str = "r1") -> Any:
    """The same tensors as JSON on ``/v2/models/<model>/infer``."""
    inputs = [
        {"name": name, "datatype": datatype, "shape": shape, "data": values}
        for name, datatype, shape, values in spec
    ]
    return requests.post(
        f"{server.inference_url}/v2/models/{model}/infer",
        json={"id": request_id, "inputs": inputs},
        headers=server.auth("inference"),
        timeout=60,
    )


def assert_outputs_equal(served: dict, answer: dict) -> None:
    """gRPC outputs against the REST v2 answer's: names, datatypes, shapes, values."""
    expected = {o["name"]: (o["datatype"], o["shape"], o["data"]) for o in answer["outputs"]}
    assert served.keys() == expected.keys()
    for name, (datatype, shape, values) in expected.items():
        assert served[name][:2] == (datatype, shape), name
        if datatype == "FP32":
            assert np.allclose(served[name][2], values, atol=1e-6), name
        else:
            assert served[name][2] == values, name


NODE_IDS: Spec = [("node_ids", "BYTES", [3], ["acct_1", "acct_2", "acct_42"])]
PAIRS: Spec = [("pairs", "BYTES", [2, 2], ["acct_1", "acct_2", "acct_5", "acct_9"])]
GRAPH_TENSORS: Spec = [
    ("x", "FP32", [4, 8], [value for row in GRAPH["x"] for value in row]),
    ("edge_index", "INT64", [2, 6], GRAPH["edge_index"][0] + GRAPH["edge_index"][1]),
]
INFER = {"gnn": NODE_IDS, "link": PAIRS, "graphs": GRAPH_TENSORS}
PREDICT = [
    ("gnn", {"node_id": "acct_5"}),
    ("gnn", {"node_ids": ["acct_1", "acct_2", "acct_42"]}),
    ("link", {"src": "acct_5", "dst": "acct_9"}),
    ("link", {"pairs": [["acct_1", "acct_2"], ["acct_5", "acct_9"]]}),
    ("link", {"src": "acct_5", "top_k": 3}),
    ("graphs", {"graph": GRAPH}),
]


@pytest.fixture(scope="module")
def served(shared_server: TorchServe) -> TorchServe:
    """The session's shared server: it serves the three task archives."""
    return shared_server


@pytest.fixture(scope="module")
def client(served: TorchServe, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Grpc]:
    stubs = compile_stubs(tmp_path_factory.mktemp("grpc_stubs"))
    with grpc.insecure_channel(served.grpc_inference_target) as channel:
        token = served.keys()["inference"]
        yield Grpc(stubs, channel, [("authorization", f"Bearer {token}")])


def workers(server: TorchServe) -> dict[str, list[int]]:
    return {model: model_worker_pids(server, model, ready=True) for model in MODELS}


def graph_batch_sizes(server: TorchServe, offset: int, requests_sent: int) -> list[int]:
    """The sizes of the graphs archive's batches logged after ``offset`` (it logs every batch),
    once they add up to ``requests_sent``: the log is written by a relay thread, later."""
    log = server.home / "logs" / "model_log.log"
    deadline = time.monotonic() + 30
    while True:
        lines = [line for line in log.read_text()[offset:].splitlines() if "graphs_1.0" in line]
        sizes = largest_batches("\n".join(lines))
        if sum(sizes) >= requests_sent or time.monotonic() > deadline:
            return sizes


@pytest.mark.parametrize("key", ["body", "data"])
def test_predictions_answers_equal_the_json_api_batched(served, client, key):
    expected = [rest(served, model, body).json() for model, body in PREDICT]
    offset = len((served.home / "logs" / "model_log.log").read_text())
    calls = PREDICT * 4
    with ThreadPoolExecutor(len(calls)) as pool:
        answers = list(
            pool.map(lambda c: client.predictions(c[0], json.dumps(c[1]).encode(), key), calls)
        )
    for index, answer in enumerate(answers):
        assert_same_answer(json.loads(answer), expected[index % len(PREDICT)])
    sizes = graph_batch_sizes(served, offset, requests_sent=4)
    assert sum(sizes) >= 4 and max(sizes) > 1  # TorchServe batched them


BAD_PREDICT = [
    ("gnn", b"not json", 400),
    ("gnn", b'{"node_id": "nobody"}', 404),
    ("gnn", json.dumps({"node_ids": ["acct_1"] * 17}).encode(), 413),  # --max-ids 16
    ("gnn", b'{"node_ids": []}', 400),
    ("link", b'{"src": "acct_1"}', 400),
    ("link", b'{"pairs": [["acct_1", "nobody"]]}', 404),
    ("graphs", json.dumps({"graph": {"x": [[1.0] * 8], "edge_index": [[0], [3]]}}).encode(), 400),
    (
        "graphs",
        json.dumps({"graph": {"x": [[1.0] * 8] * 41, "edge_index": [[], []]}}).encode(),
        413,
    ),
]


def test_bad_predictions_come_back_status_ok_with_the_json_error(served, client):
    before = workers(served)
    for model, body, status in BAD_PREDICT:
        over_http = requests.post(
            f"{served.inference_url}/predictions/{model}",
            data=body,
            headers={**served.auth("inference"), "Content-Type": "application/json"},
            timeout=60,
        )
        assert over_http.status_code == status, over_http.text
        error = json.loads(client.predictions(model, body))  # status OK: no RpcError raised
        assert error == over_http.json() and error["code"] == status
    empty = json.loads(client.predictions("gnn", b"", key=""))
    assert empty["code"] == 400 and "empty request" in empty["message"]
    other_key = json.loads(client.predictions("gnn", b'{"node_id": "acct_1"}', key="node"))
    assert other_key["code"] == 400 and 'input key "data" or "body"' in other_key["message"]
    assert workers(served) == before


def test_torchserve_refuses_unknown_models_and_missing_tokens_itself(client):
    with pytest.raises(grpc.RpcError) as unknown:
        client.predictions("nope", b"{}")
    assert unknown.value.code() == grpc.StatusCode.INTERNAL
    assert "Model not found: nope" in unknown.value.details()
    anonymous = Grpc(client.stubs, client.channel, [])
    with pytest.raises(grpc.RpcError) as refused:
        anonymous.predictions("gnn", b'{"node_id": "acct_1"}')
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.RpcError) as not_live:
        anonymous.oip.ServerLive(client.messages.ServerLiveRequest(), timeout=30)
    assert not_live.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_health_readiness_and_metadata_over_the_open_inference_protocol(client):
    messages, metadata = client.messages, client.metadata
    torchserve = client.stubs["inference_pb2_grpc"].InferenceAPIsServiceStub(client.channel)
    health = torchserve.Ping(empty_pb2.Empty(), metadata=metadata).health
    assert json.loads(health) == {"status": "Healthy"}
    assert client.oip.ServerLive(messages.ServerLiveRequest(), metadata=metadata).live
    assert client.oip.ServerReady(messages.ServerReadyRequest(), metadata=metadata).ready
    for model in MODELS:
        ready = client.oip.ModelReady(messages.ModelReadyRequest(name=model), metadata=metadata)
        assert ready.ready, model
        described = client.oip.ModelMetadata(
            messages.ModelMetadataRequest(name=model), metadata=metadata
        )
        assert described.name == model and list(described.versions) == ["1.0"]
    for call, request in (
        (client.oip.ModelReady, messages.ModelReadyRequest(name="nope")),
        (client.oip.ModelMetadata, messages.ModelMetadataRequest(name="nope")),
    ):
        with pytest.raises(grpc.RpcError) as unknown:
            call(request, metadata=metadata)
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND


def test_model_infer_answers_equal_the_v2_rest_route_batched(served, client):
    expected = {model: v2_rest(served, model, spec).json() for model, spec in INFER.items()}
    calls = [(model, f"{model}-{i}") for i in range(6) for model in MODELS]
    with ThreadPoolExecutor(len(calls)) as pool:
        answers = list(pool.map(lambda c: client.infer(c[0], INFER[c[0]], c[1]), calls))
    for (model, request_id), answer in zip(calls, answers, strict=True):
        assert (answer.id, answer.model_name, answer.model_version) == (request_id, model, "1.0")
        assert_outputs_equal(outputs_of(answer), expected[model])
    node = outputs_of(answers[0])
    assert node["node_id"] == ("BYTES", [3], ["acct_1", "acct_2", "acct_42"])
    assert node["probabilities"][1] == [3, 3]


def graph_tensors_with(index: int, **changes: Any) -> Spec:
    spec = list(GRAPH_TENSORS)
    name, datatype, shape, values = spec[index]
    spec[index] = (
        name,
        changes.get("datatype", datatype),
        changes.get("shape", shape),
        changes.get("values", values),
    )
    return spec


BAD_INFER = [
    ("gnn", [("node_ids", "BYTES", [1], ["nobody"])], "not in the graph: 'nobody'"),
    ("gnn", [("x", "BYTES", [1], ["acct_1"])], "send the input tensor(s) node_ids or node_id"),
    ("gnn", [("node_ids", "FP32", [1], [1.0])], "must have datatype INT64 or INT32 or BYTES"),
    ("gnn", [], "send the input tensor(s)"),
    ("link", [("pairs", "BYTES", [2], ["acct_1", "acct_2"])], "shape [n, 2]"),
    ("link", [("pairs", "BYTES", [1, 2], ["acct_1", "nobody"])], "not in the graph: 'nobody'"),
    ("graphs", graph_tensors_with(0, shape=[8, 4]), "shape [n, 8]"),
    (
        "graphs",
        graph_tensors_with(1, values=[0, 0, 0, 1, 2, 3, 1, 2, 9, 0, 0, 0]),
        "outside [0, 3]",
    ),
]


def test_model_infer_errors_are_an_error_output_and_no_worker_dies(served, client):
    before = workers(served)
    for model, spec, words in BAD_INFER:
        answer = client.infer(model, spec, request_id="bad")  # status OK: no RpcError raised
        assert (answer.id, answer.model_name, answer.model_version) == ("bad", model, "1.0")
        ((_, shape, (message,)),) = outputs_of(answer).values()
        assert [o.name for o in answer.outputs] == ["error"] and shape == [1]
        assert words in message, message
        over_http = v2_rest(served, model, spec, "bad")
        assert over_http.status_code >= 400 and over_http.json()["error"] == message
    raw = client.infer(
        "gnn",
        [("node_ids", "INT64", [1], [])],
        raw_input_contents=[(3).to_bytes(8, "little")],
    )
    assert "raw_input_contents" in outputs_of(raw)["error"][2][0]
    assert workers(served) == before
    assert outputs_of(client.infer("gnn", NODE_IDS))["node_id"][2] == NODE_IDS[0][3]


def test_model_infer_of_an_unknown_model_is_torchserves_internal_error(client):
    with pytest.raises(grpc.RpcError) as unknown:
        client.infer("nope", NODE_IDS)
    assert unknown.value.code() == grpc.StatusCode.INTERNAL
    assert "Model not found: nope" in unknown.value.details()


def test_tritonclient_grpc_finds_no_service_torchserve_names_differently(served):
    """tritonclient's stubs call ``inference.GRPCInferenceService``; TorchServe 0.12 serves
    the same service as ``org.pytorch.serve.grpc.openinference.GRPCInferenceService``."""
    triton = triton_grpc.InferenceServerClient(served.grpc_inference_target)
    headers = {"authorization": f"Bearer {served.keys()['inference']}"}  # gRPC: lower case
    with pytest.raises(InferenceServerException, match="UNIMPLEMENTED"):
        triton.is_server_live(headers=headers)
    ids = triton_grpc.InferInput("node_ids", [1], "BYTES")
    ids.set_data_from_numpy(np.array(["acct_1"], dtype=object))
    with pytest.raises(InferenceServerException, match="Method not found"):
        triton.infer("gnn", [ids], headers=headers)


def test_a_burst_mixing_clients_and_bad_requests_keeps_good_answers_and_workers(served, client):
    expected_predict = [rest(served, model, body).json() for model, body in PREDICT]
    expected_infer = {model: v2_rest(served, model, spec).json() for model, spec in INFER.items()}
    before_all, before = worker_pids(served), workers(served)

    def one(i: int) -> str:
        kind = ("predict", "infer", "triton", "json", "bad predict", "bad infer", "bad triton")
        kind_of = kind[i % len(kind)]
        model, body = PREDICT[i % len(PREDICT)]
        if kind_of == "predict":
            answer = json.loads(client.predictions(model, json.dumps(body).encode()))
            assert_same_answer(answer, expected_predict[i % len(PREDICT)])
        elif kind_of == "infer":
            infer_model = MODELS[i % len(MODELS)]
            answer = client.infer(infer_model, INFER[infer_model], f"burst-{i}")
            assert answer.id == f"burst-{i}"
            assert_outputs_equal(outputs_of(answer), expected_infer[infer_model])
        elif kind_of == "triton":
            result = triton_infer(served, "gnn", node_tensors(["acct_1"], [1, 1]))
            assert result.as_numpy("probabilities").shape == (1, 3)
        elif kind_of == "json":
            assert rest(served, model, body).status_code == 200
        elif kind_of == "bad predict":
            bad_model, bad_body, status = BAD_PREDICT[i % len(BAD_PREDICT)]
            assert json.loads(client.predictions(bad_model, bad_body))["code"] == status
        elif kind_of == "bad infer":
            bad_model, spec, _ = BAD_INFER[i % len(BAD_INFER)]
            assert [o.name for o in client.infer(bad_model, spec).outputs] == ["error"]
        else:
            with pytest.raises(InferenceServerException, match=re.escape("binary_data=False")):
                triton_infer(served, "gnn", node_tensors(["acct_1"], [1], binary=True))
        return kind_of

    with ThreadPoolExecutor(12) as pool:
        kinds = list(pool.map(one, range(7 * 12)))
    assert len(set(kinds)) == 7
    assert worker_pids(served) == before_all and workers(served) == before
