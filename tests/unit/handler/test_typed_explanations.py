"""Explanations on a graph of several node types: every recipe and a user's HeteroConv model
explain the answer the node engine serves, naming node types, relations and IDs the store has;
attributions are Integrated Gradients' (they add up) with each relation's mask on its own
messages; deterministic; bad requests are 400s."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch
from torch_geometric.nn import SAGEConv

from graph_assets import GraphStore
from handler.explain.ego_explain import ExplainEngine
from handler.explain.typed_explain import relation_masks, typed_integrated_gradients
from handler.settings import ServingSettings
from handler.tasks.node.engine import NodeClassificationEngine
from handler.tasks.node.explain import NodeExplanation
from model.served_hetero import UserHeteroModel
from model.typed_batch import HeteroInput
from model.typed_rows import TypedSubgraph, gather_typed
from tests.typed_graphs import fraud_store, hetero_conv_model, node_recipe

ARCHS = ["sage", "gat", "gcn", "gin", "rgcn", "hgt"]
MODELS = [*ARCHS, "heteroconv"]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> GraphStore:
    return fraud_store(tmp_path_factory.mktemp("typed_explain") / "store", 120, 20, 50, 400, 3)


@pytest.fixture(scope="module")
def busiest_user(store: GraphStore) -> str:
    """The user with the most in-edges (payments back from merchants and devices)."""
    users = store.schema.target_type.num_nodes
    return store.external_ids(np.array([int(np.argmax(store.in_degree[:users]))]))[0]


def model_of(store: GraphStore, name: str) -> torch.nn.Module:
    return hetero_conv_model(store) if name == "heteroconv" else node_recipe(store, name)


def engines(
    store: GraphStore, model: torch.nn.Module, fanouts: list[int]
) -> tuple[NodeClassificationEngine, ExplainEngine]:
    settings = ServingSettings.from_yaml_section(
        {"fanouts": fanouts, "explain_time_budget_ms": 60_000}  # steps not cut when busy
    )
    served = NodeClassificationEngine.create(store, model, settings, torch.device("cpu"), "1.0")
    return served, ExplainEngine(NodeExplanation(served.ego), "1.0")


def answers(engine: Any, payloads: list[Any]) -> list[tuple[int, dict]]:
    return [(r.status, r.body) for r in engine.handle([{"body": p} for p in payloads])]


def stored_edge(store: GraphStore, edge: dict) -> bool:
    """The store has an edge of ``edge["edge_type"]`` from ``src`` to ``dst`` (IDs of the
    relation's end types)."""
    src_type, _, dst_type = edge["edge_type"].split("__")
    [src], [dst] = store.lookup([edge["src"]], src_type), store.lookup([edge["dst"]], dst_type)
    assert src >= 0 and dst >= 0, edge
    begin, end = int(store.indptr[dst]), int(store.indptr[dst + 1])
    sources = np.asarray(store.indices[begin:end])
    relations = store.edge_relations(np.arange(begin, end))
    relation = store.schema.relation_index(edge["edge_type"])
    return bool(((sources == src) & (relations == relation)).any())


def by_magnitude(entries: list[dict]) -> bool:
    magnitudes = [abs(entry["attribution"]) for entry in entries]
    return magnitudes == sorted(magnitudes, reverse=True)


@pytest.mark.parametrize("name", MODELS)
def test_an_explanation_explains_the_served_answer_in_the_graphs_names(
    store: GraphStore, busiest_user: str, name: str
) -> None:
    served, explainer = engines(store, model_of(store, name), [-1, -1])
    [(status, body)] = answers(explainer, [{"node_type": "user", "node_id": busiest_user}])
    assert status == 200, body
    [(_, predicted)] = answers(served, [{"node_id": busiest_user}])
    assert (body["node_id"], body["node_type"]) == (busiest_user, "user")
    assert body["probabilities"] == predicted["probabilities"]
    assert body["predicted_class"] == predicted["predicted_class"]
    explanation = body["explanation"]
    assert explanation["steps"] == 32 and explanation["budget_limited"] is False
    nodes, edges, features = explanation["nodes"], explanation["edges"], explanation["features"]
    assert len(nodes) == len(edges) == len(features) == 10
    assert by_magnitude(nodes) and by_magnitude(edges) and by_magnitude(features)
    for node in nodes:
        assert store.lookup([node["node_id"]], node["node_type"])[0] >= 0, node
    assert all(stored_edge(store, edge) for edge in edges)
    assert {edge["edge_type"] for edge in edges} <= set(store.schema.edge_type_names)
    widths = {t.name: t.feature_dim for t in store.schema.node_types}
    assert all(0 <= f["feature"] < widths[f["node_type"]] for f in features)
    assert {"user", "merchant"} <= {f["node_type"] for f in features}


def seed_input(store: GraphStore, served: NodeClassificationEngine, user: str) -> TypedSubgraph:
    """The user's ego-graph as an explanation gathers it."""
    _, sub = served.ego.sample(store.lookup([user]))
    edge_index = sub.edge_index.clone()
    return gather_typed(
        store.schema, store, sub.node.numpy(), edge_index, sub.edge.numpy(), torch.device("cpu")
    )


def without_edges(inputs: HeteroInput, kept: tuple[str, str, str] | None = None) -> HeteroInput:
    """``inputs`` with the edges of every relation but ``kept`` left out."""
    return HeteroInput(
        inputs.x_dict,
        {key: e if key == kept else e[:, :0] for key, e in inputs.edge_index_dict.items()},
        inputs.n_id_dict,
        {key: a if key == kept else a[:0] for key, a in inputs.edge_attr_dict.items()},
    )


@pytest.mark.parametrize("name", MODELS)
def test_attributions_add_up_to_the_output_minus_the_empty_graphs(
    store: GraphStore, busiest_user: str, name: str
) -> None:
    """IG's completeness from the baseline of no features and every edge masked, which is
    the graph without edges only when every relation's mask reaches all its messages."""
    model = model_of(store, name)
    served, _ = engines(store, model, [4, 3])
    typed = seed_input(store, served, busiest_user)
    inputs = typed.inputs()
    with torch.no_grad():
        logits = model(inputs)[0]
        target = int(logits.argmax())
        zeros = {key: torch.zeros_like(x) for key, x in inputs.x_dict.items()}
        baseline = model(dataclasses.replace(without_edges(inputs), x_dict=zeros))[0, target]
    attribution = typed_integrated_gradients(
        model, typed, mode="multiclass_classification", target=target, steps=200, budget_s=60
    )
    total = float(attribution.node_mask.sum() + attribution.edge_mask.sum())
    assert total == pytest.approx(float(logits[target] - baseline), abs=2e-2)


@pytest.mark.parametrize("name", MODELS)
def test_each_relations_mask_falls_on_that_relations_messages(
    store: GraphStore, busiest_user: str, name: str
) -> None:
    """With every mask 0 each model answers as on the graph without edges; with one
    relation's mask 1 and the others' 0, the models that aggregate each relation apart
    (not hgt's attention over all relations, nor gcn's degrees over all) answer as on that
    relation's edges alone."""
    model = model_of(store, name)
    served, _ = engines(store, model, [4, 3])
    inputs = seed_input(store, served, busiest_user).inputs()
    apart = name not in ("hgt", "gcn")
    for kept in [None, *(inputs.edge_index_dict if apart else [])]:
        masks = {
            key: torch.full((e.size(1),), float(key == kept))
            for key, e in inputs.edge_index_dict.items()
        }
        with torch.no_grad():
            with relation_masks(model, masks, inputs.edge_index_dict):
                masked = model(inputs)
            alone = model(without_edges(inputs, kept))
        assert torch.allclose(masked, alone, atol=1e-6), kept


def test_explanations_are_deterministic(store: GraphStore) -> None:
    _, explainer = engines(store, node_recipe(store, "hgt"), [4, 3])
    first, second = answers(explainer, [{"node_id": "u7"}, {"node_id": "u7"}])
    for _, body in (first, second):
        body["explanation"].pop("seconds")
    assert first == second and first[0] == 200


@pytest.mark.parametrize(
    ("payload", "status", "says"),
    [
        ({"node_ids": ["u1", "u2"]}, 400, "explain one node per request"),
        ({"node_id": "u1", "x": 1}, 400, "unknown field"),
        ({"node_id": "u99999"}, 404, "u99999"),
        ({"node_id": 3, "node_type": "merchant"}, 400, "answers for 'user' nodes"),
        ({"node_id": "u1", "node_type": "card"}, 400, "'card'"),
        (b"{broken", 400, ""),
    ],
)
def test_bad_explanation_requests_are_refused(
    store: GraphStore, payload: Any, status: int, says: str
) -> None:
    _, explainer = engines(store, node_recipe(store, "rgcn"), [2, 2])
    [(code, body)] = answers(explainer, [payload])
    assert code == status and says in body["message"], body


class _OneRelationLayer(torch.nn.Module):
    """Merchants' messages to users from a layer outside any per-relation container."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = SAGEConv((4, 8), 2)

    def forward(self, x_dict: dict, edge_index_dict: dict) -> dict:
        edges = edge_index_dict[("merchant", "rev_pays", "user")]
        return {"user": self.conv((x_dict["merchant"], x_dict["user"]), edges)}


def test_a_model_whose_layers_hide_the_relations_is_refused(
    store: GraphStore, busiest_user: str
) -> None:
    torch.manual_seed(0)
    model = UserHeteroModel(_OneRelationLayer(), "user").eval()
    _, explainer = engines(store, model, [-1])
    [(status, body)] = answers(explainer, [{"node_id": busiest_user}])
    assert status == 400 and "cannot be explained" in body["message"], body
