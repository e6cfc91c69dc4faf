"""KServe v2 bodies served natively by every task, batched with ordinary requests: node IDs,
link pairs ``[n, 2]``, inline graphs as ``x`` and ``edge_index``."""

from __future__ import annotations

import base64
import json
import re

import numpy as np
import pytest

from handler.protocol.errors import BadRequest
from handler.tasks.graph.explain import GraphExplanation
from handler.tasks.link.explain import PairExplanation

from .conftest import graph_engine, graph_requests, link_engine, make_engine, started


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
        (v2([3], shape=[1], datatype="BYTES"), 400),
        (v2([[3], 6], shape=[2]), 400),
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


def test_nested_data_is_read_as_its_flat_row_major_form(int_store):
    engine = make_engine(int_store)
    nested, flat = engine.handle([v2([[0], [3]], shape=[2, 1]), v2([0, 3], shape=[2, 1])])
    assert nested.status == flat.status == 200
    assert nested.body["outputs"] == flat.body["outputs"]


def test_a_tensor_whose_values_did_not_arrive_says_where_to_send_them(int_store):
    # TorchServe's gRPC conversion drops raw_input_contents: the handler sees no values
    (answer,) = make_engine(int_store).handle([grpc_body([], "INT64")])
    assert answer.status == 400 and "raw_input_contents" in answer.body["message"]


def v2_pairs(pairs, datatype="INT64", shape=None, request_id="p1", name="pairs"):
    data = [node for pair in pairs for node in pair]
    tensor = {"name": name, "shape": shape or [len(pairs), 2], "datatype": datatype, "data": data}
    return {"id": request_id, "inputs": [tensor]}


def outputs_of(body):
    return {o["name"]: o for o in body["outputs"]}


def test_v2_pairs_equal_the_json_pairs_batched_with_them(int_store, tmp_path):
    engine = link_engine(int_store, tmp_path)
    pairs = [[0, 3], [6, 9], [3, 0]]
    v2_answer, json_answer = engine.handle([{"body": v2_pairs(pairs)}, {"body": {"pairs": pairs}}])
    assert v2_answer.status == json_answer.status == 200
    body = v2_answer.body
    assert body["id"] == "p1" and body["model_name"] == "link" and body["model_version"] == "1.0"
    outputs = outputs_of(body)
    assert outputs["src"] == {"name": "src", "shape": [3], "datatype": "INT64", "data": [0, 6, 3]}
    assert outputs["dst"]["data"] == [3, 9, 0] and outputs["dst"]["datatype"] == "INT64"
    assert outputs["score"]["datatype"] == "FP32" and outputs["score"]["shape"] == [3]
    expected = [p["score"] for p in json_answer.body["predictions"]]
    assert np.allclose(outputs["score"]["data"], expected, atol=1e-6)


def test_v2_string_pairs_over_grpc_arrive_base64_encoded(str_store, tmp_path):
    engine = link_engine(str_store, tmp_path)
    encoded = [base64.b64encode(node.encode()).decode() for node in ("acct_1", "acct_2")]
    grpc = {**v2_pairs([encoded], datatype="BYTES"), "model_name": "link"}
    v2_answer, json_answer = engine.handle(
        [{"body": grpc}, {"body": {"src": "acct_1", "dst": "acct_2"}}]
    )
    assert v2_answer.status == 200, v2_answer.body
    outputs = outputs_of(v2_answer.body)
    assert outputs["src"]["data"] == ["acct_1"] and outputs["src"]["datatype"] == "BYTES"
    assert outputs["score"]["data"] == pytest.approx([json_answer.body["score"]], abs=1e-6)


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (v2_pairs([[0, 3]], shape=[2]), 400, "shape [n, 2]"),
        (v2_pairs([[0, 3, 6]], shape=[1, 3]), 400, "shape [n, 2]"),
        (v2_pairs([[0, 3]], shape=[3, 2]), 400, "does not hold"),
        (v2_pairs([[0, 3]], name="node_ids"), 400, "pairs"),
        (v2_pairs([[0, 3]], datatype="FP32"), 400, "datatype"),
        (v2_pairs([]), 400, "holds no values"),
        (v2_pairs([[0, 3]] * 9), 413, "at most 8"),
        (v2_pairs([[0, 3]] * 20), 413, "max_ids_per_request"),
        ({"inputs": [{"name": "pairs", "data": [[0, 3]] * 9}]}, 413, "at most 8"),
        (v2_pairs([[0, 4]]), 404, "not in the graph: 4"),
    ],
)
def test_bad_v2_pairs_get_their_own_error(int_store, tmp_path, body, status, words):
    engine = link_engine(int_store, tmp_path, max_ids_per_request=8)
    good, bad = engine.handle([{"body": v2_pairs([[0, 3]])}, {"body": body}])
    assert good.status == 200
    assert bad.status == status and words in bad.body["message"], bad.body
    assert bad.body["error"] == bad.body["message"]


def v2_graph(graph, request_id="g1", x_type="FP32", nested=False):
    x, edges = graph["x"], graph["edge_index"]
    return {
        "id": request_id,
        "inputs": [
            {
                "name": "x",
                "shape": [len(x), len(x[0]) if x else 0],
                "datatype": x_type,
                "data": x if nested else [value for row in x for value in row],
            },
            {
                "name": "edge_index",
                "shape": [2, len(edges[0])],
                "datatype": "INT64",
                "data": edges if nested else edges[0] + edges[1],
            },
        ],
    }


@pytest.mark.parametrize("nested", [False, True])
def test_a_v2_graph_gets_the_answer_of_its_json_body(nested):
    engine = graph_engine()
    payloads = graph_requests(3)
    items = [{"body": v2_graph(p["graph"], f"g{i}", nested=nested)} for i, p in enumerate(payloads)]
    answers = engine.handle(items + [{"body": p} for p in payloads])
    for i, (v2_answer, json_answer) in enumerate(zip(answers[:3], answers[3:], strict=True)):
        assert v2_answer.status == json_answer.status == 200
        assert v2_answer.body["id"] == f"g{i}" and v2_answer.body["model_name"] == "graphs"
        outputs = outputs_of(v2_answer.body)
        assert outputs["predicted_class"] == {
            "name": "predicted_class",
            "shape": [1],
            "datatype": "INT64",
            "data": [json_answer.body["predicted_class"]],
        }
        probabilities = outputs["probabilities"]
        assert probabilities["shape"] == [1, 4] and probabilities["datatype"] == "FP32"
        assert np.allclose(probabilities["data"], json_answer.body["probabilities"], atol=1e-6)


def test_a_v2_graph_without_edges_and_with_fp64_integer_features_is_answered():
    engine = graph_engine()
    graph = {"x": [[1] * 8, [0] * 8], "edge_index": [[], []]}
    v2_answer, json_answer = engine.handle(
        [{"body": v2_graph(graph, x_type="FP64")}, {"body": {"graph": graph}}]
    )
    assert v2_answer.status == json_answer.status == 200, v2_answer.body
    data = outputs_of(v2_answer.body)["probabilities"]["data"]
    assert np.allclose(data, json_answer.body["probabilities"], atol=1e-6)


ONE_NODE = {"x": [[1.0] * 8], "edge_index": [[], []]}


def with_tensor(body, index, **changes):
    inputs = [dict(tensor) for tensor in body["inputs"]]
    inputs[index].update(changes)
    return {**body, "inputs": inputs}


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (v2_graph({"x": [[1.0] * 7], "edge_index": [[], []]}), 400, "shape [n, 8]"),
        (v2_graph({"x": [[1.0] * 8], "edge_index": [[0], [1]]}), 400, "outside [0, 0]"),
        (v2_graph({"x": [[1e300] * 8], "edge_index": [[], []]}), 400, "float32"),
        (v2_graph({"x": [[1.0] * 8] * 6, "edge_index": [[], []]}), 413, "max_graph_nodes"),
        (
            v2_graph({"x": [[1.0] * 8] * 2, "edge_index": [[0] * 11, [1] * 11]}),
            413,
            "max_graph_edges",
        ),
        (with_tensor(v2_graph(ONE_NODE), 1, shape=[0, 2]), 400, "shape [2, e]"),
        (with_tensor(v2_graph(ONE_NODE), 1, datatype="FP32"), 400, "INT64 or INT32"),
        (with_tensor(v2_graph(ONE_NODE), 0, datatype="BYTES"), 400, "FP32 or FP64"),
        (with_tensor(v2_graph(ONE_NODE), 0, data=["a"] * 8), 400, "needs number values"),
        (with_tensor(v2_graph(ONE_NODE), 0, data=[True] * 8), 400, "needs number values"),
        (with_tensor(v2_graph(ONE_NODE), 1, name="x"), 400, "sent twice"),
        ({"inputs": v2_graph(ONE_NODE)["inputs"][:1]}, 400, "x and edge_index"),
    ],
)
def test_bad_v2_graphs_get_their_own_error(body, status, words):
    engine = graph_engine(max_graph_nodes=5, max_graph_edges=10)
    good, bad = engine.handle([{"body": v2_graph(ONE_NODE)}, {"body": body}])
    assert good.status == 200
    assert bad.status == status and words in bad.body["message"], bad.body


def test_explanations_refuse_v2_bodies_and_say_what_to_send(int_store, tmp_path):
    pairs = PairExplanation(link_engine(int_store, tmp_path).ego)
    with pytest.raises(BadRequest, match=re.escape('JSON body, e.g. {"src": 1, "dst": 2}')):
        pairs.parse({"body": v2_pairs([[0, 3]])})
    graphs = GraphExplanation(graph_engine())
    with pytest.raises(BadRequest, match="not KServe v2 tensors"):
        graphs.parse({"body": v2_graph(ONE_NODE)})
