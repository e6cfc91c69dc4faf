"""Parsing of link, graph, embedding and cold-start bodies into their dataclasses."""

from __future__ import annotations

import numpy as np
import pytest

from handler.errors import BadRequest, TooLarge
from handler.task_requests import (
    EmbeddingRequest,
    NewNodeRequest,
    PairRequest,
    TopKRequest,
    clean_edges,
    is_node_extra,
    parse_graph_request,
    parse_link_request,
    parse_node_extra,
)


def body(payload):
    return {"body": payload}


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
    request = parse_node_extra(body({"new_node": {"x": [1, 2.5], "neighbors": [3, "a", 3]}}), 2, 8)
    assert isinstance(request, NewNodeRequest)
    assert request.neighbors == (3, "a") and request.direction == "both"
    assert request.x.dtype == np.float32 and request.x.tolist() == [1.0, 2.5]
    assert request.return_embedding is False
    single = parse_node_extra(body({"node_id": "a", "return_embedding": True}), 2, 8)
    assert single == EmbeddingRequest(("a",), True, True)


def test_inline_graph_is_checked_and_cleaned():
    graph = {"x": [[1, 0], [0, 1], [1, 1]], "edge_index": [[0, 1, 1, 2, 2], [1, 0, 0, 2, 0]]}
    request = parse_graph_request(body({"graph": graph, "return_embedding": True}), 2, 5, 5)
    assert request.x.shape == (3, 2) and request.return_embedding
    # The self-loop 2->2 and the second 1->0 are dropped; sorted by (dst, src).
    assert request.edge_index.tolist() == [[1, 2, 0], [0, 0, 1]]


def test_clean_edges_of_an_empty_graph():
    assert clean_edges(np.zeros((2, 0), dtype=np.int64), 4).shape == (2, 0)
