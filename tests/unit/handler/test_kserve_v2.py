"""KServe v2 bodies served natively, batched with ordinary requests."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from .conftest import make_engine, started


def v2(data, datatype="INT64", name="node_ids", shape=None, request_id="r1"):
    body = {
        "inputs": [
            {"name": name, "shape": shape or [len(data)], "datatype": datatype, "data": data}
        ]
    }
    if request_id is not None:
        body["id"] = request_id
    return {"body": body}


def test_v2_request_is_answered_in_v2_and_equals_the_json_answer(int_store):
    engine = make_engine(int_store)
    v2_answer, json_answer = engine.handle([v2([3, 6]), {"body": {"node_ids": [3, 6]}}])
    assert v2_answer.status == 200
    body = v2_answer.body
    assert body["id"] == "r1" and body["model_name"] == "gnn" and body["model_version"] == "1.0"
    outputs = {o["name"]: o for o in body["outputs"]}
    assert outputs["node_id"] == {
        "name": "node_id",
        "shape": [2],
        "datatype": "INT64",
        "data": [3, 6],
    }
    probabilities = np.array(outputs["probabilities"]["data"]).reshape(
        outputs["probabilities"]["shape"]
    )
    expected = np.array([p["probabilities"] for p in json_answer.body["predictions"]])
    assert np.allclose(probabilities, expected, atol=1e-6)
    assert outputs["predicted_class"]["data"] == expected.argmax(1).tolist()


def test_v2_string_ids(str_store):
    engine = make_engine(str_store)
    (answer,) = engine.handle([v2(["acct_1"], datatype="BYTES", request_id=None)])
    assert answer.status == 200 and "id" not in answer.body
    assert answer.body["outputs"][0]["datatype"] == "BYTES"
    assert answer.body["outputs"][0]["data"] == ["acct_1"]


@pytest.mark.parametrize(
    ("item", "status"),
    [
        (v2([3], shape=[2]), 400),
        (v2([3], name="x"), 400),
        (v2(["3"], datatype="INT64"), 400),
        (v2([3], datatype="FP32"), 400),
        (v2([]), 400),
        ({"body": {"inputs": []}}, 400),
        ({"body": {"inputs": "nope"}}, 400),
        (v2([1]), 404),
        (v2([0] * 2000), 413),
    ],
)
def test_bad_v2_requests_get_json_errors(int_store, item, status):
    engine = make_engine(int_store)
    (answer,) = engine.handle([item])
    assert answer.status == status and answer.body["code"] == status
    assert answer.body["error"] == answer.body["message"]  # what v2 clients read


@pytest.mark.parametrize("shape", [[2], [2, 1], [1, 2]])
def test_any_shape_of_the_data_s_element_count_is_accepted(int_store, shape):
    engine = make_engine(int_store)
    (answer,) = engine.handle([v2([0, 3], shape=shape)])
    assert answer.status == 200, answer.body
    assert answer.body["outputs"][0]["data"] == [0, 3]


def test_the_binary_extension_is_refused_in_words_a_client_can_read(model_dir):
    from ts.context import RequestProcessor

    handler, context = started(model_dir, 1)
    context.request_processor = [RequestProcessor({"Inference-Header-Content-Length": "120"})]
    (raw,) = handler.handle([{"body": b'{"inputs": []}\x00\x01'}], context)
    body = json.loads(raw)
    assert context.get_response_status(0)[0] == 400
    assert "binary tensor data extension is not supported" in body["error"]
    assert "binary_data=False" in body["error"]


def grpc_body(data, datatype="INT64", request_id="r9"):
    """What TorchServe's frontend hands the handler for a gRPC ModelInfer: model_name in the
    body, every BYTES element base64-encoded."""
    tensor = {"name": "node_ids", "shape": [len(data)], "datatype": datatype, "data": data}
    return {"body": {"id": request_id, "model_name": "gnn", "inputs": [tensor]}}


def test_grpc_bytes_ids_arrive_base64_encoded_and_are_decoded(str_store):
    engine = make_engine(str_store)
    encoded = base64.b64encode(b"acct_1").decode()
    good, bad = engine.handle([grpc_body([encoded], "BYTES"), grpc_body(["%%%"], "BYTES")])
    assert good.status == 200 and good.body["outputs"][0]["data"] == ["acct_1"]
    assert good.body["id"] == "r9"
    assert bad.status == 400 and "not base64" in bad.body["message"]


def test_a_v2_error_is_shaped_so_the_grpc_converter_and_v2_clients_read_it(model_dir):
    handler, context = started(model_dir, 2)
    raw = handler.handle([grpc_body([10_000_000]), v2([0])], context)
    error, good = (json.loads(item) for item in raw)
    assert context.get_response_status(0)[0] == 404
    assert {"id", "model_name", "model_version", "outputs", "error", "code"} <= set(error)
    assert error["id"] == "r9" and error["model_version"] == "1.0"
    assert error["outputs"] == [
        {"name": "error", "shape": [1], "datatype": "BYTES", "data": [error["message"]]}
    ]
    assert context.get_response_status(1)[0] == 200 and good["outputs"][0]["data"] == [0]
