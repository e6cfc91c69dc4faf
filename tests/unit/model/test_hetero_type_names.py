"""Type names torch's ModuleDict cannot hold (``items``, ``a.b``) and names with spaces: every
typed preset trains on them and serves exactly, and names it could hold keep their keys."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from archive_build import verify as verification
from graph_assets import GraphStore, open_store, write_store
from graph_assets.input.typed_input import read_graph
from handler.settings import ServingSettings
from model import __main__ as model_cli
from model.hetero_recipes import HeteroSpec, build_hetero_model, module_key
from tests.typed_graphs import node_recipe
from tests.unit.handler.test_explain import answers, engines

ARCHS = ["sage", "gat", "gcn", "gin", "rgcn", "hgt"]


def write_csv(file: Path, header: str, rows: list[str]) -> None:
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text("\n".join([header, *rows]) + "\n")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> GraphStore:
    """Users (``user name``, labelled), ``items`` and featureless ``a.b`` devices, with
    relations whose names hold a space and a dot."""
    root = tmp_path_factory.mktemp("type_names")
    rng = np.random.default_rng(0)
    write_csv(
        root / "graph/nodes/user name.csv",
        "id,f0,f1,label",
        [f"u{i},{rng.normal():.4f},{rng.normal():.4f},{i % 2}" for i in range(30)],
    )
    write_csv(
        root / "graph/nodes/items.csv",
        "id,price",
        [f"{i},{rng.normal():.4f}" for i in range(20)],
    )
    write_csv(root / "graph/nodes/a.b.csv", "id", [f"d{i}" for i in range(10)])
    write_csv(
        root / "graph/edges/items__bought by__user name.csv",
        "src,dst,amount",
        [f"{rng.integers(20)},u{rng.integers(30)},{rng.normal():.4f}" for _ in range(60)],
    )
    write_csv(
        root / "graph/edges/a.b__used.by__user name.csv",
        "src,dst",
        [f"d{rng.integers(10)},u{rng.integers(30)}" for _ in range(30)],
    )
    write_csv(
        root / "graph/edges/user name__likes__items.csv",
        "src,dst",
        [f"u{rng.integers(30)},{rng.integers(20)}" for _ in range(40)],
    )
    graph = read_graph(root / "graph", undirected=True)
    write_store(graph, root / "store")
    return open_store(root / "store")


@pytest.mark.parametrize("arch", ARCHS)
def test_a_typed_preset_trains_and_serves_exactly_on_any_type_names(
    store: GraphStore, tmp_path: Path, arch: str
) -> None:
    assert store.schema.node_type_names == ["user name", "a.b", "items"]
    model_dir = tmp_path / "model"
    train = ["train", "--store", str(store.path), "--arch", arch, "--out", str(model_dir)]
    assert model_cli.main([*train, "--epochs", "2", "--hidden-dim", "8", "--quiet"]) == 0
    for fanouts in ((-1, -1), (3, 2)):
        result = verification.verify(model_dir, store, ServingSettings(fanouts=fanouts), 1e-5)
        assert result.passed and result.worst_abs_diff <= 1e-5, (fanouts, result)


def test_names_torch_takes_keep_their_keys_and_the_rest_are_escaped() -> None:
    assert module_key("user") == "user" and module_key("user name") == "user name"
    assert module_key("a#b") == "a#b" and module_key("part-of") == "part-of"
    assert module_key("a.b") == "t__612e62"
    assert module_key("items") == "t__6974656d73"
    assert module_key("training") == "t__747261696e696e67"


def spec_of(*node_types: str) -> HeteroSpec:
    first, second = node_types
    return HeteroSpec(
        node_types=node_types,
        edge_types=((second, "bought", first), (first, "likes", second)),
        in_dims={first: 2, second: 1},
        target=first,
        num_classes=2,
        hidden_dim=4,
        heads=2,
        num_layers=2,
    )


def test_state_dict_keys_of_names_torch_takes_are_the_names() -> None:
    """What archives built before hold: the type's name in every key, unescaped; HeteroConv
    keeps the graph's edge types as its keys (PyG's own escaping), as explanations look
    relations up by them."""
    sage = set(build_hetero_model("sage", spec_of("user", "items")).state_dict())
    assert {"encoder.lins.user.weight", "roots.0.user.weight"} <= sage
    assert {"encoder.lins.t__6974656d73.weight", "roots.0.t__6974656d73.weight"} <= sage
    assert "convs.0.convs.<items___bought___user>.lin_l.weight" in sage
    hgt = set(build_hetero_model("hgt", spec_of("user", "a.b")).state_dict())
    assert {"convs.0.kqv_lin.lins.user.weight", "convs.0.kqv_lin.lins.t__612e62.weight"} <= hgt
    assert "encoder.lins.user.weight" in set(
        build_hetero_model("rgcn", spec_of("user", "b")).state_dict()
    )


def test_a_hash_in_a_type_name_is_refused_where_heteroconv_misreads_it() -> None:
    with pytest.raises(ValueError) as refused:
        build_hetero_model("gat", spec_of("user", "a#b"))
    assert str(refused.value) == (
        "--arch gat cannot train on the name 'a#b': PyG's HeteroConv reads '#' in a type or "
        "relation name back as '.'; rename it, or use --arch rgcn or hgt"
    )
    relations = (("b", "paid#cash", "user"), ("user", "likes", "b"))
    with pytest.raises(ValueError, match="cannot train on the name 'paid#cash'"):
        build_hetero_model("sage", dataclasses.replace(spec_of("user", "b"), edge_types=relations))
    assert (
        "encoder.lins.a#b.weight" in build_hetero_model("rgcn", spec_of("user", "a#b")).state_dict()
    )


@pytest.mark.parametrize("arch", ["sage", "hgt"])
def test_explanations_find_each_relations_layer_on_any_type_names(
    store: GraphStore, arch: str
) -> None:
    """Each relation's edge mask reaches its own layer (HeteroConv's keys are the graph's
    edge types): the explanation answers as the engine does and names stored relations."""
    served, explainer = engines(store, node_recipe(store, arch, hidden=8), [-1, -1])
    users = store.schema.target_type.num_nodes
    [busiest] = store.external_ids(np.array([int(np.argmax(store.in_degree[:users]))]))
    [(status, body)] = answers(explainer, [{"node_type": "user name", "node_id": busiest}])
    assert status == 200, body
    [(_, predicted)] = answers(served, [{"node_id": busiest}])
    assert body["probabilities"] == predicted["probabilities"]
    edge_types = {edge["edge_type"] for edge in body["explanation"]["edges"]}
    assert edge_types and edge_types <= set(store.schema.edge_type_names)
