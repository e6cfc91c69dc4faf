"""Link requests on a graph of one node type and on one relation of a graph of several: pair
scores and top-k equal the full-graph decode (every recipe, and a user's model on several);
top-k is an exact search. On several, top-k searches the destination type and leaves out the
source's neighbours on that relation only (both directions), and an ID of the wrong type is a
404 naming it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from graph_assets import GraphStore, StoreError, open_store, write_store
from graph_assets.input.synthetic_typed import fraud_graph
from graph_assets.schema import EdgeType
from graph_assets.tables import RawRelation
from handler.graph.ego import EgoGraphs
from handler.settings import ServingSettings
from handler.tasks.link.engine import LinkEngine
from handler.tasks.link.explain import PairExplanation
from model import ModelConfig, build_model
from model.hetero_link import HeteroLinkModel
from model.link_assets import full_graph_embeddings, open_link_assets, write_link_assets
from model.served_hetero_link import UserHeteroLinkModel
from model.typed_graph import hetero_section, whole_graph_input
from tests.typed_graphs import with_reverses
from tests.unit.archive_build import user_models

from .conftest import link_engine

ARCHS = ["gcn", "sage", "gat", "gin"]


def answers(engine, payloads):
    return [(r.status, r.body) for r in engine.handle([{"body": p} for p in payloads])]


ONE_TYPE, TYPED = "one-type", "typed"
# Each typed recipe with one of the two decoders, and the user's model with its own decode.
RECIPES = [("sage", "dot"), ("gat", "mlp"), ("gcn", "dot"), ("gin", "mlp"), ("rgcn", "mlp"),
           ("hgt", "dot"), ("own", "decode")]  # fmt: skip
PAYS = ("user", "pays", "merchant")
FOLLOWS = ("user", "follows", "user")
USERS, MERCHANTS, DEVICES = 80, 15, 30


@pytest.fixture(scope="module")
def typed_store(tmp_path_factory: pytest.TempPathFactory) -> GraphStore:
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


def typed_engine(store: GraphStore, model: HeteroLinkModel, tmp_path: Path) -> LinkEngine:
    write_link_assets(model, store, tmp_path / "link")
    settings = ServingSettings.from_yaml_section({"fanouts": [-1, -1], "task": "link"})
    ego = EgoGraphs.create(store, model, settings, torch.device("cpu"))
    return LinkEngine(ego, open_link_assets(tmp_path / "link", store), "1.0")


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


@dataclass
class PairCase:
    """A link engine with full neighbourhoods, 40 pairs to score (external IDs, asked
    ``per_request`` a request) and their full-graph scores, and a source whose top-k over
    every candidate (neighbours included) is compared with the full-graph scores."""

    engine: LinkEngine
    pairs: list[list]
    expected: torch.Tensor
    per_request: int
    src: Any
    candidates: dict[Any, float]


def one_type_case(store: GraphStore, tmp_path: Path, arch: str, decoder: str) -> PairCase:
    """Pairs of any two nodes; node 0 (a hub) against every other node."""
    engine = link_engine(store, tmp_path, arch, decoder)
    rng = np.random.default_rng(0)
    rows = rng.integers(0, store.num_nodes, size=(40, 2))
    z = torch.from_numpy(full_graph_embeddings(engine.predictor, store))
    with torch.no_grad():
        expected = torch.sigmoid(engine.predictor.score(z[rows[:, 0]], z[rows[:, 1]]))
        against = torch.sigmoid(engine.predictor.score(z[0].expand_as(z), z))
    ids = store.external_ids(np.arange(store.num_nodes))
    pairs = [[ids[a], ids[b]] for a, b in rows.tolist()]
    candidates = {ids[i]: float(against[i]) for i in range(1, store.num_nodes)}
    return PairCase(engine, pairs, expected, 40, ids[0], candidates)


def typed_case(store: GraphStore, tmp_path: Path, arch: str, decoder: str) -> PairCase:
    """Users paying merchants on user__pays__merchant; u3 against every merchant."""
    model = user_model() if arch == "own" else recipe(store, arch, decoder)
    engine = typed_engine(store, model, tmp_path)
    merchant_offset = store.schema.node_type("merchant").offset
    rng = np.random.default_rng(1)
    src, dst = rng.integers(0, USERS, 40), rng.integers(0, MERCHANTS, 40)
    users = store.external_ids(src)
    merchants = store.external_ids(dst + merchant_offset)
    pairs = [[u, m] for u, m in zip(users, merchants, strict=True)]
    [u3] = store.lookup(["u3"], node_type="user")
    every = full_scores(model, store, np.full(MERCHANTS, u3), np.arange(MERCHANTS))
    every_id = store.external_ids(np.arange(MERCHANTS) + merchant_offset)
    candidates = dict(zip(every_id, every.tolist(), strict=True))
    return PairCase(engine, pairs, full_scores(model, store, src, dst), 8, "u3", candidates)


PAIR_CASES = [(ONE_TYPE, arch, decoder) for arch in ARCHS for decoder in ("dot", "mlp")]
PAIR_CASES += [(TYPED, arch, decoder) for arch, decoder in RECIPES]


@pytest.mark.parametrize(("schema", "arch", "decoder"), PAIR_CASES)
def test_pair_scores_and_top_k_equal_the_full_graph_forward(
    int_store, typed_store, tmp_path, schema, arch, decoder
):
    """Pair scores (a list and a single pair) and a top-k over every candidate equal the
    full-graph decode: on one type any two nodes, on several a relation's ends."""
    if schema == ONE_TYPE:
        case = one_type_case(int_store, tmp_path, arch, decoder)
    else:
        case = typed_case(typed_store, tmp_path, arch, decoder)
    size = case.per_request
    bodies = [{"pairs": case.pairs[i : i + size]} for i in range(0, len(case.pairs), size)]
    bodies.append({"src": case.pairs[0][0], "dst": case.pairs[0][1]})
    bodies.append({"src": case.src, "top_k": len(case.candidates), "exclude_neighbors": False})
    *pair_answers, (single_status, single), (top_status, top) = answers(case.engine, bodies)
    assert all(status == 200 for status, _ in pair_answers), pair_answers
    predictions = [p for _, body in pair_answers for p in body["predictions"]]
    served = torch.tensor([p["score"] for p in predictions])
    worst = float((served - case.expected).abs().max())
    assert worst <= 1e-5, worst
    assert [[p["src"], p["dst"]] for p in predictions] == case.pairs
    assert single_status == 200, single
    assert single["score"] == pytest.approx(predictions[0]["score"], abs=1e-6)
    assert single["model_version"] == "1.0"
    assert top_status == 200, top
    found = [r["dst"] for r in top["recommendations"]]
    assert sorted(found, key=str) == sorted(case.candidates, key=str)  # all, nothing else
    got = torch.tensor([r["score"] for r in top["recommendations"]])
    want = torch.tensor([case.candidates[dst] for dst in found])
    assert float((got - want).abs().max()) <= 1e-5
    assert torch.equal(got, got.sort(descending=True).values)


@pytest.mark.parametrize("decoder", ["dot", "mlp"])
def test_top_k_is_the_exact_best_of_all_candidates(str_store, tmp_path, decoder):
    engine = link_engine(str_store, tmp_path, "gcn", decoder)
    src = 0  # a hub with many in-neighbours
    z = torch.from_numpy(full_graph_embeddings(engine.predictor, str_store))
    with torch.no_grad():
        scores = torch.sigmoid(engine.predictor.score(z[src].expand_as(z), z))
    edges = str_store.edge_index()
    neighbours = set(edges[0][edges[1] == src]) | set(edges[1][edges[0] == src]) | {src}
    allowed = [i for i in range(str_store.num_nodes) if i not in neighbours]
    best = sorted(allowed, key=lambda i: -float(scores[i]))[:10]
    [(status, body)] = answers(engine, [{"src": "acct_0", "top_k": 10}])
    assert status == 200 and body["src"] == "acct_0" and body["exclude_neighbors"] is True
    served = body["recommendations"]
    assert [r["dst"] for r in served] == str_store.external_ids(np.array(best))
    assert np.allclose([r["score"] for r in served], scores[best].numpy(), atol=1e-6)


def test_top_k_can_include_neighbours_and_never_returns_the_node_itself(int_store, tmp_path):
    engine = link_engine(int_store, tmp_path)
    n = int_store.num_nodes
    [(_, body)] = answers(engine, [{"src": 0, "top_k": n, "exclude_neighbors": False}])
    assert len(body["recommendations"]) == n - 1
    assert 0 not in [r["dst"] for r in body["recommendations"]]
    [(_, excluded)] = answers(engine, [{"src": 0, "top_k": n}])
    assert len(excluded["recommendations"]) < n - 1


def test_sampled_pair_scores_do_not_depend_on_the_batch(int_store, tmp_path):
    engine = link_engine(int_store, tmp_path, fanouts=[2, 2])
    alone = answers(engine, [{"src": 3, "dst": 6}])
    batched = answers(engine, [{"pairs": [[9, 12], [0, 30]]}, {"src": 3, "dst": 6}])
    assert alone[0] == batched[1]


@pytest.mark.parametrize(
    ("payload", "status", "words"),
    [
        ({"src": 3}, 400, "send one of"),
        ({"src": 3, "dst": 6, "pairs": [[3, 6]]}, 400, "send one of"),
        ({"pairs": []}, 400, "empty"),
        ({"pairs": [[3, 6, 9]]}, 400, "pairs"),
        ({"src": 3, "top_k": 0}, 400, "positive"),
        ({"src": 3, "top_k": 51}, 413, "at most 50"),
        ({"src": 3, "dst": 6, "exclude_neighbors": False}, 400, "goes with top_k"),
        ({"pairs": [[3, 6]] * 9}, 413, "at most 8"),
        ({"src": 3, "dst": 4}, 404, "not in the graph: 4"),
        ({"src": 1.5, "top_k": 3}, 400, "src"),
    ],
)
def test_bad_link_requests_get_their_own_error(int_store, tmp_path, payload, status, words):
    engine = link_engine(int_store, tmp_path, max_ids_per_request=8, max_top_k=50)
    good, (code, body) = answers(engine, [{"src": 3, "dst": 6}, payload])
    assert good[0] == 200
    assert code == status and words in body["message"], body


def test_link_assets_refuse_a_different_graph(int_store, str_store, tmp_path):
    link_engine(int_store, tmp_path)
    with pytest.raises(StoreError, match="rebuild the archive"):
        open_link_assets(tmp_path / "link", str_store)


def test_a_nan_candidate_score_fails_that_top_k_alone(int_store, tmp_path):
    """A model that scores some candidate NaN is refused, never answered with fewer
    recommendations; pair scores in the same batch are answered."""
    engine = link_engine(int_store, tmp_path)
    score_against = engine.predictor.score_against

    def broken(z_src, table):
        scores = score_against(z_src, table)
        scores[7] = float("nan")
        return scores

    engine.predictor.score_against = broken
    (status, body), (pair_status, _) = answers(
        engine, [{"src": 0, "top_k": 5}, {"src": 0, "dst": 3}]
    )
    assert (status, pair_status) == (500, 200)
    assert body["type"] == "NonFiniteOutput"
    assert "non-finite output (NaN/inf) from the model for" in body["message"]


# Several node types only: neighbours on the relation, IDs of the wrong type, KServe v2.


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


def test_top_k_leaves_out_the_neighbours_on_the_relation_only(typed_store, tmp_path):
    """On pays: the merchants the user paid; on follows (one type, no reverse): the users it
    follows, its followers and itself, not users it shares a device or merchant with."""
    [u3] = typed_store.lookup(["u3"], node_type="user")
    paid = out_neighbours(typed_store, u3, "user__pays__merchant")
    assert paid == in_neighbours(typed_store, u3, "merchant__rev_pays__user")
    engine = typed_engine(typed_store, recipe(typed_store, "sage", "dot"), tmp_path / "pays")
    [(status, body)] = answers(engine, [{"src": "u3", "top_k": MERCHANTS}])
    assert status == 200 and body["exclude_neighbors"] is True
    found = set(
        typed_store.lookup([r["dst"] for r in body["recommendations"]], node_type="merchant")
    )
    offset = typed_store.schema.node_type("merchant").offset
    assert paid and found == set(range(offset, offset + MERCHANTS)) - paid

    follows = np.asarray(typed_store.edge_type) == 4
    user = int(np.asarray(typed_store.indices)[follows][0])  # follows someone
    linked = out_neighbours(typed_store, user, "user__follows__user") | in_neighbours(
        typed_store, user, "user__follows__user"
    )
    engine = typed_engine(
        typed_store, recipe(typed_store, "rgcn", "dot", FOLLOWS), tmp_path / "follows"
    )
    [user_id] = typed_store.external_ids(np.array([user]))
    [(status, body)] = answers(engine, [{"src": user_id, "top_k": USERS}])
    assert status == 200, body
    found = set(typed_store.lookup([r["dst"] for r in body["recommendations"]], node_type="user"))
    assert linked and found == set(range(USERS)) - linked - {user}


def test_an_id_of_the_wrong_type_is_a_404_naming_it(typed_store, tmp_path):
    engine = typed_engine(typed_store, recipe(typed_store, "gcn", "dot"), tmp_path)
    replies = answers(
        engine,
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


def test_kserve_v2_pairs_describe_and_explanations_refused(typed_store, tmp_path):
    model = recipe(typed_store, "hgt", "mlp")
    engine = typed_engine(typed_store, model, tmp_path)
    tensor = {
        "name": "pairs",
        "shape": [2, 2],
        "datatype": "BYTES",
        "data": ["u1", "1001", "u2", "1002"],
    }
    [(status, body)] = answers(engine, [{"inputs": [tensor]}])
    assert status == 200, body  # the integer merchant IDs sent as text are found too
    [_, _, scores] = body["outputs"]
    [(_, pairs)] = answers(engine, [{"pairs": [["u1", 1001], ["u2", 1002]]}])
    assert scores["data"] == [p["score"] for p in pairs["predictions"]]
    tensor = {"name": "pairs", "shape": [2, 2], "datatype": "INT64", "data": [1, 1001, 2, 1002]}
    [(status, body)] = answers(engine, [{"inputs": [tensor]}])
    assert status == 404 and "user node(s) not in the graph: 1, 2" in body["message"]
    assert engine.describe()["target_edge_type"] == "user__pays__merchant"
    explainer = PairExplanation(engine.ego)
    with pytest.raises(Exception, match="not available yet"):
        explainer.parse({"body": {"src": "u1", "dst": 1001}})
