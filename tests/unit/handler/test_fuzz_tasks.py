"""Fuzzing of the other request kinds: link, graph (JSON and KServe v2), node extras, and graph
updates.

Same contract as test_fuzz.py: any input is parsed or refused with a 4xx ApiError, never an
exception; an update either applies or changes nothing.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graph_assets.schema import GraphSchema
from handler.live.live_graph import LiveGraph, UpdatePolicy
from handler.protocol.errors import ApiError
from handler.tasks.graph.requests import parse_graph_request
from handler.tasks.link.requests import parse_link_request
from handler.tasks.node.requests import parse_node_extra
from tests.strategies import json_values

from .conftest import FEATURES, answer_update

FUZZ = settings(
    max_examples=150,
    deadline=2000,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
ids = st.integers(min_value=0, max_value=79).map(lambda i: i * 3) | json_values
# JSON integers are unbounded: beyond int64, float64 and float32 (1e39 as an integer).
huge = st.sampled_from([2**63, -(2**63) - 1, 2**70, 10**39, 10**400, -(10**400)])
numbers = st.floats(allow_nan=True, allow_infinity=True) | st.integers() | huge | json_values
rows = st.lists(numbers, max_size=FEATURES + 2)
link_bodies = st.fixed_dictionaries(
    {},
    optional={
        "src": ids,
        "dst": ids,
        "pairs": st.lists(st.lists(ids, max_size=3), max_size=5) | json_values,
        "top_k": st.integers(-5, 5000) | json_values,
        "exclude_neighbors": json_values,
    },
)
graph_bodies = st.fixed_dictionaries(
    {},
    optional={
        "graph": st.fixed_dictionaries(
            {},
            optional={
                "x": st.lists(rows, max_size=6) | json_values,
                "edge_index": st.lists(st.lists(st.integers(-3, 8) | huge, max_size=8), max_size=3)
                | json_values,
            },
        )
        | json_values,
        "return_embedding": json_values,
    },
)
extra_bodies = st.fixed_dictionaries(
    {},
    optional={
        "node_id": ids,
        "node_ids": st.lists(ids, max_size=5),
        "return_embedding": json_values,
        "new_node": st.fixed_dictionaries(
            {},
            optional={
                "x": rows | json_values,
                "neighbors": st.lists(ids, max_size=5),
                "direction": st.sampled_from(["in", "out", "both", "up"]) | json_values,
            },
        )
        | json_values,
    },
)
v2_tensors = st.fixed_dictionaries(
    {},
    optional={
        "name": st.sampled_from(["pairs", "x", "edge_index", "node_ids"]) | json_values,
        "shape": st.lists(st.integers(-2, 10), max_size=3) | json_values,
        "datatype": st.sampled_from(["INT64", "INT32", "BYTES", "FP32", "FP64", "BOOL"])
        | json_values,
        "data": st.lists(numbers | st.text(max_size=6) | st.lists(numbers, max_size=9), max_size=12)
        | json_values,
    },
)
v2_bodies = st.fixed_dictionaries(
    {"inputs": st.lists(v2_tensors, max_size=3) | json_values},
    optional={"id": json_values, "model_name": st.just("gnn")},  # model_name: as over gRPC
)
operation_types = st.sampled_from(
    ["add_node", "add_edge", "remove_edge", "set_features", "remove_node", "other"]
)
operations = st.lists(
    st.fixed_dictionaries(
        {"type": operation_types},
        optional={"id": ids, "src": ids, "dst": ids, "x": rows, "label": json_values},
    )
    | json_values,
    max_size=4,
)


def refused_cleanly(call) -> None:
    try:
        call()
    except ApiError as error:
        assert 400 <= error.status < 500
        assert set(error.body()) == {"code", "type", "message", "error"}


@FUZZ
@given(body=link_bodies | json_values)
def test_link_requests(body):
    refused_cleanly(lambda: parse_link_request({"body": body}, max_ids=8, max_top_k=100))


@FUZZ
@given(body=graph_bodies | json_values)
def test_graph_requests(body):
    refused_cleanly(lambda: parse_graph_request({"body": body}, FEATURES, max_nodes=5, max_edges=6))


@FUZZ
@given(body=v2_bodies)
def test_v2_link_and_graph_requests(body):
    refused_cleanly(lambda: parse_link_request({"body": body}, max_ids=8, max_top_k=100))
    refused_cleanly(lambda: parse_graph_request({"body": body}, FEATURES, max_nodes=5, max_edges=6))


@FUZZ
@given(body=extra_bodies | json_values)
def test_node_extras(body):
    schema = GraphSchema.homogeneous(10, 20, FEATURES, (), "int")
    refused_cleanly(lambda: parse_node_extra({"body": body}, schema, max_ids=8))


@FUZZ
@given(ops=operations | json_values)
def test_updates_apply_or_change_nothing(int_store, tmp_path_factory, ops):
    live = LiveGraph(int_store, tmp_path_factory.mktemp("fuzz") / "updates.log")
    policy = UpdatePolicy(secret="s" * 20, max_operations=3)
    status, body = answer_update({"op": "update", "operations": ops}, "s" * 20, live, policy)
    if status == 200:
        assert live.overlay.seq == 1 and body["seq"] == 1
    else:
        assert 400 <= status < 500 and set(body) == {"code", "type", "message", "error"}
        assert live.overlay.seq == 0 and live.log is not None and live.log.size() == 0
