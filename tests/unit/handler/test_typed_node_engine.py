"""The node engine on a graph of several node types: every recipe's served answers equal its
full-graph forward with full neighbourhoods (gcn through its boundary rows), answers carry the
node type, and a request for a type the archive does not answer is a 400 naming the types."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from graph_assets import GraphStore
from handler.settings import ServingSettings
from handler.tasks.node.engine import NodeClassificationEngine
from handler.tasks.node.task import node_router
from model.typed_graph import whole_graph_input
from tests.typed_graphs import fraud_store, node_recipe

ARCHS = ["sage", "gat", "gcn", "gin", "rgcn", "hgt"]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> GraphStore:
    return fraud_store(tmp_path_factory.mktemp("typed_engine") / "store", 120, 20, 50, 400, 3)


def recipe(store: GraphStore, arch: str) -> torch.nn.Module:
    return node_recipe(store, arch)


def engine(
    store: GraphStore, model: torch.nn.Module, fanouts: list[int]
) -> NodeClassificationEngine:
    settings = ServingSettings.from_yaml_section({"fanouts": fanouts})
    return NodeClassificationEngine.create(store, model, settings, torch.device("cpu"), "1.0")


def answers(served: NodeClassificationEngine, bodies: list[dict]) -> list[tuple[int, dict]]:
    return [(r.status, r.body) for r in served.handle([{"body": b} for b in bodies])]


@pytest.mark.parametrize("arch", ARCHS)
def test_served_answers_equal_the_full_graph_forward(store: GraphStore, arch: str) -> None:
    model = recipe(store, arch)
    with torch.no_grad():
        expected = torch.softmax(model(whole_graph_input(store)), dim=-1)
    served = engine(store, model, [-1, -1])
    users = store.schema.target_type.num_nodes
    ids = store.external_ids(torch.arange(users).numpy())
    bodies = [{"node_ids": ids[start : start + 16]} for start in range(0, users, 16)]
    rows = []
    for status, body in answers(served, bodies):
        assert status == 200, body
        assert all(p["node_type"] == "user" for p in body["predictions"])
        rows += [p["probabilities"] for p in body["predictions"]]
    assert float((torch.tensor(rows) - expected).abs().max()) <= 1e-5


def test_sampled_answers_are_deterministic_and_batch_independent(store: GraphStore) -> None:
    """The same ego-graph whatever the batch; the sums over it may round in another order
    (<= 1e-6)."""
    served = engine(store, recipe(store, "sage"), [2, 2])
    ids = store.external_ids(torch.arange(10).numpy())
    alone = answers(served, [{"node_id": ids[3]}])[0]
    again = answers(served, [{"node_id": ids[3]}])[0]
    together = answers(served, [{"node_ids": ids}, {"node_id": ids[3], "node_type": "user"}])
    assert alone == again
    for status, body in (together[1], (200, together[0][1]["predictions"][3])):
        assert status == 200 and body["predicted_class"] == alone[1]["predicted_class"]
        difference = torch.tensor(body["probabilities"]) - torch.tensor(alone[1]["probabilities"])
        assert float(difference.abs().max()) <= 1e-6


def test_a_type_the_archive_does_not_answer_is_refused(store: GraphStore) -> None:
    served = engine(store, recipe(store, "rgcn"), [2, 2])
    [(status, body), (fine, _)] = answers(
        served, [{"node_id": 1000, "node_type": "merchant"}, {"node_id": "u1"}]
    )
    assert status == 400 and "answers for 'user' nodes" in body["message"]
    assert "merchant" in body["message"] and "device" in body["message"] and fine == 200
    [(status, body)] = answers(served, [{"node_id": "u1", "node_type": "card"}])
    assert status == 400 and "'card'" in body["message"]


def test_per_relation_fanouts_reach_the_model(store: GraphStore, tmp_path: Path) -> None:
    """Full fanouts on every relation but one: answers differ from full neighbourhoods only
    through that relation."""
    model = recipe(store, "sage")
    settings = ServingSettings.from_yaml_section(
        {"fanouts": [-1, -1], "relation_fanouts": {"merchant__rev_pays__user": [1, 1]}}
    )
    limited = NodeClassificationEngine.create(store, model, settings, torch.device("cpu"), "1.0")
    full = engine(store, model, [-1, -1])
    ids = store.external_ids(torch.arange(store.schema.target_type.num_nodes).numpy())
    [(_, some)] = answers(limited, [{"node_ids": ids}])
    [(_, every)] = answers(full, [{"node_ids": ids}])
    differ = [
        a["node_id"]
        for a, b in zip(some["predictions"], every["predictions"], strict=True)
        if a["probabilities"] != b["probabilities"]
    ]
    assert differ, "a fanout of 1 on rev_pays changed no answer"


def test_embeddings_come_from_the_typed_forward_and_the_rest_is_refused(store: GraphStore) -> None:
    model = recipe(store, "hgt")
    served = engine(store, model, [-1, -1])
    router = node_router(served, "1.0")
    with torch.no_grad():
        expected, embedding = model.forward_with_embedding(whole_graph_input(store))
    body = {"node_ids": ["u3", "u7"], "node_type": "user", "return_embedding": True}
    [answer] = router.handle([{"body": body}])
    assert answer.status == 200, answer.body
    got = answer.body["predictions"]
    rows = store.lookup(["u3", "u7"])
    assert got[0]["node_type"] == "user"
    assert torch.allclose(torch.tensor([p["embedding"] for p in got]), embedding[rows], atol=1e-5)
    probabilities = torch.softmax(expected[rows], dim=-1)
    assert torch.allclose(torch.tensor([p["probabilities"] for p in got]), probabilities, atol=1e-5)
    new_node = {"new_node": {"x": [0.0] * store.feature_dim, "neighbors": ["u1"]}}
    [cold] = router.handle([{"body": new_node}])
    assert cold.status == 400 and "several relations" in cold.body["message"]  # by relation
    [explained] = router.handle([{"body": {"node_id": "u1"}}], explain=[True])
    assert explained.status == 200 and explained.body["node_type"] == "user"


def test_kserve_v2_requests_name_the_type_as_a_parameter_and_answers_name_it_as_an_output(
    store: GraphStore,
) -> None:
    served = engine(store, recipe(store, "sage"), [2, 2])

    def v2(request_parameters: dict, tensor_parameters: dict) -> dict:
        tensor = {"name": "node_ids", "shape": [2], "datatype": "BYTES", "data": ["u1", "u2"]}
        return {
            "inputs": [{**tensor, "parameters": tensor_parameters}],
            "parameters": request_parameters,
        }

    [(status, body), (tensor_level, _), (grpc, _)] = answers(
        served,
        [
            v2({"node_type": "user"}, {}),
            v2({}, {"node_type": "user"}),
            v2({"node_type": {"string_param": "user"}}, {}),
        ],
    )
    assert (status, tensor_level, grpc) == (200, 200, 200), body
    outputs = {tensor["name"]: tensor for tensor in body["outputs"]}
    assert outputs["node_id"]["data"] == ["u1", "u2"]
    assert outputs["node_type"] == {
        "name": "node_type",
        "datatype": "BYTES",
        "shape": [2],
        "data": ["user", "user"],
    }
    [(wrong, message), (twice, conflict)] = answers(
        served, [v2({"node_type": "merchant"}, {}), v2({"node_type": "user"}, {"node_type": "x"})]
    )
    assert wrong == 400 and "answers for 'user' nodes" in message["message"]
    assert twice == 400 and "different values" in conflict["message"]
