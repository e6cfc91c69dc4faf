"""KServe v2 bodies served natively, batched with ordinary requests."""

from __future__ import annotations

import numpy as np
import pytest

from .conftest import make_engine


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
