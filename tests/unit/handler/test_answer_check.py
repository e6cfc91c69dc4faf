"""A model's NaN or infinity is that request's 500 naming the node, never a 200 with ``null``
probabilities; the other requests of its batch are answered as usual."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from handler.protocol.answer_check import non_finite_error
from tests.served_wrapper import Wrapping

from .conftest import graph_engine, graph_requests, make_engine, random_model
from .test_engine_faults import assert_same_answers, isolated_ids
from .test_kserve_v2 import v2

NAN, INF = float("nan"), float("inf")


def message_for(subject: str) -> str:
    return (
        f"non-finite output (NaN/inf) from the model for {subject}: the model or the features "
        "it read are broken, not the request; check the model's weights and the graph's "
        "features (the server log names this request)"
    )


class NonFiniteOnNode(Wrapping):
    """``inner``'s output, with ``value`` in every row whose input features are ``marker``."""

    def __init__(self, inner: torch.nn.Module, marker: torch.Tensor, value: float):
        super().__init__(inner)
        self.marker, self.value = marker, value

    def forward(self, x, edge_index, degree=None, level_sizes=None):
        rows = self.inner(x, edge_index, degree=degree, level_sizes=level_sizes).clone()
        rows[(x == self.marker).all(dim=1)] = self.value
        return rows


@pytest.mark.parametrize(
    ("body", "subject"),
    [
        ({"node_id": 7, "predicted_class": 0, "probabilities": [NAN, 0.5]}, "node 7"),
        ({"node_id": "acct_1", "output": [INF]}, "node 'acct_1'"),
        (
            {
                "predictions": [
                    {"node_id": 1, "probabilities": [0.5]},
                    {"node_id": 2, "output": [-INF]},
                ]
            },
            "node 2",
        ),
        ({"node_id": 3, "probabilities": [0.5], "embedding": [0.1, NAN]}, "node 3"),
        ({"src": 1, "dst": 2, "score": NAN, "model_version": "1.0"}, "link 1 -> 2"),
        (
            {
                "predictions": [
                    {"src": 1, "dst": 2, "score": 0.3},
                    {"src": 4, "dst": 5, "score": INF},
                ]
            },
            "link 4 -> 5",
        ),
        (
            {"src": 9, "recommendations": [{"dst": 2, "score": NAN}]},
            "the recommendations for node 9",
        ),
        ({"new_node": {"neighbors": [1]}, "probabilities": [NAN]}, "the new node"),
        ({"predicted_class": 0, "probabilities": [0.2, 0.8], "embedding": [NAN]}, "this request"),
        (  # an explanation is about its target, not the nodes it lists
            {
                "node_id": 42,
                "probabilities": [1.0],
                "explanation": {"nodes": [{"node_id": 8, "attribution": NAN}]},
            },
            "node 42",
        ),
        (  # v2: the row of the bad value names its node
            {
                "outputs": [
                    {"name": "node_id", "datatype": "INT64", "shape": [2], "data": [3, 6]},
                    {"name": "predicted_class", "datatype": "INT64", "shape": [2], "data": [0, 0]},
                    {"name": "probabilities", "shape": [2, 2], "data": [0.5, 0.5, 0.1, NAN]},
                ]
            },
            "node 6",
        ),
        (
            {
                "outputs": [
                    {"name": "src", "shape": [2], "data": ["a", "b"]},
                    {"name": "dst", "shape": [2], "data": ["c", "d"]},
                    {"name": "score", "shape": [2], "data": [NAN, 0.1]},
                ]
            },
            "link 'a' -> 'c'",
        ),
        (
            {"outputs": [{"name": "probabilities", "shape": [1, 2], "data": [INF, 0.0]}]},
            "this request",
        ),
    ],
)
def test_a_non_finite_number_anywhere_in_an_answer_names_what_it_belongs_to(body, subject):
    error = non_finite_error(body)
    assert error is not None
    assert error.body() == {
        "code": 500,
        "type": "NonFiniteOutput",
        "message": message_for(subject),
        "error": message_for(subject),
    }


@pytest.mark.parametrize(
    "body",
    [
        {"node_id": 1, "predicted_class": 1, "probabilities": [0.25, 0.75], "graph_version": "x+1"},
        {"node_id": 2**70, "predicted_label": None, "probabilities": [1e308, 1e308]},  # overflow
        {"outputs": [{"name": "node_id", "data": [3]}, {"name": "probabilities", "data": [1.0]}]},
        {"predictions": [], "model_version": "1.0"},
    ],
)
def test_finite_answers_pass(body):
    assert non_finite_error(body) is None


@pytest.mark.parametrize("value", [NAN, INF, -INF])
def test_a_model_that_outputs_non_finite_rows_fails_only_the_requests_of_that_node(
    int_store, value
):
    poisoned, *others = isolated_ids(int_store)  # each one's ego-graph is itself alone
    row = torch.from_numpy(np.array(int_store.features[int_store.lookup([poisoned])[0]]))
    inner = random_model(int_store, "sage")
    engine = make_engine(int_store, model=NonFiniteOnNode(inner, row, value))
    payloads = [
        {"body": {"node_id": others[0]}},
        {"body": {"node_id": poisoned}},
        {"body": {"node_ids": [others[1], poisoned]}},
        {"body": {"node_ids": others[2:4]}},
        v2([poisoned]),
    ]
    responses = engine.handle(payloads)
    assert [r.status for r in responses] == [200, 500, 500, 200, 500]
    for response in (responses[1], responses[2], responses[4]):
        assert response.body == {
            "code": 500,
            "type": "NonFiniteOutput",
            "message": message_for(f"node {poisoned}"),
            "error": message_for(f"node {poisoned}"),
        }
    reference = make_engine(int_store, model=inner).handle([payloads[0], payloads[3]])
    assert_same_answers([responses[0].body, responses[3].body], [r.body for r in reference])
    assert all(math.isfinite(p) for p in responses[0].body["probabilities"])
    (after,) = engine.handle([{"body": {"node_id": others[0]}}])  # the next batch is answered
    assert after.status == 200
    assert_same_answers([after.body], [reference[0].body])


def test_a_graph_embedding_with_nan_fails_only_the_request_that_asked_for_it(monkeypatch):
    engine = graph_engine()
    forward = engine.classifier.forward_with_embedding

    def nan_in_odd_embeddings(*args):
        rows, embedding = forward(*args)
        embedding = embedding.clone()
        embedding[1::2] = NAN  # the second and the fourth graph of the batch
        return rows, embedding

    monkeypatch.setattr(engine.classifier, "forward_with_embedding", nan_in_odd_embeddings)
    bodies = graph_requests(3)
    payloads = [{"body": {**body, "return_embedding": True}} for body in bodies]
    payloads.append({"body": bodies[1]})  # a NaN embedding too, but not asked for
    responses = engine.handle(payloads)
    assert [r.status for r in responses] == [200, 500, 200, 200]
    assert responses[1].body["type"] == "NonFiniteOutput"
    assert responses[1].body["message"] == message_for("this request")
    assert "embedding" not in responses[3].body
