"""Precomputed archives of the user's own class (model.precompute, handler.graph.precomputed):
per-layer rows for a torch_geometric.nn.models stack of by-rows layers, every node's output for
any other model; both equal the model's full-graph forward on the graph version they report,
through seeded random streams of live updates (edge features included) taken by two workers on
one log, for predictions, embeddings and cold-start nodes (cold start on sampled archives of the
same classes too)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch_geometric.nn import GINEConv
from torch_geometric.nn import models as pyg

from archive_build import own_model
from graph_assets import GraphStore, StoreError
from handler.live.live_graph import LiveGraph, UpdateRequest
from handler.settings import ServingSettings
from handler.tasks.node.engine import NodeClassificationEngine
from handler.tasks.node.extras import NodeExtrasEngine
from model import __main__ as model_cli
from model.export import load_model
from model.precompute import Mode, open_precomputed, plan_for, precompute
from tests.edge_graph import CLASSES, EDGE_DIM, FEATURES, edge_feature_store
from tests.live_reference import materialized_forward, materialized_graph, random_update
from tests.precomputed_engines import node_worker, served
from tests.unit.archive_build import user_models

F, H, C = FEATURES, 16, CLASSES
BASIC = "torch_geometric.nn.models."
# name -> (class, constructor arguments, the mode the build must choose)
MODELS: dict[str, tuple[str, dict[str, Any], Mode]] = {
    "sage-max-tanh-first-batchnorm": (
        BASIC + "GraphSAGE",
        {
            "in_channels": F, "hidden_channels": H, "num_layers": 2, "out_channels": C,
            "aggr": "max", "act": "tanh", "act_first": True, "norm": "batch_norm",
        },
        Mode.LAYERS,
    ),
    "gat-edge-dim": (
        BASIC + "GAT",
        {
            "in_channels": F, "hidden_channels": H, "num_layers": 2, "out_channels": C,
            "heads": 2, "edge_dim": EDGE_DIM,
        },
        Mode.LAYERS,
    ),
    "gcn": (
        BASIC + "GCN",
        {"in_channels": F, "hidden_channels": H, "num_layers": 2, "out_channels": C},
        Mode.OUTPUT,
    ),
    "skip-sage": ("SkipSage", {"in_channels": F, "hidden": H, "classes": C}, Mode.OUTPUT),
    "appnp": ("Appnp", {"in_channels": F, "hidden": H, "classes": C, "k": 3}, Mode.OUTPUT),
    "edge-mix": (
        "EdgeMix",
        {"in_channels": F, "hidden": H, "classes": C, "edge_dim": EDGE_DIM},
        Mode.OUTPUT,
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> GraphStore:
    return edge_feature_store(tmp_path_factory.mktemp("precomputed_user_models"))


def user_model(name: str, store: GraphStore, directory: Path) -> torch.nn.Module:
    """The user's class with seeded random weights, packaged as build_mar.sh packages it and
    loaded as a worker loads it. BatchNorm running statistics are made non-trivial, and the
    maps of edge features (amounts ~100, timestamps ~5,000) scaled down so that no softmax
    saturates: an answer then moves with every input it reads."""
    model_class, args, _ = MODELS[name]
    torch.manual_seed(0)
    if model_class.startswith(BASIC):
        module = getattr(pyg, model_class.removeprefix(BASIC))(**args)
    else:
        module = getattr(user_models, model_class)(**args)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for sub in module.modules():
            if isinstance(sub, torch.nn.BatchNorm1d):
                sub.running_mean.copy_(torch.randn(sub.num_features, generator=generator))
                sub.running_var.copy_(torch.rand(sub.num_features, generator=generator) + 0.5)
            edge_map = getattr(sub, "lin_edge", None) or (
                sub.lin if isinstance(sub, GINEConv) else None
            )
            if isinstance(edge_map, torch.nn.Module):
                for weight in edge_map.parameters():
                    weight.mul_(1e-3)
    directory.mkdir(parents=True, exist_ok=True)
    torch.save(module.state_dict(), directory / "weights.pt")
    argv = [
        "--store", str(store.path), "--model-class", model_class,
        "--model-args", json.dumps(args), "--weights", str(directory / "weights.pt"),
        "--out", str(directory / "model"),
    ]  # fmt: skip
    if not model_class.startswith(BASIC):
        argv += ["--model-file", user_models.__file__]
    if model_class == BASIC + "GCN":  # trained without the graph's edge features as weights
        argv += ["--edge-input", "none"]
    assert own_model.main(argv) == 0
    model, _ = load_model(directory / "model")
    return model


def precomputed_worker(
    store: GraphStore, model: torch.nn.Module, tmp_path: Path, log: Path | None = None
) -> tuple[NodeClassificationEngine, LiveGraph | None]:
    """A worker of the precomputed archive under ``tmp_path``, sampling as many hops as the
    model's plan reads (output mode: the rows are built one in-neighbourhood per chunk)."""
    fanouts = [2] * plan_for(model).hops
    return node_worker(store, model, tmp_path / "precomputed", log, fanouts)


def full_graph_forward(model: torch.nn.Module, store: GraphStore) -> torch.Tensor:
    x = torch.from_numpy(np.array(store.features))
    edge_attr = torch.from_numpy(np.array(store.edge_features))
    with torch.no_grad():
        rows = model(x, torch.from_numpy(store.edge_index()), edge_attr=edge_attr)
    return torch.softmax(rows, dim=-1)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_build_chooses_per_layer_rows_only_for_a_stack_of_by_rows_layers(
    name: str, store: GraphStore, tmp_path: Path
) -> None:
    plan = plan_for(user_model(name, store, tmp_path))
    assert plan.mode is MODELS[name][2], plan.reason
    assert plan.reason.startswith(
        "per-layer rows" if plan.mode is Mode.LAYERS else "every node's output"
    )


@pytest.mark.parametrize(
    ("name", "printed"),
    [
        ("gat-edge-dim", "per-layer rows: GAT is a torch_geometric.nn.models model whose 2"),
        ("gcn", "every node's output: GCN normalises messages by their sources' degrees"),
        ("skip-sage", "every node's output: SkipSage is not a torch_geometric.nn.models model"),
    ],
)
def test_the_build_prints_the_mode_and_why(
    name: str, printed: str, store: GraphStore, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    user_model(name, store, tmp_path)
    capsys.readouterr()
    argv = ["precompute", "--store", str(store.path), "--model-dir", str(tmp_path / "model")]
    assert model_cli.main([*argv, "--out", str(tmp_path / "p"), "--quiet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("  " + printed), lines
    assert "precomputed" in lines[-1] and f"{store.num_nodes} nodes" in lines[-1]


@pytest.mark.parametrize("chunk_edges", [64, 1 << 21])
@pytest.mark.parametrize("name", ["gat-edge-dim", "gcn", "appnp"])
def test_stored_rows_equal_the_full_graph_forward(
    name: str, chunk_edges: int, store: GraphStore, tmp_path: Path
) -> None:
    """In chunks (per layer, or one in-neighbourhood per chunk) or the whole graph at once."""
    model = user_model(name, store, tmp_path)
    meta = precompute(model, store, tmp_path / "p", "weights", chunk_edges, progress=False)
    assert meta["mode"] == MODELS[name][2].value
    engine, _ = precomputed_worker(store, model, tmp_path.with_name(tmp_path.name + "_w"))
    rows = open_precomputed(tmp_path / "p", store, "weights")
    ids = store.external_ids(np.arange(store.num_nodes))
    expected = full_graph_forward(model, store)
    stored = torch.softmax(torch.from_numpy(np.array(rows.layers[-1])), dim=-1)
    assert float((stored - expected).abs().max()) <= 1e-5
    assert float((served(engine, ids) - expected).abs().max()) <= 1e-5


@pytest.mark.parametrize("name", sorted(MODELS))
def test_exact_after_random_updates_on_two_workers(
    name: str, store: GraphStore, tmp_path: Path
) -> None:
    """A seeded stream of updates (edges with features added and removed, self-loops and
    parallel edges, edge features set, features set, nodes added and removed) taken by two
    workers on one log; every node's answer on both equals the model's forward on the
    updated graph, and so do embeddings and a worker started after the updates."""
    model = user_model(name, store, tmp_path)
    log = tmp_path / "updates.log"
    first, live = precomputed_worker(store, model, tmp_path, log)
    second, second_live = precomputed_worker(store, model, tmp_path, log)
    assert live is not None and second_live is not None
    rng, counter = random.Random(13), [0]
    for step in range(150):
        taker = live if step % 3 else second_live
        taker.update(UpdateRequest(random_update(rng, taker, counter)))
        if step % 50 == 49:  # reads between updates refresh some rows, not all
            served(first, live_ids_sample(live, rng))
    ids, expected = materialized_forward(live, model)
    late, _ = precomputed_worker(store, model, tmp_path, log)
    for engine in (first, second, late):
        assert float((served(engine, ids) - expected).abs().max()) <= 1e-5
    assert first.ego.precomputed is not None and first.ego.precomputed.stats.rows > 0
    _, x, edge_index, edge_attr = materialized_graph(live)
    with torch.no_grad():
        _, embedding = model.forward_with_embedding(x, edge_index, None, edge_attr)
    picked = ids[:: max(1, len(ids) // 12)]
    (answer,) = NodeExtrasEngine(first.ego, "1.0").handle(
        [{"body": {"node_ids": picked, "return_embedding": True}}]
    )
    assert answer.status == 200, answer.body
    got = torch.tensor([p["embedding"] for p in answer.body["predictions"]])
    want = embedding[[ids.index(i) for i in picked]]
    assert float((got - want).abs().max()) <= 1e-5


def live_ids_sample(live: LiveGraph, rng: random.Random) -> list:
    ids = materialized_graph(live)[0]
    return rng.sample(ids, min(10, len(ids)))


def sampled_worker(
    store: GraphStore, model: torch.nn.Module, log: Path
) -> tuple[NodeClassificationEngine, LiveGraph]:
    """A worker of an archive without precomputed rows, with full neighbourhoods."""
    live = LiveGraph(store, log)
    settings = ServingSettings.from_yaml_section({"fanouts": [-1] * plan_for(model).hops})
    engine = NodeClassificationEngine.create(
        store, model, settings, torch.device("cpu"), "1.0", live
    )
    return engine, live


@pytest.mark.parametrize("direction", ["in", "out", "both"])
@pytest.mark.parametrize("name", ["gat-edge-dim", "gcn", "skip-sage", "appnp", "edge-mix"])
@pytest.mark.parametrize("archive", ["precomputed", "sampled"])
def test_a_new_node_is_exact_on_the_updated_graph(
    archive: str, name: str, direction: str, store: GraphStore, tmp_path: Path
) -> None:
    """Cold start after updates: per-layer rows from the stored rows of its upstream cone,
    outputs from its in-neighbourhood; a sampled archive with full neighbourhoods from its
    ego-graph, whose boundary hop gives degree-normalising models (gcn, appnp) their degrees.
    Its edges carry the request's edge_attr rows."""
    model = user_model(name, store, tmp_path)
    log = tmp_path / "updates.log"
    if archive == "precomputed":
        engine, live = precomputed_worker(store, model, tmp_path, log)
    else:
        engine, live = sampled_worker(store, model, log)
    assert live is not None
    rng, counter = random.Random(3), [0]
    for _ in range(30):
        live.update(UpdateRequest(random_update(rng, live, counter)))
    ids, x, edge_index, edge_attr = materialized_graph(live)
    neighbours = [ids[1], ids[0], ids[17], ids[40]]  # ids[0]: the hub
    features = [0.3, -0.2, 0.1, 0.5, -0.4, 0.25]
    given = [[1.5 * i, 20.0 - i] for i in range(len(neighbours))]
    body = {
        "new_node": {
            "x": features,
            "neighbors": neighbours,
            "direction": direction,
            "edge_attr": given,
        }
    }
    (answer,) = NodeExtrasEngine(engine.ego, "1.0").handle([{"body": body}])
    assert answer.status == 200, answer.body
    n = len(ids)
    rows = [ids.index(i) for i in neighbours]
    added, attrs = [], []
    if direction in ("in", "both"):
        added.append(torch.tensor([rows, [n] * len(rows)]))
        attrs.append(torch.tensor(given))
    if direction in ("out", "both"):
        added.append(torch.tensor([[n] * len(rows), rows]))
        attrs.append(torch.tensor(given))
    with torch.no_grad():
        out = model(
            torch.cat((x, torch.tensor([features]))),
            torch.cat((edge_index, *added), dim=1),
            edge_attr=torch.cat((edge_attr, *attrs)),
        )
    expected = torch.softmax(out, dim=-1)[n]
    assert float((torch.tensor(answer.body["probabilities"]) - expected).abs().max()) <= 1e-5


def downstream(edge_index: np.ndarray, start: int, hops: int) -> set[int]:
    """``start`` and every node within ``hops`` out-edges of it."""
    found, frontier = {start}, {start}
    for _ in range(hops):
        frontier = {int(d) for s, d in edge_index.T if int(s) in frontier} - found
        found |= frontier
    return found


@pytest.mark.parametrize("name", ["skip-sage", "appnp"])
def test_an_update_marks_the_outputs_within_the_hops_downstream(
    name: str, store: GraphStore, tmp_path: Path
) -> None:
    """Output mode: a feature set marks its node and every node within the model's hops
    downstream; an added edge ``u -> v`` marks ``v`` and the nodes within hops - 1 downstream of
    it, or within hops for a model that normalises by degrees (APPNP: ``v``'s degree weighs its
    out-edges); nothing else. A read away from the marks recomputes nothing, a read of a marked
    node its own output alone, and every answer is exact."""
    model = user_model(name, store, tmp_path)
    engine, live = precomputed_worker(store, model, tmp_path, tmp_path / "updates.log")
    assert live is not None
    rows = engine.ego.precomputed
    assert rows is not None and rows.num_layers == 1
    hops = MODELS[name][1].get("k", 2)
    assert rows.plan.hops == hops and rows.plan.degree == (name == "appnp")
    edges = store.edge_index()
    ids = store.external_ids(np.arange(store.num_nodes))
    u, v = (int(i) for i in store.lookup(["acct_5", "acct_61"]))
    live.update(UpdateRequest([{"type": "set_features", "id": ids[u], "x": [1.0] * F}]))
    assert rows.pending[0] == downstream(edges, u, hops) and rows.stats.rows == 0
    away = [i for i in range(store.num_nodes) if i not in rows.pending[0]]
    assert away
    served(engine, [ids[i] for i in away[:5]])
    assert rows.stats.rows == 0
    served(engine, [ids[u]])
    assert rows.stats.rows == 1 and rows.pending_rows == len(downstream(edges, u, hops)) - 1
    everyone, expected = materialized_forward(live, model)
    assert float((served(engine, everyone) - expected).abs().max()) <= 1e-5
    assert rows.pending_rows == 0
    add = {"type": "add_edge", "src": ids[u], "dst": ids[v], "attr": [1.0, 2.0]}
    live.update(UpdateRequest([add]))
    reach = hops if rows.plan.degree else hops - 1
    assert rows.pending[0] == downstream(edges, v, reach)
    everyone, expected = materialized_forward(live, model)
    assert float((served(engine, everyone) - expected).abs().max()) <= 1e-5


def test_an_embedding_over_the_limits_is_413_in_output_mode(
    store: GraphStore, tmp_path: Path
) -> None:
    model = user_model("gcn", store, tmp_path)
    precompute(model, store, tmp_path / "p", "weights", progress=False)
    settings = ServingSettings.from_yaml_section({"fanouts": [2, 2], "max_subgraph_edges": 50})
    engine = NodeClassificationEngine.create(
        store,
        model,
        settings,
        torch.device("cpu"),
        "1.0",
        precomputed=open_precomputed(tmp_path / "p", store, "weights"),
    )
    (answer,) = NodeExtrasEngine(engine.ego, "1.0").handle(
        [{"body": {"node_id": "acct_0", "return_embedding": True}}]
    )
    assert answer.status == 413, answer.body
    (prediction,) = engine.handle([{"body": {"node_id": "acct_0"}}])
    assert prediction.status == 200  # a stored output costs no neighbourhood


def test_rows_of_another_mode_are_refused(store: GraphStore, tmp_path: Path) -> None:
    sage = user_model("sage-max-tanh-first-batchnorm", store, tmp_path / "sage")
    gcn = user_model("gcn", store, tmp_path / "gcn")
    precompute(sage, store, tmp_path / "p", "weights", progress=False)
    settings = ServingSettings.from_yaml_section({"fanouts": [2, 2]})
    refused = "holds 2 layers' rows, the archive's model needs every node's output"
    with pytest.raises(StoreError, match=refused):
        NodeClassificationEngine.create(
            store,
            gcn,
            settings,
            torch.device("cpu"),
            "1.0",
            precomputed=open_precomputed(tmp_path / "p", store, "weights"),
        )
