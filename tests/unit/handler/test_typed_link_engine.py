"""Link prediction on one relation of a graph of several node types: every recipe's and a
user model's pair scores and top-k equal decode(encode(whole typed graph)) with full
neighbourhoods, top-k searches the destination type and leaves out the source's neighbours on
that relation only (both directions), and an ID of the wrong type is a 404 naming it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from graph_assets import GraphStore, open_store, write_store
from graph_assets.input.synthetic_typed import fraud_graph
from graph_assets.schema import EdgeType
from graph_assets.tables import RawRelation
from handler.graph.ego import EgoGraphs
from handler.settings import ServingSettings
from handler.tasks.link.engine import LinkEngine
from handler.tasks.link.explain import PairExplanation
from model import ModelConfig, build_model
from model.hetero_link import HeteroLinkModel
from model.link_assets import open_link_assets, write_link_assets
from model.served_hetero_link import UserHeteroLinkModel
from model.typed_graph import hetero_section, whole_graph_input
from tests.typed_graphs import with_reverses
from tests.unit.archive_build import user_models

# Each recipe with one of the two decoders.
RECIPES = [("sage", "dot"), ("gat", "mlp"), ("gcn", "dot"), ("gin", "mlp"), ("rgcn", "mlp"),
           ("hgt", "dot")]  # fmt: skip
PAYS = ("user", "pays", "merchant")
FOLLOWS = ("user", "follows", "user")
USERS, MERCHANTS, DEVICES = 80, 15, 30


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> GraphStore:
    """The fraud graph with its reverses and users following users (a relation within one
    type, without a reverse)."""
    graph = with_reverses(fraud_graph(USERS, MERCHANTS, DEVICES, 300, seed=7))
    rng = np.random.default_rng(7)
    follows = RawRelation(
        EdgeType(*FOLLOWS),
        rng.integers(0, USERS, 160),
        rng.integers(0, USERS, 160),
        np.empty((160, 0), np.float32),
        [],
    )
    path = tmp_path_factory.mktemp("typed_link") / "store"
    write_store(dataclasses.replace(graph, relations=(*graph.relations, follows)), path)
    return open_store(path)


def recipe(store: GraphStore, arch: str, decoder: str, relation: tuple = PAYS) -> HeteroLinkModel:
    torch.manual_seed(0)
    config = ModelConfig(
        task="link",
        arch=arch,
        decoder=decoder,
        in_dim=store.feature_dim,
        out_dim=8,
        hidden_dim=16,
        heads=2,
        hetero=hetero_section(store.schema, "__".join(relation)),
    )
    model = build_model(config).eval()
    assert isinstance(model, HeteroLinkModel)
    return model


def user_model() -> UserHeteroLinkModel:
    torch.manual_seed(0)
    module = user_models.FraudPaysLink(devices=DEVICES, hidden=8, edge_dim=2)
    with torch.no_grad():  # payments' amounts are ~100: keep the attention from saturating
        for sub in module.modules():
            if isinstance(getattr(sub, "lin_edge", None), torch.nn.Module):
                sub.lin_edge.weight.mul_(1e-3)
    return UserHeteroLinkModel(module.eval(), PAYS)


def engine(store: GraphStore, model: HeteroLinkModel, tmp_path: Path) -> LinkEngine:
    write_link_assets(model, store, tmp_path / "link")
    settings = ServingSettings.from_yaml_section({"fanouts": [-1, -1], "task": "link"})
    ego = EgoGraphs.create(store, model, settings, torch.device("cpu"))
    return LinkEngine(ego, open_link_assets(tmp_path / "link", store), "1.0")


def answers(served: LinkEngine, bodies: list[dict]) -> list[tuple[int, dict]]:
    return [(r.status, r.body) for r in served.handle([{"body": b} for b in bodies])]


def full_scores(model: HeteroLinkModel, store: GraphStore, src: np.ndarray, dst: np.ndarray):
    """decode(encode(whole graph)) of pairs given by index within their types: the user's
    own decode on the whole z_dict, or the recipe's score."""
    with torch.no_grad():
        z = model.encode(whole_graph_input(store))
        if isinstance(model, UserHeteroLinkModel):
            logits = model.module.decode(z, torch.from_numpy(np.stack([src, dst])))
        else:
            logits = model.score(z[model.edge_type[0]][src], z[model.edge_type[2]][dst])
    return torch.sigmoid(logits)


@pytest.mark.parametrize("arch, decoder", [*RECIPES, ("own", "decode")])
def test_pair_scores_and_top_k_equal_the_full_graph_decode(store, tmp_path, arch, decoder):
    model = user_model() if arch == "own" else recipe(store, arch, decoder)
    served = engine(store, model, tmp_path)
    merchant_offset = store.schema.node_type("merchant").offset
    rng = np.random.default_rng(1)
    src, dst = rng.integers(0, USERS, 40), rng.integers(0, MERCHANTS, 40)
    users = store.external_ids(src)
    merchants = store.external_ids(dst + merchant_offset)
    pairs = [[u, m] for u, m in zip(users, merchants, strict=True)]
    bodies = [{"pairs": pairs[i : i + 8]} for i in range(0, 40, 8)]
    bodies.append({"src": "u3", "top_k": MERCHANTS, "exclude_neighbors": False})
    *pair_answers, (status, top) = answers(served, bodies)
    scores = []
    for pair_status, body in pair_answers:
        assert pair_status == 200, body
        scores += [p["score"] for p in body["predictions"]]
    expected = full_scores(model, store, src, dst)
    worst = float((torch.tensor(scores) - expected).abs().max())
    assert worst <= 1e-5, worst
    assert status == 200, top
    found = [r["dst"] for r in top["recommendations"]]
    assert len(found) == MERCHANTS  # every merchant and nothing else
    rows = store.lookup(found, node_type="merchant") - merchant_offset
    [u3] = store.lookup(["u3"], node_type="user")
    every = full_scores(model, store, np.full(MERCHANTS, u3), rows)
    got = torch.tensor([r["score"] for r in top["recommendations"]])
    assert float((got - every).abs().max()) <= 1e-5
    assert torch.equal(got, got.sort(descending=True).values)


def out_neighbours(store: GraphStore, node: int, relation: str) -> set[int]:
    index = store.schema.relation_index(relation)
    dst = np.repeat(np.arange(store.num_nodes), np.diff(store.indptr))
    mine = (np.asarray(store.indices) == node) & (np.asarray(store.edge_type) == index)
    return set(dst[mine].tolist())


def in_neighbours(store: GraphStore, node: int, relation: str) -> set[int]:
    index = store.schema.relation_index(relation)
    start, stop = store.indptr[node], store.indptr[node + 1]
    kinds = np.asarray(store.edge_type[start:stop])
    return set(np.asarray(store.indices[start:stop])[kinds == index].tolist())


def test_top_k_leaves_out_the_neighbours_on_the_relation_only(store, tmp_path):
    """On pays: the merchants the user paid; on follows (one type, no reverse): the users it
    follows, its followers and itself, not users it shares a device or merchant with."""
    [u3] = store.lookup(["u3"], node_type="user")
    paid = out_neighbours(store, u3, "user__pays__merchant")
    assert paid == in_neighbours(store, u3, "merchant__rev_pays__user")
    served = engine(store, recipe(store, "sage", "dot"), tmp_path / "pays")
    [(status, body)] = answers(served, [{"src": "u3", "top_k": MERCHANTS}])
    assert status == 200 and body["exclude_neighbors"] is True
    found = set(store.lookup([r["dst"] for r in body["recommendations"]], node_type="merchant"))
    offset = store.schema.node_type("merchant").offset
    assert paid and found == set(range(offset, offset + MERCHANTS)) - paid

    user = int(np.asarray(store.indices)[np.asarray(store.edge_type) == 4][0])  # follows someone
    linked = out_neighbours(store, user, "user__follows__user") | in_neighbours(
        store, user, "user__follows__user"
    )
    served = engine(store, recipe(store, "rgcn", "dot", FOLLOWS), tmp_path / "follows")
    [user_id] = store.external_ids(np.array([user]))
    [(status, body)] = answers(served, [{"src": user_id, "top_k": USERS}])
    assert status == 200, body
    found = set(store.lookup([r["dst"] for r in body["recommendations"]], node_type="user"))
    assert linked and found == set(range(USERS)) - linked - {user}


def test_an_id_of_the_wrong_type_is_a_404_naming_it(store, tmp_path):
    served = engine(store, recipe(store, "gcn", "dot"), tmp_path)
    replies = answers(
        served,
        [
            {"src": 1000, "dst": "u1"},  # a merchant as source, a user as destination
            {"src": "u1", "top_k": 3},
            {"src": 1000, "top_k": 3},
            {"pairs": [["u1", 1001], ["u2", "d4"]]},
        ],
    )
    (swapped, body), (fine, _), (merchant_src, top), (device, pairs) = replies
    assert swapped == 404 and "user node(s) not in the graph: 1000" in body["message"]
    assert "[user ID, merchant ID] on user__pays__merchant" in body["message"]
    assert fine == 200 and merchant_src == 404 and "1000" in top["message"]
    assert device == 404 and "merchant node(s) not in the graph: 'd4'" in pairs["message"]


def test_kserve_v2_pairs_describe_and_explanations_refused(store, tmp_path):
    model = recipe(store, "hgt", "mlp")
    served = engine(store, model, tmp_path)
    tensor = {
        "name": "pairs",
        "shape": [2, 2],
        "datatype": "BYTES",
        "data": ["u1", "1001", "u2", "1002"],
    }
    [(status, body)] = answers(served, [{"inputs": [tensor]}])
    assert status == 200, body  # the integer merchant IDs sent as text are found too
    [_, _, scores] = body["outputs"]
    [(_, pairs)] = answers(served, [{"pairs": [["u1", 1001], ["u2", 1002]]}])
    assert scores["data"] == [p["score"] for p in pairs["predictions"]]
    tensor = {"name": "pairs", "shape": [2, 2], "datatype": "INT64", "data": [1, 1001, 2, 1002]}
    [(status, body)] = answers(served, [{"inputs": [tensor]}])
    assert status == 404 and "user node(s) not in the graph: 1, 2" in body["message"]
    assert served.describe()["target_edge_type"] == "user__pays__merchant"
    explainer = PairExplanation(served.ego)
    with pytest.raises(Exception, match="not available yet"):
        explainer.parse({"body": {"src": "u1", "dst": 1001}})
