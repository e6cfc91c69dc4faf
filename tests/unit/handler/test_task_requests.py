"""Parsing of link, graph, embedding and cold-start bodies into their dataclasses."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from graph_assets.schema import GraphSchema
from handler.pipeline.batch import BatchEngine
from handler.protocol.errors import BadRequest, NotFound, TooLarge
from handler.settings import ServingSettings
from handler.tasks.graph.engine import GraphEngine
from handler.tasks.graph.requests import parse_graph_request
from handler.tasks.link.requests import PairRequest, TopKRequest, parse_link_request
from handler.tasks.node.extras import NodeExtrasEngine
from handler.tasks.node.requests import (
    EmbeddingRequest,
    NewNodeRequest,
    is_node_extra,
    parse_node_extra,
)
from model import build_model

from .conftest import FEATURES, make_engine


def body(payload):
    return {"body": payload}


TWO_FEATURES = GraphSchema.homogeneous(10, 20, 2, (), "int")  # what a new node is checked by


def test_link_forms():
    assert parse_link_request(body({"src": "a", "dst": 2}), 8, 10) == PairRequest(
        (("a", 2),), single=True
    )
    assert parse_link_request(body(b'{"pairs": [[1, 2], ["x", 3]]}'), 8, 10) == PairRequest(
        ((1, 2), ("x", 3)), single=False
    )
    assert parse_link_request(body({"src": 1, "top_k": 10}), 8, 10) == TopKRequest(1, 10, True)
    top = parse_link_request(body({"src": 1, "top_k": 3, "exclude_neighbors": False}), 8, 10)
    assert top == TopKRequest(1, 3, False)


@pytest.mark.parametrize(
    ("payload", "error"),
    [
        ({"src": 1, "top_k": 11}, TooLarge),
        ({"pairs": [[1, 2]] * 9}, TooLarge),
        ({"src": 1, "top_k": True}, BadRequest),
        ({"dst": 1, "top_k": 3}, BadRequest),
        ({"pairs": [[1]]}, BadRequest),
        ({"src": None, "dst": 2}, BadRequest),
        ([1, 2], BadRequest),
    ],
)
def test_bad_link_bodies(payload, error):
    with pytest.raises(error):
        parse_link_request(body(payload), 8, 10)


def test_node_extras_are_recognised_by_their_keys():
    assert is_node_extra({"node_id": 1, "return_embedding": False})
    assert is_node_extra({"new_node": {}})
    assert not is_node_extra({"node_id": 1}) and not is_node_extra([1]) and not is_node_extra(None)


def test_cold_start_body_defaults_and_deduplication():
    payload = {"new_node": {"x": [1, 2.5], "neighbors": [3, "a", 3]}}
    request = parse_node_extra(body(payload), TWO_FEATURES, 8)
    assert isinstance(request, NewNodeRequest)
    assert request.neighbors == {"node__to__node": (3, "a")} and request.direction == "both"
    assert request.x.dtype == np.float32 and request.x.tolist() == [1.0, 2.5]
    assert request.return_embedding is False
    single = parse_node_extra(body({"node_id": "a", "return_embedding": True}), TWO_FEATURES, 8)
    assert single == EmbeddingRequest(("a",), True, True)


def test_inline_graph_is_checked_and_kept_as_sent():
    graph = {"x": [[1, 0], [0, 1], [1, 1]], "edge_index": [[0, 1, 1, 2, 2], [1, 0, 0, 2, 0]]}
    request = parse_graph_request(body({"graph": graph, "return_embedding": True}), 2, 5, 5)
    assert request.x.shape == (3, 2) and request.return_embedding
    # The self-loop 2->2 and the parallel 1->0 stay, in the order sent.
    assert request.edge_index.tolist() == graph["edge_index"]
    assert request.edge_attr is None


def test_edge_attr_rows_stay_with_their_edges():
    graph = {
        "x": [[1, 0], [0, 1]],
        "edge_index": [[0, 1, 1], [1, 0, 0]],
        "edge_attr": [[1, 2, 3], [4, 5, 6], [7, 8, 9]],
    }
    request = parse_graph_request(body({"graph": graph}), 2, 5, 5, edge_dim=3)
    assert request.edge_attr is not None and request.edge_attr.dtype == np.float32
    assert request.edge_attr.tolist() == graph["edge_attr"]
    empty = {"x": [[1, 0]], "edge_index": [[], []], "edge_attr": []}
    assert parse_graph_request(body({"graph": empty}), 2, 5, 5, 3).edge_attr.shape == (0, 3)


@pytest.mark.parametrize(
    ("edge_attr", "edge_dim", "words"),
    [
        ([[1.0, 2.0]], 2, r"shape \[2, 2\] \(one row of 2 edge features per edge.*got 1 rows"),
        ([[1.0, 2.0], [3.0]], 2, r"shape \[2, 2\].*row 1 holds 1 values"),
        ([[1.0], [2.0]], 2, r"shape \[2, 2\].*row 0 holds 1 values"),
        (None, 2, r"graph.edge_attr is required.*\[2, 2\]"),
        ([[1.0], [2.0]], 0, "reads no edge features; leave graph.edge_attr out"),
        ([[float("inf"), 1.0], [1.0, 1.0]], 2, "graph.edge_attr holds"),
    ],
)
def test_wrong_edge_attr_is_refused_naming_the_expected_shape(edge_attr, edge_dim, words):
    graph: dict = {"x": [[1, 0], [0, 1]], "edge_index": [[0, 1], [1, 0]]}
    if edge_attr is not None:
        graph["edge_attr"] = edge_attr
    with pytest.raises(BadRequest, match=words):
        parse_graph_request(body({"graph": graph}), 2, 5, 5, edge_dim)


HUGE = 10**400  # a valid JSON integer, beyond float64 and int64


@pytest.mark.parametrize(
    "value",
    [HUGE, -HUGE, 10**39, 1e39, -1e39],
    ids=["1e400", "-1e400", "int-1e39", "1e39", "-1e39"],
)
def test_features_beyond_float32_are_refused(value):
    with pytest.raises(BadRequest, match=r"new_node\.x holds .* beyond float32's range"):
        parse_node_extra(body({"new_node": {"x": [value, 1.0], "neighbors": [3]}}), TWO_FEATURES, 8)
    graph = {"x": [[1.0, 1.0], [1.0, value]], "edge_index": [[0], [1]]}
    with pytest.raises(BadRequest, match=r"graph\.x holds .* beyond float32's range"):
        parse_graph_request(body({"graph": graph}), 2, 5, 5)


@pytest.mark.parametrize(
    "value",
    [HUGE, -HUGE, 2**70, 2**63, -(2**63) - 1],
    ids=["1e400", "-1e400", "2**70", "2**63", "-2**63-1"],
)
def test_edge_numbers_beyond_int64_are_refused_as_out_of_range(value):
    graph = {"x": [[1.0, 1.0], [0.0, 1.0]], "edge_index": [[0, value], [1, 0]]}
    with pytest.raises(BadRequest, match=r"outside \[0, 1\]") as refused:
        parse_graph_request(body({"graph": graph}), 2, 5, 5)
    assert len(refused.value.message) < 200  # the number is quoted in short


@pytest.mark.parametrize(("top_k", "error"), [(HUGE, TooLarge), (-HUGE, BadRequest)])
def test_a_huge_top_k_is_quoted_in_short(top_k, error):
    with pytest.raises(error, match="top_k") as refused:
        parse_link_request(body({"src": 1, "top_k": top_k}), 8, 10)
    assert len(refused.value.message) < 200


def no_tracebacks(caplog) -> None:
    assert [r.getMessage() for r in caplog.records if r.exc_info] == []


def test_huge_numbers_are_answered_400_with_no_traceback(int_store, caplog):
    torch.manual_seed(0)
    model = build_model({"task": "graph", "arch": "gin", "in_dim": 2, "out_dim": 2})
    graphs = GraphEngine(
        model, None, ServingSettings(task="graph"), torch.device("cpu"), model_version="1.0"
    )
    extras = NodeExtrasEngine(make_engine(int_store).ego, "1.0")
    graph = {"x": [[1.0, HUGE]], "edge_index": [[0], [HUGE]]}
    new_node = {"new_node": {"x": [HUGE] * FEATURES, "neighbors": [0]}}
    with caplog.at_level(logging.INFO):
        answers = graphs.handle([{"body": {"graph": graph}}] * 2)
        answers += extras.handle([{"body": new_node}] * 2)
    assert [answer.status for answer in answers] == [400] * 4
    no_tracebacks(caplog)


class _RefusesGroups(BatchEngine[int]):
    """Refuses every group it is asked to prepare, as a make_group may (a 4xx ApiError)."""

    device = torch.device("cpu")

    def parse(self, item):
        return 0

    def make_group(self, positions, outcomes):
        raise NotFound("no such thing")

    def run_group(self, group, batch):
        raise AssertionError("never reached")

    def body(self, request, result):
        return {}


def test_a_refused_group_logs_no_traceback(caplog):
    with caplog.at_level(logging.INFO):
        answers = _RefusesGroups().handle([{"body": {}}] * 3)
    assert [answer.status for answer in answers] == [404] * 3
    no_tracebacks(caplog)
