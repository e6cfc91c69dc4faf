"""The link and graph engines and their explanations on the user's own classes: scores as the
model's output says, edge features and boundary degrees in pair explanations, a precomputed link
class exact through live updates, graph answers of raw rows, and return_embedding refused with
a 400 when the model names no embedding."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from handler.explain.ego_explain import ExplainEngine
from handler.graph.ego import EgoGraphs
from handler.live.live_graph import LiveGraph, UpdateRequest
from handler.settings import ServingSettings
from handler.tasks.graph.engine import GraphEngine
from handler.tasks.graph.explain import GraphExplanation
from handler.tasks.link.engine import LinkEngine
from handler.tasks.link.explain import PairExplanation
from model.link_assets import open_link_assets, write_link_assets
from model.precompute import Mode, open_precomputed, plan_for, precompute
from model.served_graph import UserGraphModel
from model.served_link import UserLinkModel
from model.user_model import UserModelConfig
from tests.edge_graph import EDGE_DIM, FEATURES, edge_feature_store
from tests.live_reference import materialized_graph, random_update
from tests.unit.archive_build import user_models

from .conftest import NAMES, graph_requests


def answers(engine: Any, payloads: list[dict]) -> list[tuple[int, dict]]:
    return [(r.status, r.body) for r in engine.handle([{"body": p} for p in payloads])]


def edge_gat_link(output: str) -> UserLinkModel:
    """EdgeGatLink (edge features, a GCNConv: boundary degrees), seeded."""
    torch.manual_seed(0)
    module = user_models.EdgeGatLink(FEATURES, 16, EDGE_DIM).eval()
    config = UserModelConfig(
        task="link",
        model_class="EdgeGatLink",
        in_dim=FEATURES,
        out_dim=16,
        num_layers=3,
        output=output,
        edge_input="edge_attr",
        boundary_degrees=True,
    )
    return UserLinkModel(module, config).eval()


def link_engine(tmp_path: Path, output: str) -> tuple[LinkEngine, torch.nn.Module]:
    """EdgeGatLink with full fanouts."""
    store = edge_feature_store(tmp_path)
    model = edge_gat_link(output)
    module = model.module
    write_link_assets(model, store, tmp_path / "link")
    settings = ServingSettings(task="link", fanouts=(-1, -1, -1), explain_time_budget_ms=60_000)
    ego = EgoGraphs.create(store, model, settings, torch.device("cpu"))
    return LinkEngine(ego, open_link_assets(tmp_path / "link", store), "1.0"), module


def test_raw_link_scores_are_decode_as_it_is_and_pairs_are_explained(tmp_path):
    engine, module = link_engine(tmp_path, "raw")
    store = engine.store
    [(status, body)] = answers(engine, [{"src": "acct_0", "dst": "acct_4"}])
    with torch.no_grad():
        z = module.encode(
            torch.from_numpy(np.array(store.features)),
            torch.from_numpy(store.edge_index()),
            torch.from_numpy(np.array(store.edge_features)),
        )
        pair = torch.from_numpy(store.lookup(["acct_0", "acct_4"])).reshape(2, 1)
        expected = float(module.decode(z, pair)[0])
    assert status == 200 and body["score"] == pytest.approx(expected, abs=1e-5)
    assert engine.describe()["decoder"] == "EdgeGatLink.decode"
    assert engine.describe()["output"] == "raw"
    explainer = ExplainEngine(PairExplanation(engine.ego), "1.0")
    [(status, explained)] = answers(explainer, [{"src": "acct_0", "dst": "acct_4"}])
    assert status == 200, explained
    assert explained["score"] == pytest.approx(body["score"], abs=1e-5)
    listed = explained["explanation"]
    ids = set(store.external_ids(np.arange(store.num_nodes)))
    assert listed["edges"] and {node["node_id"] for node in listed["nodes"]} <= ids


def graph_engine(
    module: torch.nn.Module, embedding: str, output: str, out_dim: int = 4
) -> GraphEngine:
    config = UserModelConfig(
        task="graph",
        model_class=type(module).__name__,
        in_dim=8,
        out_dim=out_dim,
        num_layers=1,
        output=output,
        embedding=embedding,
    )
    model = UserGraphModel(module.eval(), config).eval()
    return GraphEngine(model, NAMES, ServingSettings(task="graph"), torch.device("cpu"), "1.0")


def test_return_embedding_is_refused_when_the_model_names_no_embedding():
    torch.manual_seed(0)
    engine = graph_engine(user_models.PooledConv(8, 4), "", "logits")
    payload = graph_requests(1)[0]
    [(plain, body), (refused, error)] = answers(
        engine, [payload, {**payload, "return_embedding": True}]
    )
    assert plain == 200 and body["predicted_label"] in NAMES and "embedding" not in body
    assert refused == 400 and "names no graph embedding" in error["message"]
    assert "--embedding-method" in error["message"]


def test_raw_graph_rows_are_answered_as_they_are_and_explained():
    torch.manual_seed(0)
    module = user_models.GinGraph(8, 16, 1)  # one value per graph: a regression
    engine = graph_engine(module, "head2", "raw", out_dim=1)
    payload = {**graph_requests(1)[0], "return_embedding": True}
    [(status, body)] = answers(engine, [payload])
    x = torch.tensor(payload["graph"]["x"])
    edge_index = torch.tensor(payload["graph"]["edge_index"])
    one = torch.zeros(len(x), dtype=torch.long)
    with torch.no_grad():
        expected = module(x, edge_index, one)[0]
    assert status == 200 and "probabilities" not in body
    assert torch.allclose(torch.tensor(body["output"]), expected, atol=1e-5)
    assert len(body["embedding"]) == 16
    explainer = ExplainEngine(GraphExplanation(engine), "1.0")
    [(status, explained)] = answers(explainer, [graph_requests(1)[0]])
    assert status == 200 and explained["output"] == pytest.approx(body["output"], abs=1e-5)
    assert explained["explanation"]["nodes"]


@pytest.mark.parametrize("width", [1, 2])
def test_raw_node_outputs_are_explained_when_they_are_one_value(tmp_path, width):
    """A raw output of one value is explained as a regression; several values have no one
    value to explain: 400 naming the fix, never a 500."""
    from torch_geometric.nn.models import GraphSAGE

    from handler.tasks.node.explain import NodeExplanation
    from model.served import UserNodeModel

    store = edge_feature_store(tmp_path)
    torch.manual_seed(0)
    module = GraphSAGE(FEATURES, 8, 2, width).eval()
    config = UserModelConfig(
        model_class="torch_geometric.nn.models.GraphSAGE",
        in_dim=FEATURES,
        out_dim=width,
        num_layers=2,
        output="raw",
        trim=True,
    )
    settings = ServingSettings(fanouts=(-1, -1), explain_time_budget_ms=60_000)
    model = UserNodeModel(module, config).eval()
    ego = EgoGraphs.create(store, model, settings, torch.device("cpu"))
    [(status, body)] = answers(ExplainEngine(NodeExplanation(ego), "1.0"), [{"node_id": "acct_0"}])
    if width == 1:
        assert status == 200 and len(body["output"]) == 1 and body["explanation"]["nodes"]
    else:
        assert status == 400 and "--output" in body["message"]


def test_a_precomputed_user_link_archive_scores_and_ranks_the_updated_graph(tmp_path):
    """--precompute on a user's link class stores encode's embeddings (every node's output);
    two workers on one log answer pair scores and top-k equal to decode(encode(...)) on the
    updated graph, edge features and boundary degrees included."""
    store = edge_feature_store(tmp_path)
    model = edge_gat_link("logits")
    module = model.module
    plan = plan_for(model)
    assert plan.mode is Mode.OUTPUT and "link model" in plan.reason and plan.degree
    write_link_assets(model, store, tmp_path / "link")
    precompute(model, store, tmp_path / "p", "weights", chunk_edges=64, progress=False)
    settings = ServingSettings(task="link", fanouts=(2, 2, 2))
    log, engines, lives = tmp_path / "updates.log", [], []
    for _ in range(2):
        live = LiveGraph(store, log)
        rows = open_precomputed(tmp_path / "p", store, "weights")
        ego = EgoGraphs.create(store, model, settings, torch.device("cpu"), live, rows)
        engines.append(LinkEngine(ego, open_link_assets(tmp_path / "link", store), "1.0"))
        lives.append(live)
    rng, counter = random.Random(5), [0]
    for step in range(60):
        taker = lives[step % 2]
        taker.update(UpdateRequest(random_update(rng, taker, counter)))
    lives[0].sync()
    ids, x, edge_index, edge_attr = materialized_graph(lives[0])
    with torch.no_grad():
        z = module.encode(x, edge_index, edge_attr)
        rows = torch.tensor([[i, (7 * i + 3) % len(ids)] for i in range(40)]).T
        expected = torch.sigmoid(module.decode(z, rows))
        src = 5
        every = torch.stack([torch.full((len(ids),), src), torch.arange(len(ids))])
        logits = module.decode(z, every)
    pairs = [[ids[a], ids[b]] for a, b in rows.T.tolist()]
    edges = edge_index.T.tolist()
    neighbours = {a for a, b in edges if b == src} | {b for a, b in edges if a == src} | {src}
    ranked = [i for i in torch.argsort(logits, descending=True).tolist() if i not in neighbours]
    for engine in engines:
        [(status, body)] = answers(engine, [{"pairs": pairs}])
        assert status == 200 and body["graph_version"].endswith("+60"), body
        got = torch.tensor([p["score"] for p in body["predictions"]])
        assert float((got - expected).abs().max()) <= 1e-5
        [(status, top)] = answers(engine, [{"src": ids[src], "top_k": 5}])
        assert [r["dst"] for r in top["recommendations"]] == [ids[i] for i in ranked[:5]]
        scores = torch.tensor([r["score"] for r in top["recommendations"]])
        assert float((scores - torch.sigmoid(logits[ranked[:5]])).abs().max()) <= 1e-5
