"""Users' own models as PyG's documentation writes them, packaged by archive_build.own_model
and verified by archive_build.verify against their own full-graph forward (<= 1e-5 with full
neighbourhoods): lazy in-channels (``to_hetero`` over ``SAGEConv((-1, -1))``,
``Linear(-1, ...)``), a model without message passing at ``--num-hops 0``, tensor arguments
given as lists, and typed models: HeteroConv and ``to_hetero`` over every bipartite layer,
HGTConv and the relational layers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch_geometric.nn.models import PNA

from archive_build import own_model
from archive_build.verify import Verification, verify
from graph_assets import GraphStore, open_store, read_graph_dir, write_store
from handler.settings import ServingSettings
from handler.tasks.node.engine import NodeClassificationEngine
from handler.tasks.node.task import node_router
from model.chebconv import check_chebconv
from model.export import load_model
from model.served_hetero import small_typed_input
from model.typed_graph import whole_graph_input
from model.user_model import tensor_parameters
from tests.edge_graph import CLASSES, FEATURES, edge_feature_store, write_edge_feature_csv
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


@pytest.fixture(scope="module")
def undirected(tmp_path_factory: pytest.TempPathFactory) -> GraphStore:
    """The edge graph with every edge's reverse (``--undirected``): self-loops, parallel
    edges and a hub, each node with as many out- as in-edges."""
    root = tmp_path_factory.mktemp("pyg_undirected")
    write_store(read_graph_dir(write_edge_feature_csv(root / "input"), undirected=True), root / "s")
    return open_store(root / "s")


def cheb_build(tmp_path: Path, store: GraphStore, args: dict[str, Any], *extra: str) -> int:
    torch.manual_seed(0)
    return build(tmp_path, store, pyg_user_models.Cheb(**args), "Cheb", args, *extra)


@pytest.mark.parametrize("lambda_max", [None, 2.0, 5.0])
@pytest.mark.parametrize("normalization", [None, "sym", "rw"])
def test_chebconv_serves_exactly_with_the_graphs_degrees(
    normalization, lambda_max, undirected, tmp_path
):
    """ChebConv(K=3), 2 hops: its Laplacian reads each node's degree (and, without
    normalisation nor lambda_max, the largest): exact on single requests, whatever else is
    in the batch, as on the verification's batches."""
    args = {
        "in_channels": FEATURES, "classes": CLASSES, "normalization": normalization,
        "lambda_max": lambda_max,
    }  # fmt: skip
    assert cheb_build(tmp_path, undirected, args) == 0
    result = verified(tmp_path, undirected)
    assert result.passed and result.worst_abs_diff <= 1e-5, result
    _, config = load_model(tmp_path / "model")
    assert config.num_layers == 2
    hub = int(np.argmax(undirected.in_degree))
    assert config.max_degree == (
        int(undirected.degree_rows(np.array([hub]))[0]) if normalization is None else 0
    )
    assert alone_worst(tmp_path / "model", undirected, [hub, 7, 88]) <= 1e-5


def test_chebconv_is_refused_where_the_ego_graph_cannot_carry_its_degrees(
    plain, undirected, tmp_path, capsys
):
    args = {"in_channels": FEATURES, "classes": CLASSES, "normalization": "sym", "lambda_max": None}
    assert cheb_build(tmp_path, plain, args) == 1
    err = capsys.readouterr().err
    assert "holds ChebConv, which normalises by each node's out-degree" in err
    assert "build the graph with --undirected" in err and "Traceback" not in err
    module = pyg_user_models.Cheb(**args)
    degrees = np.asarray(undirected.in_degree)
    assert check_chebconv(module, degrees, np.asarray(undirected.out_degree), False) is None
    with pytest.raises(ValueError, match=r"sum the edge weights .* --edge-input none"):
        check_chebconv(module, degrees, degrees, edge_weight=True)


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


def test_a_precomputed_chebconv_archive_is_exact(undirected, tmp_path):
    """--precompute stores ChebConv's rows from in-neighbourhoods, with the graph's degrees."""
    from model.precompute import precompute, weights_digest

    args = {"in_channels": FEATURES, "classes": CLASSES, "normalization": None, "lambda_max": None}
    assert cheb_build(tmp_path, undirected, args) == 0
    model_dir = tmp_path / "model"
    model, _ = load_model(model_dir)
    rows = tmp_path / "precomputed"
    precompute(model, undirected, rows, weights_digest(model_dir / "model.pt"), progress=False)
    result = verify(model_dir, undirected, ServingSettings(fanouts=(3, 3)), 1e-5, rows)
    assert result.passed and result.worst_abs_diff <= 1e-5, result


@pytest.mark.parametrize("normalization", [None, "sym", "rw"])
def test_a_chebconv_cold_start_node_with_edges_both_ways_is_exact(
    normalization, undirected, tmp_path
):
    """A new node linked both ways keeps every node's out-degree equal to its in-degree, so
    its answer is ChebConv's forward on the graph with it added (its neighbours' degrees
    grown by one)."""
    args = {
        "in_channels": FEATURES, "classes": CLASSES, "normalization": normalization,
        "lambda_max": None,
    }  # fmt: skip
    assert cheb_build(tmp_path, undirected, args) == 0
    model, _ = load_model(tmp_path / "model")
    engine = NodeClassificationEngine.create(
        undirected, model, ServingSettings(fanouts=(-1, -1)), torch.device("cpu"), "1"
    )
    hub = int(np.argmax(undirected.in_degree))
    neighbours = sorted({hub, 5, 40})
    x_new = [0.3, -1.2, 0.8, 0.0, 0.5, -0.4][:FEATURES]
    ids = undirected.external_ids(np.array(neighbours))
    body = {"new_node": {"x": x_new, "neighbors": ids, "direction": "both"}}
    [answer] = node_router(engine, "1").handle([{"body": body}])
    assert answer.status == 200, answer.body
    n = undirected.num_nodes
    column = torch.tensor(neighbours)
    edge_index = torch.cat(
        [
            torch.from_numpy(undirected.edge_index()),
            torch.stack([column, torch.full_like(column, n)]),
            torch.stack([torch.full_like(column, n), column]),
        ],
        dim=1,
    )
    x = torch.cat([torch.from_numpy(np.array(undirected.features)), torch.tensor([x_new])])
    with torch.no_grad():
        expected = torch.softmax(model.module(x, edge_index)[n], -1)
    got = torch.tensor(answer.body["probabilities"])
    assert float((got - expected).abs().max()) <= 1e-5
