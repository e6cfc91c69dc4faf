"""Inline graphs: one forward per batch, each answer equal to the graph served alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from .conftest import NAMES, graph_engine, graph_requests


def answers(engine, payloads):
    return [(r.status, r.body) for r in engine.handle([{"body": p} for p in payloads])]


@pytest.mark.parametrize(
    ("arch", "pooling"), [("gin", "sum"), ("sage", "mean"), ("gcn", "max"), ("gat", "sum")]
)
def test_a_batched_graph_gets_the_answer_it_gets_alone(arch, pooling):
    engine = graph_engine(arch, pooling)
    payloads = graph_requests(8)
    payloads[3]["return_embedding"] = True
    batched = answers(engine, payloads)
    for payload, (status, body) in zip(payloads, batched, strict=True):
        [(alone_status, alone)] = answers(engine, [payload])
        assert status == alone_status == 200
        assert body["predicted_class"] == alone["predicted_class"]
        assert np.allclose(body["probabilities"], alone["probabilities"], atol=1e-6)
        assert body["predicted_label"] == NAMES[body["predicted_class"]]
    assert len(batched[3][1]["embedding"]) == 16 and "embedding" not in batched[0][1]


def test_answers_equal_the_plain_pyg_forward():
    engine = graph_engine()
    payload = graph_requests(1)[0]
    x = torch.tensor(payload["graph"]["x"])
    edge_index = torch.tensor(payload["graph"]["edge_index"])
    with torch.no_grad():
        expected = torch.softmax(
            engine.model(x, edge_index, torch.zeros(len(x), dtype=torch.long)), -1
        )
    [(_, body)] = answers(engine, [payload])
    assert np.allclose(body["probabilities"], expected[0].numpy(), atol=1e-6)


def test_self_loops_and_parallel_edges_are_served_as_sent():
    engine = graph_engine()  # GIN sums its messages: a repeated edge counts twice
    graph = graph_requests(1)[0]["graph"]
    src, dst = graph["edge_index"]
    noisy = {"graph": {"x": graph["x"], "edge_index": [[*src, 0, src[0]], [*dst, 0, dst[0]]]}}
    x = torch.tensor(graph["x"])
    edge_index = torch.tensor(noisy["graph"]["edge_index"])
    with torch.no_grad():
        expected = torch.softmax(
            engine.model(x, edge_index, torch.zeros(len(x), dtype=torch.long)), -1
        )
    [(_, body)] = answers(engine, [noisy])
    assert np.allclose(body["probabilities"], expected[0].numpy(), atol=1e-6)


def test_a_preset_archive_refuses_edge_attr():
    engine = graph_engine()
    payload = graph_requests(1)[0]
    edges = len(payload["graph"]["edge_index"][0])
    payload["graph"]["edge_attr"] = [[1.0]] * edges
    [(status, body)] = answers(engine, [payload])
    assert status == 400 and "reads no edge features" in body["error"]


@pytest.mark.parametrize(
    ("graph", "status", "words"),
    [
        ({"x": [[1.0] * 8], "edge_index": [[0], [1]]}, 400, "outside [0, 0]"),
        ({"x": [[1.0] * 7], "edge_index": [[], []]}, 400, "8 features"),
        ({"x": [[1.0] * 8, [1.0]], "edge_index": [[], []]}, 400, "matrix"),
        ({"x": [], "edge_index": [[], []]}, 400, "empty"),
        ({"x": [[1e300] * 8], "edge_index": [[], []]}, 400, "float32"),
        ({"x": [[1.0] * 8], "edge_index": [[0, 0], [0]]}, 400, "equal length"),
        ({"x": [[1.0] * 8], "edge_index": [[0]]}, 400, "edge_index"),
        ({"x": [[1.0] * 8] * 6, "edge_index": [[], []]}, 413, "max_graph_nodes"),
        ({"x": [[1.0] * 8] * 2, "edge_index": [[0] * 11, [1] * 11]}, 413, "max_graph_edges"),
        ({"x": [["a"] * 8], "edge_index": [[], []]}, 400, "graph.x"),
        ({"x": [[1.0] * 8], "edges": [[], []]}, 400, "unknown field"),
    ],
)
def test_bad_graphs_get_their_own_error(graph, status, words):
    engine = graph_engine(max_graph_nodes=5, max_graph_edges=10)
    small = {"graph": {"x": [[1.0] * 8] * 3, "edge_index": [[0, 1], [1, 2]]}}
    (good, _), (code, body) = answers(engine, [small, {"graph": graph}])
    assert good == 200
    assert code == status and words in body["message"], body


def test_a_failing_graph_fails_alone(monkeypatch):
    engine = graph_engine()
    forward = engine.classifier.forward_with_embedding

    def fails_on_marker(x, edge_index, batch=None, edge_attr=None):
        if bool((x[:, 1] == -999.0).any()):
            raise ValueError("injected")
        return forward(x, edge_index, batch, edge_attr)

    monkeypatch.setattr(engine.classifier, "forward_with_embedding", fails_on_marker)
    payloads = graph_requests(3)
    payloads[1]["graph"]["x"][0][1] = -999.0
    statuses = [status for status, _ in answers(engine, payloads)]
    assert statuses == [200, 500, 200]
