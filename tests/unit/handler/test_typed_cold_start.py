"""Cold-start nodes on graphs of several node types: with full neighbourhoods the answer (and
embedding) equals the model's full-graph forward on the graph with the node and the edges its
neighbours bring added, for every recipe and a user's HeteroConv, every relation and direction
the request allows, after typed live updates too; bad requests are 400 (404 for a missing
neighbour)."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
import torch

from graph_assets import GraphStore, open_store, write_store
from graph_assets.input.synthetic_typed import fraud_graph
from graph_assets.schema import EdgeType, GraphSchema, NodeType, Relation
from graph_assets.tables import RawRelation
from handler.live.live_graph import LiveGraph, UpdateRequest
from handler.protocol.errors import BadRequest
from handler.settings import ServingSettings
from handler.tasks.node.engine import NodeClassificationEngine
from handler.tasks.node.requests import parse_node_extra
from handler.tasks.node.task import node_router
from model.precompute import open_precomputed, precompute
from model.served_hetero import HeteroNodeModel, UserHeteroModel
from model.typed_batch import HeteroInput
from model.typed_graph import whole_graph_input
from tests.typed_cold_start_reference import with_new_node
from tests.typed_graphs import fraud_store, node_recipe, with_reverses
from tests.typed_live_reference import live_nodes, materialized_typed, random_typed_update
from tests.unit.archive_build import user_models

ARCHS = ["sage", "gat", "gcn", "gin", "rgcn", "hgt"]
DEVICES = 40
PAYS, REV_PAYS = ("user", "pays", "merchant"), ("merchant", "rev_pays", "user")
USES, REV_USES = ("user", "uses", "device"), ("device", "rev_uses", "user")
REFERS, FLAGS = ("user", "refers", "user"), ("merchant", "flags", "user")
# An edge the new node gets: (relation, neighbour ID, into the new node, edge features).
Edge = tuple[tuple[str, str, str], object, bool, list[float] | None]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> GraphStore:
    return fraud_store(tmp_path_factory.mktemp("cold") / "store", 100, 20, DEVICES, 400, 3)


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> GraphStore:
    """The fraud graph with reverses plus a relation within users (user__refers__user), one
    into users without a reverse (merchant__flags__user, with a score) and one without users
    (device__near__merchant)."""
    rng = np.random.default_rng(5)
    graph = with_reverses(fraud_graph(60, 12, 20, 200, seed=4))

    def relation(triple: tuple[str, str, str], src: int, dst: int, width: int) -> RawRelation:
        count = 60
        features = rng.random((count, width)).astype(np.float32)
        return RawRelation(
            EdgeType(*triple),
            rng.integers(0, src, count),
            rng.integers(0, dst, count),
            features,
            [f"score{i}" for i in range(width)],
        )

    extra = (
        relation(REFERS, 60, 60, 0),
        relation(FLAGS, 12, 60, 1),
        relation(("device", "near", "merchant"), 20, 12, 0),
    )
    path = tmp_path_factory.mktemp("cold_wide") / "store"
    write_store(dataclasses.replace(graph, relations=graph.relations + extra), path)
    return open_store(path)


def hetero_conv(store: GraphStore) -> UserHeteroModel:
    """The user's HeteroConv stack (GATConv on payments reading their amounts, SAGEConv on
    device use, learned device embeddings), seeded, edge-feature maps scaled down."""
    torch.manual_seed(0)
    module = user_models.FraudHeteroConv(devices=DEVICES, hidden=8, classes=2, edge_dim=2)
    with torch.no_grad():
        for sub in module.modules():
            if isinstance(getattr(sub, "lin_edge", None), torch.nn.Module):
                sub.lin_edge.weight.mul_(1e-3)
    return UserHeteroModel(module, store.schema.target, embedding="head", hops=2).eval()


def router(store: GraphStore, model: torch.nn.Module, fanouts=(-1, -1), live=None, **extra):
    settings = ServingSettings.from_yaml_section({"fanouts": list(fanouts), **extra})
    engine = NodeClassificationEngine.create(
        store, model, settings, torch.device("cpu"), "1.0", live
    )
    return node_router(engine, "1.0")


def ask(served, *bodies: dict) -> list[tuple[int, dict]]:
    return [(r.status, r.body) for r in served.handle([{"body": body} for body in bodies])]


def stored_positions(store: GraphStore):
    """An edge's neighbour position within its type in the stored graph."""

    def position(triple: tuple[str, str, str], node_id: object, into: bool) -> int:
        node_type = triple[0] if into else triple[2]
        [index] = store.lookup([node_id], node_type=node_type)
        return int(index) - store.schema.node_type(node_type).offset

    return position


def expected(model: torch.nn.Module, inputs: HeteroInput, schema, x, edges, position):
    """(probabilities, embedding) of the new node on ``inputs`` with it and ``edges`` added."""
    located = [(t, position(t, node_id, into), into, attr) for t, node_id, into, attr in edges]
    augmented, new = with_new_node(inputs, schema, x, located)
    assert isinstance(model, HeteroNodeModel)
    with torch.no_grad():
        out, embedding = model.forward_with_embedding(augmented)
    return torch.softmax(out[new], -1), embedding[new]


def check(body: dict, probabilities: torch.Tensor, embedding: torch.Tensor) -> None:
    assert float((torch.tensor(body["probabilities"]) - probabilities).abs().max()) <= 1e-5
    assert float((torch.tensor(body["embedding"]) - embedding).abs().max()) <= 1e-5


def hub(store: GraphStore, node_type: str) -> object:
    """The ID of the node of ``node_type`` with the most in-edges (GCN's degrees move most)."""
    kind = store.schema.node_type(node_type)
    degrees = np.diff(np.asarray(store.indptr))[kind.offset : kind.stop]
    return store.external_ids(np.array([kind.offset + int(degrees.argmax())]))[0]


def payment_request(store: GraphStore) -> tuple[dict, list[Edge], list[float]]:
    """A new user paying three merchants (a hub among them) and using two devices, direction
    both: its edges, each with its reverse."""
    x = np.random.default_rng(7).normal(size=8).round(3).tolist()
    merchants = [hub(store, "merchant"), 1003, 1011]
    amounts = [[120.0, 3.0], [15.5, 22.0], [60.0, 9.0]]
    devices = [hub(store, "device"), "d7"]
    body = {
        "new_node": {
            "node_type": "user",
            "x": x,
            "neighbors": {"user__pays__merchant": merchants, "user__uses__device": devices},
            "edge_attr": {"user__pays__merchant": amounts},
        },
        "return_embedding": True,
    }
    edges: list[Edge] = []
    for merchant, amount in zip(merchants, amounts, strict=True):
        edges += [(PAYS, merchant, False, amount), (REV_PAYS, merchant, True, amount)]
    for device in devices:
        edges += [(USES, device, False, None), (REV_USES, device, True, None)]
    return body, edges, x


@pytest.mark.parametrize("arch", [*ARCHS, "heteroconv"])
def test_a_new_user_equals_the_full_graph_forward_with_it_added(store, arch):
    model = hetero_conv(store) if arch == "heteroconv" else node_recipe(store, arch)
    body, edges, x = payment_request(store)
    [(status, answer)] = ask(router(store, model), body)
    assert status == 200, answer
    assert answer["new_node"] == {"neighbors": 5} and answer["node_type"] == "user"
    inputs = whole_graph_input(store)
    check(answer, *expected(model, inputs, store.schema, x, edges, stored_positions(store)))


BOTH_PAYS = [(PAYS, False), (REV_PAYS, True)]


@pytest.mark.parametrize(
    ("relation", "direction", "brought"),
    [
        ("user__pays__merchant", "in", [(REV_PAYS, True)]),
        ("user__pays__merchant", "out", [(PAYS, False)]),
        ("user__pays__merchant", "both", BOTH_PAYS),
        ("merchant__rev_pays__user", "in", [(REV_PAYS, True)]),
        ("merchant__rev_pays__user", "out", [(PAYS, False)]),
        ("merchant__rev_pays__user", "both", BOTH_PAYS),
        ("user__refers__user", "in", [(REFERS, True)]),
        ("user__refers__user", "out", [(REFERS, False)]),
        ("user__refers__user", "both", [(REFERS, True), (REFERS, False)]),
        ("merchant__flags__user", "in", [(FLAGS, True)]),
        ("merchant__flags__user", "both", [(FLAGS, True)]),
    ],
)
@pytest.mark.parametrize("arch", ["sage", "gcn", "gat"])
def test_each_relation_and_direction_adds_the_edges_it_brings(
    wide, arch, relation, direction, brought
):
    """A relation brings its own edge and, where the graph has it, its reverse's; direction
    keeps those into the new node, out of it, or both. gcn: degrees; gat: edge features."""
    model = node_recipe(wide, arch)
    other = relation.split("__")[0] if relation.endswith("__user") else relation.split("__")[2]
    most = hub(wide, other)
    ids = [most, *[n for n in {"merchant": [1004, 1005], "user": ["u3", "u4"]}[other] if n != most]]
    width = wide.schema.relations[wide.schema.relation_index(relation)].edge_feature_dim
    rows = [[float(i + 1) * 0.5 + j for j in range(width)] for i in range(len(ids))]
    x = [0.3, -0.2, 0.1, 0.0, 0.5, -0.4, 0.2, 0.7]
    new_node = {"x": x, "neighbors": {relation: ids}, "direction": direction}
    if width:
        new_node["edge_attr"] = {relation: rows}
    [(status, answer)] = ask(router(wide, model), {"new_node": new_node, "return_embedding": True})
    assert status == 200, answer
    edges = [(t, i, into, row) for t, into in brought for i, row in zip(ids, rows, strict=True)]
    inputs = whole_graph_input(wide)
    check(answer, *expected(model, inputs, wide.schema, x, edges, stored_positions(wide)))


def test_every_relation_of_users_at_once(wide):
    model = node_recipe(wide, "rgcn")
    x = [0.1] * 8
    neighbors = {
        "user__pays__merchant": [1001],
        "merchant__flags__user": [1002],
        "user__refers__user": ["u9"],
        "device__rev_uses__user": ["d2"],
    }
    edge_attr = {"user__pays__merchant": [[30.0, 8.0]], "merchant__flags__user": [[0.9]]}
    body = {"new_node": {"x": x, "neighbors": neighbors, "edge_attr": edge_attr}}
    [(status, answer)] = ask(router(wide, model), {**body, "return_embedding": True})
    assert status == 200 and answer["new_node"] == {"neighbors": 4}, answer
    edges: list[Edge] = [
        (PAYS, 1001, False, [30.0, 8.0]),
        (REV_PAYS, 1001, True, [30.0, 8.0]),
        (FLAGS, 1002, True, [0.9]),
        (REFERS, "u9", True, None),
        (REFERS, "u9", False, None),
        (REV_USES, "d2", True, None),
        (USES, "d2", False, None),
    ]
    inputs = whole_graph_input(wide)
    check(answer, *expected(model, inputs, wide.schema, x, edges, stored_positions(wide)))


@pytest.mark.parametrize("arch", ["sage", "gcn"])
def test_a_new_user_after_typed_live_updates(store, tmp_path, arch):
    """A stream of typed updates (nodes of each featured type, edges of every relation), then
    a new user paying a merchant an update added: exact on the updated graph."""
    model = node_recipe(store, arch)
    live = LiveGraph(store, tmp_path / "updates.log")
    served = router(store, model, live=live)
    rng, counter = random.Random(3), [0]
    for _ in range(25):
        live.update(UpdateRequest(random_typed_update(rng, live, counter)))
    added = {"type": "add_node", "id": 7777, "x": [1.0, 0.0, 0.5, 0.2], "node_type": "merchant"}
    paid = {"type": "add_edge", "src": "u4", "dst": 7777, "edge_type": "user__pays__merchant"}
    live.update(UpdateRequest([added, {**paid, "attr": [80.0, 12.0]}]))
    x = [0.2, -0.1, 0.4, 0.0, 0.3, 0.1, -0.5, 0.6]
    neighbors = {"user__pays__merchant": [7777, 1002], "user__uses__device": ["d3"]}
    edge_attr = {"user__pays__merchant": [[10.0, 1.0], [99.0, 23.0]]}
    new_node = {"x": x, "neighbors": neighbors, "edge_attr": edge_attr}
    [(status, answer)] = ask(served, {"new_node": new_node, "return_embedding": True})
    assert status == 200 and answer["graph_version"] == live.version, answer
    _, inputs = materialized_typed(live)
    schema = store.schema

    def position(triple: tuple[str, str, str], node_id: object, into: bool) -> int:
        node_type = triple[0] if into else triple[2]
        [index] = live.overlay.lookup([node_id], node_type=node_type)
        nodes = live_nodes(live, schema.type_index(node_type)).tolist()
        return nodes.index(int(index))

    edges: list[Edge] = []
    for merchant, row in zip([7777, 1002], edge_attr["user__pays__merchant"], strict=True):
        edges += [(PAYS, merchant, False, row), (REV_PAYS, merchant, True, row)]
    edges += [(USES, "d3", False, None), (REV_USES, "d3", True, None)]
    check(answer, *expected(model, inputs, schema, x, edges, position))


def test_sampled_cold_start_is_deterministic_with_per_relation_fanouts(store):
    fanouts = {"relation_fanouts": {"merchant__rev_pays__user": [2, 1]}}
    served = router(store, node_recipe(store, "gcn"), fanouts=(3, 2), **fanouts)
    body, _, _ = payment_request(store)
    alone = ask(served, body)
    again = ask(served, {"node_id": "u1"}, body, body)
    assert alone[0][0] == 200 and alone[0] == again[1] == again[2]


X = [0.0] * 8


@pytest.mark.parametrize(
    ("new_node", "status", "words"),
    [
        ({"neighbors": {"user__buys__item": [1]}}, 400, "is not a relation of this graph"),
        ({"neighbors": {"device__near__merchant": [1]}}, 400, "has no user nodes at either end"),
        ({"neighbors": ["u1"]}, 400, "several relations; send an object"),
        (
            {
                "neighbors": {"user__pays__merchant": [1001, 99999]},
                "edge_attr": {"user__pays__merchant": [[1.0, 2.0], [3.0, 4.0]]},
            },
            404,
            "merchant node(s) not in the graph: 99999",
        ),
        ({"neighbors": {"user__uses__device": ["d_x"]}}, 404, "device node(s) not in the graph"),
        ({"neighbors": {"user__refers__user": ["u1", "u_x"]}}, 404, "user node(s) not in"),
        ({"node_type": "device"}, 400, "answers for 'user' nodes"),
        ({"x": [0.0] * 4}, 400, "must hold 8 features"),
        (
            {"neighbors": {"user__pays__merchant": [1001]}},
            400,
            "reads edge features: send new_node.edge_attr.user__pays__merchant",
        ),
        (
            {
                "neighbors": {"merchant__flags__user": [1001]},
                "edge_attr": {"merchant__flags__user": [[0.5]]},
                "direction": "out",
            },
            400,
            "with direction 'out' it brings no edge",
        ),
        (
            {
                "neighbors": {"user__uses__device": ["d1"], "device__rev_uses__user": ["d1"]},
                "direction": "in",
            },
            400,
            "bring the same edges",
        ),
        (
            {
                "neighbors": {"user__uses__device": ["d1"]},
                "edge_attr": {"user__uses__device": [[1.0]]},
            },
            400,
            "user__uses__device has no edge features",
        ),
        (
            {
                "neighbors": {"user__pays__merchant": [1001]},
                "edge_attr": {"user__pays__merchant": [[1.0]]},
            },
            400,
            "edge_attr.user__pays__merchant[0] must hold 2 features",
        ),
        (
            {"neighbors": {"user__pays__merchant": [1001]}, "edge_attr": [[1.0, 2.0]]},
            400,
            "takes the form of new_node.neighbors",
        ),
    ],
)
def test_bad_typed_cold_start_requests(wide, new_node, status, words):
    served = router(wide, node_recipe(wide, "gat"))
    good, (code, answer) = ask(served, {"node_id": "u1"}, {"new_node": {"x": X, **new_node}})
    assert good[0] == 200
    assert code == status and words in answer["message"], answer


def test_a_new_node_of_a_featureless_type_is_refused() -> None:
    schema = GraphSchema(
        node_types=(NodeType("account", 3, 0, 0, "int"), NodeType("shop", 2, 3, 2, "int")),
        relations=(Relation(EdgeType("account", "buys", "shop"), 4, ()),),
        target="account",
    )
    body = {"body": {"new_node": {"x": [], "neighbors": [3]}}}
    with pytest.raises(BadRequest, match="account nodes have no features"):
        parse_node_extra(body, schema, 8)


@pytest.mark.parametrize("arch", ["sage", "gcn", "heteroconv"])
def test_a_new_user_on_a_precomputed_archive_equals_the_forward_with_it_added(
    store, tmp_path, arch
):
    """A precomputed archive stores outputs, sampled fanouts notwithstanding: a new node's
    answer is the forward on its whole in-neighbourhood, so it is exact with fanouts [1, 1]."""
    model = hetero_conv(store) if arch == "heteroconv" else node_recipe(store, arch)
    precompute(model, store, tmp_path / "rows", "weights", progress=False)
    settings = ServingSettings.from_yaml_section({"fanouts": [1, 1]})
    engine = NodeClassificationEngine.create(
        store,
        model,
        settings,
        torch.device("cpu"),
        "1.0",
        precomputed=open_precomputed(tmp_path / "rows", store, "weights"),
    )
    body, edges, x = payment_request(store)
    [(status, answer)] = ask(node_router(engine, "1.0"), body)
    assert status == 200, answer
    inputs = whole_graph_input(store)
    check(answer, *expected(model, inputs, store.schema, x, edges, stored_positions(store)))


def test_a_user_model_without_an_embedding_scores_a_new_node_with_its_forward(store):
    """A user's typed model built without --embedding-method: the new node's answer is the
    forward on its ego-graph (no embedding needed); asking for the embedding is a 400."""
    torch.manual_seed(0)
    module = user_models.FraudToHetero(
        devices=DEVICES,
        hidden=8,
        classes=2,
        metadata=[
            list(store.schema.node_type_names),
            [list(r.edge_type.triple) for r in store.schema.relations],
        ],
    )
    model = UserHeteroModel(module, store.schema.target, hops=2).eval()
    assert not model.has_embedding
    body, edges, x = payment_request(store)
    del body["return_embedding"]
    served = router(store, model)
    [(status, answer)] = ask(served, body)
    assert status == 200, answer
    assert "embedding" not in answer and answer["new_node"] == {"neighbors": 5}
    located = [
        (t, stored_positions(store)(t, node_id, into), into, attr)
        for t, node_id, into, attr in edges
    ]
    augmented, new = with_new_node(whole_graph_input(store), store.schema, x, located)
    with torch.no_grad():
        probabilities = torch.softmax(model(augmented)[new], -1)
    assert float((torch.tensor(answer["probabilities"]) - probabilities).abs().max()) <= 1e-5
    [(status, refused)] = ask(served, {**body, "return_embedding": True})
    assert status == 400 and "--embedding-method" in refused["message"], refused
    [(status, again)] = ask(served, body)
    assert status == 200 and again["probabilities"] == answer["probabilities"]
