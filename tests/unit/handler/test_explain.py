"""Explanations: Integrated Gradients on the ego-graph, deterministic, bounded by the budget,
on a graph of one node type and of several. On several, every recipe and a user's HeteroConv
model explain the answer the node engine serves, naming node types, relations and IDs the
store has; attributions add up, with each relation's mask on its own messages."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch
from torch_geometric.nn import SAGEConv

from graph_assets import GraphStore
from handler.explain.ego_explain import ExplainEngine, integrated_gradients, summarize
from handler.explain.typed_explain import relation_masks, typed_integrated_gradients
from handler.settings import ServingSettings
from handler.tasks.graph.explain import GraphExplanation
from handler.tasks.link.explain import PairExplanation
from handler.tasks.node.engine import NodeClassificationEngine
from handler.tasks.node.explain import NodeExplanation
from handler.tasks.node.task import node_router
from model.served_hetero import UserHeteroModel
from model.typed_batch import HeteroInput
from model.typed_rows import TypedSubgraph, gather_typed
from tests.typed_graphs import fraud_store, hetero_conv_model, node_recipe

from .conftest import graph_engine, graph_requests, link_engine, make_engine, random_model

ONE_TYPE, TYPED = "one-type", "typed"
ARCHS = ["sage", "gat", "gcn", "gin", "rgcn", "hgt"]
MODELS = [*ARCHS, "heteroconv"]


@pytest.fixture(scope="module")
def typed_store(tmp_path_factory: pytest.TempPathFactory) -> GraphStore:
    return fraud_store(tmp_path_factory.mktemp("typed_explain") / "store", 120, 20, 50, 400, 3)


@pytest.fixture
def schema_store(request: pytest.FixtureRequest, int_store, typed_store) -> GraphStore:
    """The graph of one node type or of several (``request.param``)."""
    return int_store if request.param == ONE_TYPE else typed_store


def seeded_model(store: GraphStore, arch: str) -> torch.nn.Module:
    """A seeded random model of ``arch`` on one node type, the recipe of ``arch`` on several."""
    return random_model(store, arch) if store.schema.is_homogeneous else node_recipe(store, arch)


def node_explainer(store, arch="gcn", model=None, **settings) -> ExplainEngine:
    settings.setdefault("explain_time_budget_ms", 60_000)  # steps not cut on a busy machine
    model = model if model is not None else random_model(store, arch)
    engine = make_engine(store, arch, model=model, **settings)
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


@pytest.mark.parametrize(
    ("schema_store", "arch", "node"),
    [(ONE_TYPE, "gcn", 3), (TYPED, "hgt", "u7")],
    indirect=["schema_store"],
)
def test_explanations_are_deterministic(schema_store: GraphStore, arch: str, node: Any) -> None:
    model = seeded_model(schema_store, arch)
    engine = node_explainer(schema_store, arch, model=model, fanouts=[4, 3])
    first, second = answers(engine, [{"node_id": node}, {"node_id": node}])
    for _, body in (first, second):
        body["explanation"].pop("seconds")
    assert first == second and first[0] == 200


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


# schema, payload, status, what the message says; one type: gcn with full fanouts, several:
# rgcn with fanouts of 2
BAD_EXPLANATIONS = [
    (ONE_TYPE, {"node_ids": [0, 3]}, 400, "explain one node per request"),
    (ONE_TYPE, {"node_id": 1}, 404, "1"),
    (ONE_TYPE, {"node_id": 0, "x": 1}, 400, "unknown field"),
    (TYPED, {"node_ids": ["u1", "u2"]}, 400, "explain one node per request"),
    (TYPED, {"node_id": "u1", "x": 1}, 400, "unknown field"),
    (TYPED, {"node_id": "u99999"}, 404, "u99999"),
    (TYPED, {"node_id": 3, "node_type": "merchant"}, 400, "answers for 'user' nodes"),
    (TYPED, {"node_id": "u1", "node_type": "card"}, 400, "'card'"),
    (TYPED, b"{broken", 400, ""),
]


@pytest.mark.parametrize(
    ("schema_store", "payload", "status", "says"), BAD_EXPLANATIONS, indirect=["schema_store"]
)
def test_bad_explanation_requests_are_refused(
    schema_store: GraphStore, payload: Any, status: int, says: str
) -> None:
    if schema_store.schema.is_homogeneous:
        engine = node_explainer(schema_store)
    else:
        model = node_recipe(schema_store, "rgcn")
        engine = node_explainer(schema_store, "rgcn", model=model, fanouts=[2, 2])
    [(code, body)] = answers(engine, [payload])
    assert code == status and says in body["message"], body


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


# Several node types only: the names an explanation gives, relation masks, refusals.


@pytest.fixture(scope="module")
def busiest_user(typed_store: GraphStore) -> str:
    """The user with the most in-edges (payments back from merchants and devices)."""
    users = typed_store.schema.target_type.num_nodes
    return typed_store.external_ids(np.array([int(np.argmax(typed_store.in_degree[:users]))]))[0]


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
    typed_store: GraphStore, busiest_user: str, name: str
) -> None:
    served, explainer = engines(typed_store, model_of(typed_store, name), [-1, -1])
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
        assert typed_store.lookup([node["node_id"]], node["node_type"])[0] >= 0, node
    assert all(stored_edge(typed_store, edge) for edge in edges)
    assert {edge["edge_type"] for edge in edges} <= set(typed_store.schema.edge_type_names)
    widths = {t.name: t.feature_dim for t in typed_store.schema.node_types}
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
    typed_store: GraphStore, busiest_user: str, name: str
) -> None:
    """IG's completeness from the baseline of no features and every edge masked, which is
    the graph without edges only when every relation's mask reaches all its messages."""
    model = model_of(typed_store, name)
    served, _ = engines(typed_store, model, [4, 3])
    typed = seed_input(typed_store, served, busiest_user)
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
    typed_store: GraphStore, busiest_user: str, name: str
) -> None:
    """With every mask 0 each model answers as on the graph without edges; with one
    relation's mask 1 and the others' 0, the models that aggregate each relation apart
    (not hgt's attention over all relations, nor gcn's degrees over all) answer as on that
    relation's edges alone."""
    model = model_of(typed_store, name)
    served, _ = engines(typed_store, model, [4, 3])
    inputs = seed_input(typed_store, served, busiest_user).inputs()
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


class _OneRelationLayer(torch.nn.Module):
    """Merchants' messages to users from a layer outside any per-relation container."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = SAGEConv((4, 8), 2)

    def forward(self, x_dict: dict, edge_index_dict: dict) -> dict:
        edges = edge_index_dict[("merchant", "rev_pays", "user")]
        return {"user": self.conv((x_dict["merchant"], x_dict["user"]), edges)}


def test_a_model_whose_layers_hide_the_relations_is_refused(
    typed_store: GraphStore, busiest_user: str
) -> None:
    torch.manual_seed(0)
    model = UserHeteroModel(_OneRelationLayer(), "user").eval()
    _, explainer = engines(typed_store, model, [-1])
    [(status, body)] = answers(explainer, [{"node_id": busiest_user}])
    assert status == 400 and "cannot be explained" in body["message"], body
