"""Users' own models as PyG's documentation writes them, packaged by archive_build.own_model
and verified by archive_build.verify against their own full-graph forward (<= 1e-5 with full
neighbourhoods): lazy in-channels (``to_hetero`` over ``SAGEConv((-1, -1))``,
``Linear(-1, ...)``), a model without message passing at ``--num-hops 0``, tensor arguments
given as lists, and typed models: HeteroConv and ``to_hetero`` over every bipartite layer,
HGTConv and the relational layers."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from torch_geometric.nn import ChebConv
from torch_geometric.nn.models import PNA

from archive_build import own_model
from archive_build.verify import Verification, verify
from graph_assets import GraphStore, open_store, read_graph_dir, write_store
from handler.live.live_graph import LiveGraph, UpdateRequest
from handler.settings import ServingSettings
from handler.tasks.node.engine import NodeClassificationEngine
from handler.tasks.node.task import node_router
from model.export import load_model
from model.served_hetero import small_typed_input
from model.typed_graph import whole_graph_input
from model.user_model import tensor_parameters
from tests.edge_graph import CLASSES, FEATURES, edge_feature_store, write_edge_feature_csv
from tests.live_reference import materialized_forward, materialized_graph, random_update
from tests.typed_graphs import fraud_store
from tests.unit.archive_build import pyg_user_models

MODEL_FILE = Path(pyg_user_models.__file__)
DEVICES = 40


@pytest.fixture(scope="module")
def typed(tmp_path_factory: pytest.TempPathFactory) -> GraphStore:
    return fraud_store(tmp_path_factory.mktemp("pyg_typed") / "store", 100, 20, DEVICES, 300, 5)


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> GraphStore:
    return edge_feature_store(tmp_path_factory.mktemp("pyg_plain"))


def metadata(store: GraphStore) -> list[Any]:
    return [
        list(store.schema.node_type_names),
        [list(r.edge_type.triple) for r in store.schema.relations],
    ]


def typed_sample(store: GraphStore) -> Any:
    """A small typed graph of the store's types, to initialise lazy layers as PyG's docs do."""
    schema = store.schema
    return small_typed_input(
        {t.name: t.feature_dim for t in schema.node_types},
        {r.edge_type.triple: r.edge_feature_dim for r in schema.relations},
    )


def build(
    tmp_path: Path, store: GraphStore, module: torch.nn.Module, name: str, args: dict, *extra: str
) -> int:
    torch.save(module.state_dict(), tmp_path / "weights.pt")
    argv = [
        "--store", str(store.path), "--model-class", name, "--model-file", str(MODEL_FILE),
        "--model-args", json.dumps(args), "--weights", str(tmp_path / "weights.pt"),
        "--out", str(tmp_path / "model"), "--edge-input", "none", *extra,
    ]  # fmt: skip
    return own_model.main(argv)


def verified(tmp_path: Path, store: GraphStore) -> Verification:
    config = json.loads((tmp_path / "model" / "model_config.json").read_text())
    settings = ServingSettings(fanouts=(3,) * config["num_layers"])
    result = verify(tmp_path / "model", store, settings, 1e-5)
    assert isinstance(result, Verification)
    return result


def alone_worst(model_dir: Path, store: GraphStore, nodes: list[int]) -> float:
    """The largest difference of ``nodes``' answers, each asked alone with full
    neighbourhoods (no other seed's ego-graph adds edges to its own), from the module's
    full-graph forward."""
    model, config = load_model(model_dir)
    x = torch.from_numpy(np.array(store.features))
    with torch.no_grad():
        full = torch.softmax(model.module(x, torch.from_numpy(store.edge_index())), -1)
    settings = ServingSettings(fanouts=(-1,) * config.num_layers)
    engine = NodeClassificationEngine.create(store, model, settings, torch.device("cpu"), "1")
    worst = 0.0
    for node in nodes:
        [answer] = engine.handle([{"body": {"node_ids": store.external_ids([node])}}])
        got = torch.tensor(answer.body["predictions"][0]["probabilities"])
        worst = max(worst, float((got - full[node]).abs().max()))
    return worst


def test_to_hetero_over_lazy_layers_builds_and_serves_exactly(typed, tmp_path, capsys):
    args = {"devices": DEVICES, "hidden": 8, "classes": 2, "metadata": metadata(typed)}
    torch.manual_seed(0)
    module = pyg_user_models.FraudLazyToHetero(**args)
    sample = typed_sample(typed)
    with torch.no_grad():  # PyG's docs: one forward initialises the lazy layers
        module(sample.x_dict, sample.edge_index_dict, sample.n_id_dict)
    assert build(tmp_path, typed, module, "FraudLazyToHetero", args) == 0
    assert "2 hops (inferred: 2 calls of one relation's layers" in capsys.readouterr().out
    result = verified(tmp_path, typed)
    assert result.passed and result.worst_abs_diff <= 1e-5, result


def test_lazy_linear_on_a_graph_of_one_type_builds_and_serves_exactly(plain, tmp_path):
    args = {"hidden": 16, "classes": CLASSES}
    torch.manual_seed(0)
    module = pyg_user_models.LazyMlpSage(**args)
    with torch.no_grad():
        module(torch.randn(4, FEATURES), torch.tensor([[0, 1], [1, 2]]))
    assert build(tmp_path, plain, module, "LazyMlpSage", args) == 0
    result = verified(tmp_path, plain)
    assert result.passed and result.worst_abs_diff <= 1e-5, result
    assert result.lines()[0].startswith("  verified 90 nodes (every node answered for; 8 also")


@pytest.mark.parametrize(
    ("checked", "said"),
    [
        (255, "255 nodes (every node answered for; 8 also alone"),
        (256, "256 nodes (256 random and the 16 highest in-degree, 16 of them among the random"),
        (265, "265 nodes (256 random and the 16 highest in-degree, 7 of them among the random"),
        (272, "272 nodes (256 random and the 16 highest in-degree; 8 also alone"),
    ],
)
def test_the_verified_line_counts_the_nodes_it_checked(checked: int, said: str) -> None:
    result = Verification(
        passed=True, tolerance=1e-5, worst_abs_diff=0.0, seconds=0.1, nodes=checked,
        worst_node=1, class_agreement=None, sampled_class_agreement=None,
        boundary_degrees=False,
    )  # fmt: skip
    assert f"  verified {said}" in result.lines()[0]


def test_weights_of_another_width_are_refused_in_one_line(plain, tmp_path, capsys):
    """A lazy layer takes the saved shape; one saved for another feature width is refused when
    the build runs the model on the graph, not with a traceback."""
    args = {"hidden": 16, "classes": CLASSES}
    torch.manual_seed(0)
    module = pyg_user_models.LazyMlpSage(**args)
    with torch.no_grad():
        module(torch.randn(4, FEATURES + 3), torch.tensor([[0, 1], [1, 2]]))
    assert build(tmp_path, plain, module, "LazyMlpSage", args) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: LazyMlpSage.forward(x, edge_index) failed on a small graph")
    assert f"with {FEATURES} node features" in err and "Traceback" not in err


def test_a_model_without_message_passing_builds_at_zero_hops_and_serves_exactly(
    plain, tmp_path, capsys
):
    """An MLP baseline: refused without --num-hops (its hop count is uncertain), built with
    --num-hops 0, verified, and served on the seeds alone: predictions and a cold-start node
    equal its forward on the node's own features."""
    args = {"in_channels": FEATURES, "hidden": 8, "classes": CLASSES}
    torch.manual_seed(0)
    module = pyg_user_models.Mlp(**args).eval()
    assert build(tmp_path, plain, module, "Mlp", args) == 1
    err = capsys.readouterr().err
    assert "hop count is uncertain: give --num-hops K" in err and "--num-hops 0" in err
    assert build(tmp_path, plain, module, "Mlp", args, "--num-hops", "-1") == 1
    assert "--num-hops must be >= 0" in capsys.readouterr().err
    assert build(tmp_path, plain, module, "Mlp", args, "--num-hops", "0") == 0
    assert "0 hops (given by --num-hops)" in capsys.readouterr().out
    result = verified(tmp_path, plain)
    # Alone and in batches the rows' matmuls may round differently: within float32's ulp.
    assert result.passed and result.worst_abs_diff <= 1e-6, result
    model, _ = load_model(tmp_path / "model")
    settings = ServingSettings.from_yaml_section({"fanouts": []})
    engine = NodeClassificationEngine.create(plain, model, settings, torch.device("cpu"), "1")
    served = node_router(engine, "1")
    x = [0.5, -1.0, 0.25, 2.0, 0.0, -0.75][:FEATURES]
    [known, new] = served.handle(
        [
            {"body": {"node_ids": ["acct_0", "acct_7"]}},
            {"body": {"new_node": {"x": x, "neighbors": ["acct_0"]}}},
        ]
    )
    assert known.status == 200 and new.status == 200, (known.body, new.body)
    with torch.no_grad():
        own = torch.from_numpy(plain.features[plain.lookup(["acct_0", "acct_7"])].copy())
        rows = torch.softmax(module(own, None), -1)
        alone = torch.softmax(module(torch.tensor([x]), None), -1)
    got = torch.tensor([p["probabilities"] for p in known.body["predictions"]])
    assert float((got - rows).abs().max()) <= 1e-6
    assert float((torch.tensor(new.body["probabilities"]) - alone[0]).abs().max()) <= 1e-6


def test_a_gnn_built_at_zero_hops_is_refused_naming_the_hops(plain, tmp_path):
    args = {"hidden": 16, "classes": CLASSES}
    torch.manual_seed(0)
    module = pyg_user_models.LazyMlpSage(**args)
    with torch.no_grad():
        module(torch.randn(4, FEATURES), torch.tensor([[0, 1], [1, 2]]))
    assert build(tmp_path, plain, module, "LazyMlpSage", args, "--num-hops", "0") == 0
    result = verified(tmp_path, plain)
    assert not result.passed
    assert "reads more than 0 hops: build with --num-hops 1" in result.cause


def test_a_list_becomes_a_tensor_where_the_constructor_takes_one(plain, tmp_path, capsys):
    """PNA's ``deg`` (annotated Tensor on PNAConv, which PNA passes its kwargs to) is given
    as the plain JSON list a user would write; a list where no Tensor is taken stays a list."""
    deg = torch.bincount(
        torch.bincount(torch.from_numpy(plain.edge_index()[1]), minlength=plain.num_nodes)
    ).tolist()
    args = {
        "in_channels": FEATURES, "hidden_channels": 8, "num_layers": 2, "out_channels": CLASSES,
        "aggregators": ["mean", "max"], "scalers": ["identity", "amplification"], "deg": deg,
    }  # fmt: skip
    torch.manual_seed(0)
    module = PNA(**{**args, "deg": torch.tensor(deg)})
    torch.save(module.state_dict(), tmp_path / "weights.pt")
    argv = [
        "--store", str(plain.path), "--model-class", "torch_geometric.nn.models.PNA",
        "--model-args", json.dumps(args), "--weights", str(tmp_path / "weights.pt"),
        "--out", str(tmp_path / "model"), "--edge-input", "none",
    ]  # fmt: skip
    assert own_model.main(argv) == 0, capsys.readouterr().err
    result = verified(tmp_path, plain)
    assert result.passed and result.worst_abs_diff <= 1e-5, result
    assert tensor_parameters(PNA) == {"deg"}
    bad = {**args, "deg": [[1, 2], [3]]}
    argv[argv.index("--model-args") + 1] = json.dumps(bad)
    assert own_model.main(argv) == 1
    assert "--model-args deg: a tensor argument is a list of numbers" in capsys.readouterr().err


BIPARTITE = [
    "SAGEConv", "GraphConv", "GATConv", "GATv2Conv", "TransformerConv", "ResGatedGraphConv",
    "GINConv", "MFConv", "LEConv", "GENConv", "GeneralConv", "FiLMConv", "CGConv", "EdgeConv",
    "SimpleConv", "WLConvContinuous",
]  # fmt: skip


def typed_build(
    tmp_path: Path, typed: GraphStore, name: str, args: dict[str, Any], lazy: bool = False
) -> Verification:
    """Builds ``name(**args)`` (seeded; lazy layers initialised by one forward) on the typed
    store and verifies it with full neighbourhoods."""
    torch.manual_seed(0)
    module = getattr(pyg_user_models, name)(**args).eval()
    if lazy:
        sample = typed_sample(typed)
        with torch.no_grad():
            module(sample.x_dict, sample.edge_index_dict, sample.n_id_dict)
    code = build(tmp_path, typed, module, name, args)
    assert code == 0
    result = verified(tmp_path, typed)
    model, config = load_model(tmp_path / "model")
    with torch.no_grad():
        full = torch.softmax(model(whole_graph_input(typed)), -1)
    settings = ServingSettings(fanouts=(-1,) * config.num_layers)
    engine = NodeClassificationEngine.create(typed, model, settings, torch.device("cpu"), "1")
    users = typed.schema.target_type.num_nodes
    hub = int(np.argmax(np.asarray(typed.in_degree)[:users]))
    for user in (hub, 5):  # alone: no other seed's ego-graph adds to its own
        body = {"node_ids": typed.external_ids([user]), "node_type": "user"}
        [answer] = engine.handle([{"body": body}])
        got = torch.tensor(answer.body["predictions"][0]["probabilities"])
        assert float((got - full[user]).abs().max()) <= 1e-5, (name, user)
    return result


@pytest.mark.parametrize("conv", BIPARTITE)
def test_heteroconv_over_a_bipartite_layer_serves_exactly(conv, typed, tmp_path, capsys):
    args = {"conv": conv, "devices": DEVICES, "hidden": 8, "classes": 2}
    result = typed_build(
        tmp_path, typed, "FraudHeteroConvOf", {**args, "metadata": metadata(typed)}
    )
    assert result.passed and result.worst_abs_diff <= 1e-5, (capsys.readouterr(), result)


# Layers with in-channels, which lazy (-1, -1) ones take from the first forward.
NO_IN_CHANNELS = ("GINConv", "CGConv", "EdgeConv", "SimpleConv", "WLConvContinuous")
LAZY = [c for c in BIPARTITE if c not in NO_IN_CHANNELS]


@pytest.mark.parametrize(
    ("conv", "lazy"), [*((c, False) for c in BIPARTITE), *((c, True) for c in LAZY)]
)
def test_to_hetero_over_a_bipartite_layer_serves_exactly(conv, lazy, typed, tmp_path, capsys):
    args = {"conv": conv, "devices": DEVICES, "hidden": 8, "classes": 2, "lazy": lazy}
    result = typed_build(
        tmp_path, typed, "FraudToHeteroOf", {**args, "metadata": metadata(typed)}, lazy
    )
    assert result.passed and result.worst_abs_diff <= 1e-5, (capsys.readouterr(), result)


def test_hgtconv_serves_exactly(typed, tmp_path):
    args = {"devices": DEVICES, "hidden": 8, "classes": 2, "metadata": metadata(typed)}
    result = typed_build(tmp_path, typed, "FraudHgt", args)
    assert result.passed and result.worst_abs_diff <= 1e-5, result


@pytest.mark.parametrize("conv", ["RGCNConv", "FastRGCNConv", "RGATConv", "HEATConv"])
def test_relational_layers_on_the_typed_graph_made_homogeneous_serve_exactly(conv, typed, tmp_path):
    args = {"conv": conv, "devices": DEVICES, "hidden": 8, "classes": 2}
    result = typed_build(tmp_path, typed, "FraudRelational", {**args, "metadata": metadata(typed)})
    assert result.passed and result.worst_abs_diff <= 1e-5, result


def cheb_build(tmp_path: Path, store: GraphStore, args: dict[str, Any], *extra: str) -> int:
    torch.manual_seed(0)
    return build(tmp_path, store, pyg_user_models.Cheb(**args), "Cheb", args, *extra)


def cheb_args(k: int, normalization: str | None, lambda_max: float | None) -> dict[str, Any]:
    return {
        "in_channels": FEATURES, "classes": CLASSES, "normalization": normalization,
        "lambda_max": lambda_max, "K": k,
    }  # fmt: skip


def out_hub(store: GraphStore) -> int:
    """The node of the largest out-degree (node 0, the in-hub, is another)."""
    return int(np.argmax(store.out_degree_rows(np.arange(store.num_nodes))))


def served_worst(engine: NodeClassificationEngine, ids: list, expected: torch.Tensor) -> float:
    """The largest difference from ``expected`` (a row per ID of ``ids``) of the answers to
    ``ids``, asked in one request."""
    [answer] = engine.handle([{"body": {"node_ids": ids}}])
    assert answer.status == 200, answer.body
    got = torch.tensor([p["probabilities"] for p in answer.body["predictions"]])
    return float((got - expected).abs().max())


@pytest.mark.parametrize("lambda_max", [None, 5.0])
@pytest.mark.parametrize("normalization", [None, "sym", "rw"])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_chebconv_serves_exactly_on_a_directed_graph(k, normalization, lambda_max, plain, tmp_path):
    """ChebConv(K) on a directed graph with self-loops, parallel edges, an in-hub and another
    out-hub: its Laplacian reads each node's full-graph out-degree (and, without normalisation
    nor lambda_max, the largest): exact asked alone, in one batch, and in the verification's."""
    hops = ("--num-hops", "0") if k == 1 else ()  # no propagation: PyG calls no message
    assert cheb_build(tmp_path, plain, cheb_args(k, normalization, lambda_max), *hops) == 0
    result = verified(tmp_path, plain)
    assert result.passed and result.worst_abs_diff <= 1e-5, result
    model, config = load_model(tmp_path / "model")
    assert config.num_layers == k - 1
    largest = plain.largest_out_degree()
    assert largest > int(plain.out_degree_rows(np.array([0]))[0])  # not the in-hub's
    assert config.max_degree == (largest if normalization is None else 0)
    nodes = [0, out_hub(plain), 7, 88, plain.num_nodes - 1]  # the last has no edges
    assert alone_worst(tmp_path / "model", plain, nodes) <= 1e-5
    x = torch.from_numpy(np.array(plain.features))
    with torch.no_grad():
        full = torch.softmax(model.module(x, torch.from_numpy(plain.edge_index())), -1)
    settings = ServingSettings(fanouts=(-1,) * config.num_layers)
    engine = NodeClassificationEngine.create(plain, model, settings, torch.device("cpu"), "1")
    assert served_worst(engine, plain.external_ids(np.array(nodes)), full[nodes]) <= 1e-5


def test_chebconv_with_edge_weights_is_refused_in_one_line(tmp_path, capsys):
    """Weighted out-degrees are not carried: a graph with one edge feature built with
    --edge-input edge_weight is refused naming --edge-input none, which then builds."""
    edges_dir = write_edge_feature_csv(tmp_path / "input")
    edges = pd.read_csv(edges_dir / "edges.csv").drop(columns=["timestamp"])
    edges.to_csv(edges_dir / "edges.csv", index=False)
    write_store(read_graph_dir(edges_dir), tmp_path / "store")
    store = open_store(tmp_path / "store")
    assert store.edge_feature_dim == 1
    args = {"in_channels": FEATURES, "out_channels": CLASSES, "K": 2}
    torch.manual_seed(0)
    torch.save(ChebConv(**args).state_dict(), tmp_path / "weights.pt")

    def built(edge_input: str) -> int:
        argv = [
            "--store", str(store.path), "--model-class", "torch_geometric.nn.ChebConv",
            "--model-args", json.dumps(args), "--weights", str(tmp_path / "weights.pt"),
            "--out", str(tmp_path / edge_input), "--edge-input", edge_input,
        ]  # fmt: skip
        return own_model.main(argv)

    assert built("edge_weight") == 1
    err = capsys.readouterr().err
    assert "ChebConv holds ChebConv, whose Laplacian would sum the edge weights" in err
    assert err.rstrip().endswith("build with --edge-input none") and "Traceback" not in err
    assert not (tmp_path / "edge_weight" / "model_config.json").exists()
    assert built("none") == 0


@pytest.mark.parametrize("lambda_max", [None, 5.0])
@pytest.mark.parametrize("normalization", [None, "sym", "rw"])
def test_chebconv_stays_exact_under_random_live_updates(normalization, lambda_max, tmp_path):
    """Before and after 80 random updates (self-loops, parallel edges, removals, new nodes)
    and the removal of the node of the largest out-degree, every node's answer, asked in
    batches and alone, is the model's forward on the updated graph."""
    store = edge_feature_store(tmp_path / "graph")
    assert cheb_build(tmp_path, store, cheb_args(3, normalization, lambda_max)) == 0
    model, _ = load_model(tmp_path / "model")
    live = LiveGraph(store, tmp_path / "updates.log")
    engine = NodeClassificationEngine.create(
        store, model, ServingSettings(fanouts=(-1, -1)), torch.device("cpu"), "1", live
    )

    def check() -> None:
        ids, expected = materialized_forward(live, model)
        for start in range(0, len(ids), 16):
            chunk = slice(start, start + 16)
            assert served_worst(engine, ids[chunk], expected[chunk]) <= 1e-5
        for i in (0, len(ids) // 2, len(ids) - 1):
            assert served_worst(engine, [ids[i]], expected[i : i + 1]) <= 1e-5

    check()
    rng, counter = random.Random(3), [0]
    for _ in range(80):
        live.update(UpdateRequest(random_update(rng, live, counter)))
    check()
    overlay = live.overlay
    [hub] = overlay.external_ids(np.array([out_hub_now(overlay)]))
    live.update(UpdateRequest([{"type": "remove_node", "id": hub}]))
    check()


def out_hub_now(overlay: Any) -> int:
    """The live node of the largest current out-degree."""
    nodes = np.array(
        [n for n in range(overlay.num_nodes) if n not in overlay.removed], dtype=np.int64
    )
    return int(nodes[np.argmax(overlay.out_degree_rows(nodes))])


@pytest.mark.parametrize(
    ("conv", "hops"),
    [
        ("TAGConv", 2), ("SSGConv", 2), ("ARMAConv", 2), ("GatedGraphConv", 2),
        ("MixHopConv", 2), ("AntiSymmetricConv", 2), ("GCN2Conv", 2), ("FAConv", 2),
    ],
)  # fmt: skip
def test_k_hop_layers_stay_exact(conv, hops, plain, tmp_path):
    args = {"conv": conv, "in_channels": FEATURES, "hidden": 8, "classes": CLASSES}
    torch.manual_seed(0)
    module = pyg_user_models.KHop(**args)
    assert build(tmp_path, plain, module, "KHop", args) == 0
    result = verified(tmp_path, plain)
    assert result.passed and result.worst_abs_diff <= 1e-5, result
    assert json.loads((tmp_path / "model" / "model_config.json").read_text())["num_layers"] == hops
    hub = int(np.argmax(plain.in_degree))
    assert alone_worst(tmp_path / "model", plain, [hub, 3, 50]) <= 1e-5


@pytest.mark.parametrize("normalization", [None, "sym", "rw"])
def test_a_precomputed_chebconv_archive_is_exact_live_and_cold(normalization, tmp_path):
    """--precompute stores ChebConv's outputs computed on in-neighbourhoods (in chunks of the
    directed graph) with the graph's out-degrees; after random live updates the outputs they
    reach are recomputed so (all of them where the largest out-degree moves), and a
    cold-start node is answered so on the augmented graph."""
    from model.precompute import open_precomputed, precompute, weights_digest

    store = edge_feature_store(tmp_path / "graph")
    assert cheb_build(tmp_path, store, cheb_args(3, normalization, None)) == 0
    model, _ = load_model(tmp_path / "model")
    rows = tmp_path / "precomputed"
    digest = weights_digest(tmp_path / "model" / "model.pt")
    precompute(model, store, rows, digest, chunk_edges=64, progress=False)
    result = verify(tmp_path / "model", store, ServingSettings(fanouts=(3, 3)), 1e-5, rows)
    assert result.passed and result.worst_abs_diff <= 1e-5, result
    live = LiveGraph(store, tmp_path / "updates.log")
    engine = NodeClassificationEngine.create(
        store,
        model,
        ServingSettings(fanouts=(-1, -1)),
        torch.device("cpu"),
        "1",
        live,
        precomputed=open_precomputed(rows, store, digest),
    )
    rng, counter = random.Random(11), [0]
    for _ in range(40):
        live.update(UpdateRequest(random_update(rng, live, counter)))
    largest = live.overlay.largest_out_degree()
    [hub] = live.overlay.external_ids(np.array([out_hub_now(live.overlay)]))
    live.update(UpdateRequest([{"type": "remove_node", "id": hub}]))
    assert live.overlay.largest_out_degree() < largest  # every output's scale moved
    ids, expected = materialized_forward(live, model)
    for start in range(0, len(ids), 16):
        chunk = slice(start, start + 16)
        assert served_worst(engine, ids[chunk], expected[chunk]) <= 1e-5

    neighbours = [i for i in ids[:30] if i != ids[0]]
    x_new = [0.3, -1.2, 0.8, 0.0, 0.5, -0.4][:FEATURES]
    body = {"new_node": {"x": x_new, "neighbors": neighbours, "direction": "both"}}
    [answer] = node_router(engine, "1").handle([{"body": body}])
    assert answer.status == 200, answer.body
    _, x, edge_index, _ = materialized_graph(live)
    n = len(ids)
    column = torch.tensor([ids.index(i) for i in neighbours])
    edge_index = torch.cat(
        [
            edge_index,
            torch.stack([column, torch.full_like(column, n)]),
            torch.stack([torch.full_like(column, n), column]),
        ],
        dim=1,
    )
    with torch.no_grad():
        new_row = model(torch.cat([x, torch.tensor([x_new])]), edge_index)[n]
    got = torch.tensor(answer.body["probabilities"])
    assert float((got - torch.softmax(new_row, -1)).abs().max()) <= 1e-5


@pytest.mark.parametrize("direction", ["in", "out", "both"])
@pytest.mark.parametrize("normalization", [None, "sym", "rw"])
def test_a_chebconv_cold_start_node_is_exact_on_a_directed_graph(
    normalization, direction, plain, tmp_path
):
    """A new node's answer is ChebConv's forward on the graph with it added: its out-edges
    count for it, its in-edges for its senders (the out-hub among them), and with more
    neighbours than the largest out-degree it becomes the largest (``out``, ``both``)."""
    assert cheb_build(tmp_path, plain, cheb_args(3, normalization, None)) == 0
    model, _ = load_model(tmp_path / "model")
    engine = NodeClassificationEngine.create(
        plain, model, ServingSettings(fanouts=(-1, -1)), torch.device("cpu"), "1"
    )
    largest = plain.largest_out_degree()
    neighbours = sorted({0, out_hub(plain), *range(5, 5 + largest + 3)})
    x_new = [0.3, -1.2, 0.8, 0.0, 0.5, -0.4][:FEATURES]
    ids = plain.external_ids(np.array(neighbours))
    body = {"new_node": {"x": x_new, "neighbors": ids, "direction": direction}}
    [answer] = node_router(engine, "1").handle([{"body": body}])
    assert answer.status == 200, answer.body
    n = plain.num_nodes
    column = torch.tensor(neighbours)
    into = torch.stack([column, torch.full_like(column, n)])
    out = torch.stack([torch.full_like(column, n), column])
    added = {"in": [into], "out": [out], "both": [into, out]}[direction]
    edge_index = torch.cat([torch.from_numpy(plain.edge_index()), *added], dim=1)
    x = torch.cat([torch.from_numpy(np.array(plain.features)), torch.tensor([x_new])])
    with torch.no_grad():
        expected = torch.softmax(model.module(x, edge_index)[n], -1)
    got = torch.tensor(answer.body["probabilities"])
    assert float((got - expected).abs().max()) <= 1e-5


def test_a_precomputed_chebconv_archive_recomputes_every_output_when_the_largest_moves(
    tmp_path,
):
    """Without normalisation nor lambda_max every output is scaled by the graph's largest
    out-degree: a new node whose out-edges raise it (far from most nodes of a sparse graph)
    re-marks every stored output, so each answer is the forward on the updated graph."""
    from graph_assets import generate_synthetic, open_store
    from model.precompute import open_precomputed, precompute, weights_digest

    generate_synthetic(400, 800, tmp_path / "graph", feature_dim=FEATURES, num_classes=CLASSES)
    store = open_store(tmp_path / "graph")
    assert cheb_build(tmp_path, store, cheb_args(3, None, None)) == 0
    model, _ = load_model(tmp_path / "model")
    digest = weights_digest(tmp_path / "model" / "model.pt")
    precompute(model, store, tmp_path / "p", digest, progress=False)
    live = LiveGraph(store, tmp_path / "updates.log")
    engine = NodeClassificationEngine.create(
        store,
        model,
        ServingSettings(fanouts=(-1, -1)),
        torch.device("cpu"),
        "1",
        live,
        precomputed=open_precomputed(tmp_path / "p", store, digest),
    )
    largest = store.largest_out_degree()
    fan = [{"type": "add_node", "id": 10_000, "x": [0.5] * FEATURES}]
    fan += [{"type": "add_edge", "src": 10_000, "dst": d} for d in range(largest + 2)]
    live.update(UpdateRequest(fan))
    assert live.overlay.largest_out_degree() == largest + 2
    ids, expected = materialized_forward(live, model)
    for start in range(0, len(ids), 64):
        chunk = slice(start, start + 64)
        assert served_worst(engine, ids[chunk], expected[chunk]) <= 1e-5
