"""Explanations: Integrated Gradients on the ego-graph, deterministic, bounded by the budget."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from handler.explain.ego_explain import ExplainEngine, integrated_gradients, summarize
from handler.settings import ServingSettings
from handler.tasks.graph.explain import GraphExplanation
from handler.tasks.link.explain import PairExplanation
from handler.tasks.node.explain import NodeExplanation
from handler.tasks.node.task import node_router

from .conftest import graph_engine, graph_requests, link_engine, make_engine, random_model


def node_explainer(store, arch="gcn", **settings) -> ExplainEngine:
    settings.setdefault("explain_time_budget_ms", 60_000)  # steps not cut on a busy machine
    engine = make_engine(store, arch, model=random_model(store, arch), **settings)
    return ExplainEngine(NodeExplanation(engine.ego), "1.0")


def answers(engine, payloads):
    return [(r.status, r.body) for r in engine.handle([{"body": p} for p in payloads])]


@pytest.mark.parametrize("arch", ["gcn", "sage", "gat", "gin"])
def test_node_explanation_lists_neighbours_edges_and_features(int_store, arch):
    engine = node_explainer(int_store, arch)
    [(status, body)] = answers(engine, [{"node_id": 0}])
    assert status == 200, body
    explanation = body["explanation"]
    assert explanation["method"] == "IntegratedGradients"
    assert explanation["steps"] == 32 and explanation["budget_limited"] is False
    assert len(explanation["nodes"]) == len(explanation["edges"]) == 10
    assert len(explanation["features"]) == int_store.feature_dim  # 6 < top_k
    magnitudes = [abs(n["attribution"]) for n in explanation["nodes"]]
    assert magnitudes == sorted(magnitudes, reverse=True)
    ids = set(int_store.external_ids(np.arange(int_store.num_nodes)))
    assert {n["node_id"] for n in explanation["nodes"]} <= ids
    assert all(e["dst"] in ids and e["src"] in ids for e in explanation["edges"])
    plain = make_engine(int_store, arch, model=engine.explanation.ego.model).handle(
        [{"body": {"node_id": 0}}]
    )
    assert np.allclose(body["probabilities"], plain[0].body["probabilities"], atol=1e-6)


def test_explanations_are_deterministic(int_store):
    engine = node_explainer(int_store, fanouts=[4, 3])
    first, second = answers(engine, [{"node_id": 3}, {"node_id": 3}])
    for body in (first[1], second[1]):
        body["explanation"].pop("seconds")
    assert first == second


def test_attributions_add_up_to_the_output_minus_the_baseline(int_store):
    """Integrated Gradients' completeness: a check that the attributions are IG's."""
    torch.manual_seed(0)
    model = random_model(int_store, "sage")
    x = torch.from_numpy(np.array(int_store.features))
    edge_index = torch.from_numpy(int_store.edge_index())
    attribution = integrated_gradients(
        model,
        x,
        edge_index,
        mode="multiclass_classification",
        level="node",
        steps=200,
        budget_s=60.0,
    )
    with torch.no_grad():
        logits = model(x, edge_index)[0]
        target = int(logits.argmax())
        empty = torch.empty(2, 0, dtype=torch.long)
        baseline = model(torch.zeros_like(x), empty)[0, target]
    total = float(attribution.node_mask.sum() + attribution.edge_mask.sum())
    assert total == pytest.approx(float(logits[target] - baseline), abs=2e-2)


def test_the_time_budget_cuts_the_steps(int_store):
    engine = node_explainer(int_store, explain_time_budget_ms=1, explain_steps=50)
    [(status, body)] = answers(engine, [{"node_id": 0}])
    assert status == 200
    assert body["explanation"]["steps"] == 1 and body["explanation"]["budget_limited"] is True


def test_pair_and_graph_explanations(int_store, tmp_path):
    link = link_engine(int_store, tmp_path)
    explainer = ExplainEngine(PairExplanation(link.ego), "1.0")
    [(status, body)] = answers(explainer, [{"src": 3, "dst": 6}])
    [(_, scored)] = answers(link, [{"src": 3, "dst": 6}])
    assert status == 200 and body["score"] == pytest.approx(scored["score"], abs=1e-6)
    assert {body["explanation"]["nodes"][0]["node_id"]} <= {3 * i for i in range(80)}

    graphs = graph_engine()
    explainer = ExplainEngine(GraphExplanation(graphs), "1.0")
    payload = graph_requests(1)[0]
    [(status, body)] = answers(explainer, [payload])
    [(_, predicted)] = answers(graphs, [payload])
    assert status == 200 and body["predicted_class"] == predicted["predicted_class"]
    n = len(payload["graph"]["x"])
    assert all(0 <= e["src"] < n and 0 <= e["dst"] < n for e in body["explanation"]["edges"])


@pytest.mark.parametrize(
    ("payload", "status"),
    [({"node_ids": [0, 3]}, 400), ({"node_id": 1}, 404), ({"node_id": 0, "x": 1}, 400)],
)
def test_explanation_requests_are_validated(int_store, payload, status):
    engine = node_explainer(int_store)
    [(code, body)] = answers(engine, [payload])
    assert code == status, body


def test_a_batch_mixing_explanations_predictions_and_embeddings(int_store):
    router = node_router(make_engine(int_store, "sage"), "1.0")
    items = [{"body": {"node_id": 3}}, {"body": b'{"node_id": 3}'}, {"body": {"node_id": 3}}]
    items.append({"body": {"node_id": 3, "return_embedding": True}})
    items.append({"body": b"{broken"})
    responses = router.handle(items, explain=[False, True, False, False, True])
    statuses = [r.status for r in responses]
    assert statuses == [200, 200, 200, 200, 400]
    assert "explanation" in responses[1].body and "explanation" not in responses[0].body
    assert responses[0].body == responses[2].body
    assert "embedding" in responses[3].body


def test_summarize_adds_up_copies_of_a_node_and_of_an_edge():
    from handler.explain.ego_explain import Attribution

    # Rows 0 and 2 are the same node (7) at two hops; edges 0 and 1 are both 5 -> 7.
    attribution = Attribution(
        node_mask=torch.tensor([[1.0, 0.0], [0.0, -3.0], [0.5, 0.5]]),
        edge_mask=torch.tensor([0.25, 0.5, -1.0]),
        steps=4,
        budget_limited=False,
        seconds=0.1,
    )
    edge_index = torch.tensor([[1, 1, 0], [0, 2, 1]])
    rows = np.array([7, 5, 7])
    summary = summarize(attribution, ["n5", "n7"], edge_index, rows, top_k=5)
    assert summary["nodes"] == [
        {"node_id": "n5", "attribution": -3.0},
        {"node_id": "n7", "attribution": 2.0},
    ]
    assert summary["edges"] == [
        {"src": "n7", "dst": "n5", "attribution": -1.0},
        {"src": "n5", "dst": "n7", "attribution": 0.75},
    ]
    assert summary["features"] == [
        {"feature": 1, "attribution": -2.5},
        {"feature": 0, "attribution": 1.5},
    ]


def test_settings_reject_a_zero_budget():
    with pytest.raises(ValueError, match="explain_time_budget_ms"):
        ServingSettings.from_yaml_section({"explain_time_budget_ms": 0})
