"""A seed's answer on its full-neighbourhood ego-graph equals the full-graph forward, outputs
and embeddings, on a graph of one type and on a graph of several: the property the server's
exactness rests on (design §5). On one type the ego-graph is the (node, hop) tree with the
full-graph in-degree of every row; on several it is laid out as the sampler lays it out, with
the boundary hop where the model asks for it. Every recipe of both, and the user's
``to_hetero`` and ``HeteroConv`` models."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import pytest
import torch
from torch_geometric.data import HeteroData
from torch_geometric.nn import GATConv, GCNConv, GINEConv, HeteroConv, SAGEConv, to_hetero
from torch_geometric.nn.dense import Linear
from torch_geometric.nn.models import MLP

from model import build_model
from model.hetero_recipes import HeteroArch, HeteroSpec, build_hetero_model
from model.served_hetero import HeteroNodeModel, UserHeteroModel
from model.typed_batch import inputs_from_hetero_data
from tests.unit.model.hetero_graphs import (
    COUNTS,
    EDGE_WIDTHS,
    FOLLOWS,
    RELATIONS,
    SEEDS,
    SOURCE_ONLY_RELATIONS,
    TARGET,
    WIDTHS,
    answer_on_ego,
    ego_graph,
    random_hetero_graph,
)

from .conftest import Graph

TOLERANCE = 1e-5
ONE_TYPE, TYPED = "one-type", "typed"
ARCHS = {ONE_TYPE: ["gcn", "sage", "gat", "gin"], TYPED: [arch.value for arch in HeteroArch]}
LAYERS = {ONE_TYPE: [2, 3], TYPED: [1, 2, 3]}
RELATION_SETS = {"all": RELATIONS, "src-only": SOURCE_ONLY_RELATIONS}


class Gaps(NamedTuple):
    """Max |ego-graph answer - full-graph answer| over the seeds: outputs, embeddings (None:
    not compared)."""

    output: float
    embedding: float | None


@dataclass(frozen=True)
class Case:
    """A seeded recipe of ``arch`` with ``num_layers`` layers on a schema's random graph (the
    typed graph with the relation set ``relations``)."""

    schema: str
    arch: str
    num_layers: int = 2
    relations: str = "all"

    @property
    def id(self) -> str:
        typed = f"-{self.relations}" if self.schema == TYPED else ""
        return f"{self.schema}-{self.arch}-{self.num_layers}layers{typed}"


def ego_tree(edge_index: torch.Tensor, num_nodes: int, seed: int, hops: int):
    """The (node, hop) tree of ``seed``: level d+1 = in-neighbours of level d, deduplicated
    within a level; edge (u, d+1) -> (v, d) for each in-neighbour u of v. Returns the node of
    every row and the local edge_index; row 0 is the seed."""
    in_neighbours: list[list[int]] = [[] for _ in range(num_nodes)]
    for src, dst in edge_index.t().tolist():
        in_neighbours[dst].append(src)
    rows = [seed]
    level = {seed: 0}
    src_rows: list[int] = []
    dst_rows: list[int] = []
    for _ in range(hops):
        next_level: dict[int, int] = {}
        for node, row in level.items():
            for u in in_neighbours[node]:
                if u not in next_level:
                    next_level[u] = len(rows)
                    rows.append(u)
                src_rows.append(next_level[u])
                dst_rows.append(row)
        level = next_level
    return torch.tensor(rows), torch.tensor([src_rows, dst_rows], dtype=torch.long).view(2, -1)


def in_degree(edge_index: torch.Tensor, num_nodes: int) -> torch.Tensor:
    return torch.bincount(edge_index[1], minlength=num_nodes)


def one_type_gaps(model: torch.nn.Module, graph: Graph, hops: int, full_degrees: bool) -> Gaps:
    """Every node as the seed of its ``hops``-hop tree, its rows given the full graph's
    in-degrees (``full_degrees``) or left to count the tree's."""
    num_nodes = graph.x.size(0)
    degree = in_degree(graph.edge_index, num_nodes)
    with torch.no_grad():
        full, full_embedding = model.forward_with_embedding(graph.x, graph.edge_index)
        ego, ego_embedding = [], []
        for seed in range(num_nodes):
            nodes, sub_edges = ego_tree(graph.edge_index, num_nodes, seed, hops)
            sub_degree = degree[nodes] if full_degrees else None
            out, embedding = model.forward_with_embedding(graph.x[nodes], sub_edges, sub_degree)
            ego.append(out[0])
            ego_embedding.append(embedding[0])
    output = (torch.stack(ego).softmax(dim=-1) - full.softmax(dim=-1)).abs().max().item()
    return Gaps(output, (torch.stack(ego_embedding) - full_embedding).abs().max().item())


def spec_for(data: HeteroData, num_layers: int) -> HeteroSpec:
    node_types, edge_types = data.metadata()
    return HeteroSpec(
        node_types=tuple(node_types),
        edge_types=tuple(edge_types),
        in_dims=WIDTHS,
        num_nodes={"device": COUNTS["device"]},
        edge_dims={key: width for key, width in EDGE_WIDTHS.items() if key in edge_types},
        target=TARGET,
        num_classes=3,
        hidden_dim=16,
        num_layers=num_layers,
    )


def typed_gaps(
    model: HeteroNodeModel, data: HeteroData, hops: int, boundary: bool, embedding: bool = True
) -> Gaps:
    """The users ``SEEDS`` on their ``hops``-hop ego-graph, with or without the boundary hop
    (and their embeddings with ``embedding``)."""
    model.eval()
    inputs = inputs_from_hetero_data(data)
    with torch.no_grad():
        full, full_embedding = (
            model.forward_with_embedding(inputs) if embedding else (model(inputs), None)
        )
        ego, ego_embedding = answer_on_ego(
            model, data, ego_graph(data, SEEDS, hops, boundary), embedding=embedding
        )
    output = (ego - full[SEEDS]).abs().max().item()
    if full_embedding is None or ego_embedding is None:
        return Gaps(output, None)
    return Gaps(output, (ego_embedding - full_embedding[SEEDS]).abs().max().item())


def gaps(
    case: Case,
    small_graph: Graph,
    hops: int,
    full_degrees: bool | None = None,
    embedding: bool = True,
) -> Gaps:
    """``case``'s model on ego-graphs of ``hops`` hops whose rows carry the full graph's
    in-degrees (one type: ``degree``; typed: the boundary hop) always (True), never (False),
    or as the server gives them (None: on one type always, typed where the model asks).
    ``embedding``: compare the typed embeddings too (one type: always compared)."""
    if case.schema == ONE_TYPE:
        torch.manual_seed(0)
        config = {"arch": case.arch, "in_dim": 6, "out_dim": 3, "hidden_dim": 16}
        model = build_model({**config, "num_layers": case.num_layers}).eval()
        return one_type_gaps(model, small_graph, hops, full_degrees is not False)
    data = random_hetero_graph(seed=1, relations=RELATION_SETS[case.relations])
    torch.manual_seed(0)
    typed = build_hetero_model(case.arch, spec_for(data, case.num_layers))
    asked = typed.serving_needs.boundary_degrees
    boundary = asked if full_degrees is None else full_degrees
    return typed_gaps(typed, data, hops, boundary, embedding)


def cases(*found: Case) -> list:
    """``found`` as pytest parameters named by their ids."""
    return [pytest.param(case, id=case.id) for case in found]


EXACT = cases(
    *(Case(ONE_TYPE, arch, layers) for arch in ARCHS[ONE_TYPE] for layers in LAYERS[ONE_TYPE]),
    *(
        Case(TYPED, arch, layers, relations)
        for arch in ARCHS[TYPED]
        for layers in LAYERS[TYPED]
        for relations in RELATION_SETS
    ),
)


@pytest.mark.parametrize("case", EXACT)
def test_ego_graph_answer_equals_full_graph_answer(small_graph: Graph, case: Case) -> None:
    found = gaps(case, small_graph, hops=case.num_layers)
    assert found.embedding is not None
    assert found.output <= TOLERANCE and found.embedding <= TOLERANCE, found


@pytest.mark.parametrize("schema", [ONE_TYPE, TYPED])
def test_gcn_needs_full_graph_degrees(small_graph: Graph, schema: str) -> None:
    """Without them GCN normalises with the ego-graph's degrees, which its deepest hop
    truncates (one type: no ``degree``; typed: no boundary hop)."""
    found = gaps(Case(schema, "gcn"), small_graph, hops=2, full_degrees=False, embedding=False)
    assert found.output > 1e-3


@pytest.mark.parametrize(
    "case", cases(*(Case(schema, arch) for schema in ARCHS for arch in ARCHS[schema]))
)
def test_one_hop_too_few_changes_answers(small_graph: Graph, case: Case) -> None:
    """The comparison is sensitive: an ego-graph one hop short of the layers is not exact."""
    found = gaps(case, small_graph, hops=1, full_degrees=True, embedding=False)
    assert found.output > 1e-3


# One type only: the reference tree itself.


def test_ego_tree_has_rows_per_hop():
    """A node reached at two hops appears twice; isolated seeds are alone."""
    edge_index = torch.tensor([[1, 2, 1], [0, 1, 2]])
    nodes, sub_edges = ego_tree(edge_index, 4, seed=0, hops=2)
    assert nodes.tolist() == [0, 1, 2]
    assert sub_edges.tolist() == [[1, 2], [0, 1]]
    nodes, sub_edges = ego_tree(edge_index, 4, seed=1, hops=2)
    assert nodes.tolist() == [1, 2, 1]
    assert sub_edges.tolist() == [[1, 2], [0, 1]]
    nodes, sub_edges = ego_tree(edge_index, 4, seed=3, hops=2)
    assert nodes.tolist() == [3] and sub_edges.shape == (2, 0)


# Several types only: which recipes ask for the boundary, and the user's own models.


def test_only_gcn_needs_boundary_degrees():
    data = random_hetero_graph()
    needs = {
        arch: build_hetero_model(arch, spec_for(data, 2)).serving_needs.boundary_degrees
        for arch in HeteroArch
    }
    assert needs == {arch: arch is HeteroArch.GCN for arch in HeteroArch}


class _SmallGNN(torch.nn.Module):
    """A user's homogeneous model, made heterogeneous with ``to_hetero``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = SAGEConv((-1, -1), 16)
        self.conv2 = SAGEConv((-1, -1), 3)

    def forward(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


class _ToHeteroUserModel(torch.nn.Module):
    """PyG's pattern for a featureless type: an embedding indexed by ``n_id``."""

    def __init__(self, metadata) -> None:
        super().__init__()
        self.device = torch.nn.Embedding(COUNTS["device"], 4)
        self.gnn = to_hetero(_SmallGNN(), metadata, aggr="sum")

    def forward(self, x_dict, edge_index_dict, n_id_dict):
        x_dict = {**x_dict, "device": self.device(n_id_dict["device"])}
        return self.gnn(x_dict, edge_index_dict)


class _HeteroConvUserModel(torch.nn.Module):
    """A ``HeteroConv`` stack reading ``edge_attr_dict`` (GATConv and GINEConv with edge_dim on
    the relations with edge features) after a Linear per type."""

    def __init__(self, edge_types, gcn_on_follows: bool = False) -> None:
        super().__init__()
        self.gcn_on_follows = gcn_on_follows
        self.lins = torch.nn.ModuleDict({"user": Linear(-1, 16), "merchant": Linear(-1, 16)})
        self.device = torch.nn.Embedding(COUNTS["device"], 16)
        self.convs = torch.nn.ModuleList()
        for out in (16, 3):
            convs = {}
            for key in edge_types:
                if key == FOLLOWS:
                    convs[key] = (
                        GCNConv(16, out, add_self_loops=False)
                        if gcn_on_follows
                        else GATConv(16, out, add_self_loops=False, edge_dim=2)
                    )
                elif key in EDGE_WIDTHS:
                    convs[key] = GINEConv(MLP([16, 16, out], norm=None), edge_dim=2, train_eps=True)
                else:
                    convs[key] = SAGEConv(16, out)
            self.convs.append(HeteroConv(convs, aggr="sum"))

    def forward(self, x_dict, edge_index_dict, edge_attr_dict, n_id_dict):
        x_dict = {key: lin(x_dict[key]) for key, lin in self.lins.items()}
        x_dict["device"] = self.device(n_id_dict["device"])
        if self.gcn_on_follows:  # GCNConv takes no edge_attr
            edge_attr_dict = {k: v for k, v in edge_attr_dict.items() if k != FOLLOWS}
        for i, conv in enumerate(self.convs):
            out = conv(x_dict, edge_index_dict, edge_attr_dict=edge_attr_dict)
            x_dict = {**x_dict, **{k: v.relu() if i == 0 else v for k, v in out.items()}}
        return x_dict


def _initialised(module: torch.nn.Module, data: HeteroData) -> torch.nn.Module:
    """Lazy layers get their shapes from one forward on the whole graph."""
    with torch.no_grad():
        UserHeteroModel(module, TARGET)(inputs_from_hetero_data(data))
    return module


def test_user_to_hetero_model_is_exact():
    data = random_hetero_graph(seed=2)
    torch.manual_seed(0)
    module = _initialised(_ToHeteroUserModel(data.metadata()), data)
    for relation in ("user__follows__user", "merchant__sells_to__user"):
        model = UserHeteroModel(module, TARGET, embedding=f"gnn.conv2.{relation}")
        assert not model.serving_needs.boundary_degrees
        found = typed_gaps(model, data, hops=2, boundary=False)
        assert found.embedding is not None and max(found) <= TOLERANCE, found


def test_user_hetero_conv_model_reads_edge_features_exactly():
    data = random_hetero_graph(seed=3)
    torch.manual_seed(0)
    module = _initialised(_HeteroConvUserModel(data.edge_types), data)
    model = UserHeteroModel(module, TARGET, embedding="convs.1")
    assert model.serving_needs.edge_input.value == "edge_attr"
    assert not model.serving_needs.boundary_degrees
    found = typed_gaps(model, data, hops=2, boundary=False)
    assert found.embedding is not None and max(found) <= TOLERANCE, found
    unused = {key: value * 0 for key, value in data.edge_attr_dict.items()}
    zeroed = data.clone()
    for key, value in unused.items():
        zeroed[key].edge_attr = value
    with torch.no_grad():
        assert not torch.allclose(
            model(inputs_from_hetero_data(data)), model(inputs_from_hetero_data(zeroed))
        )


def test_user_gcn_model_asks_for_the_boundary_and_is_exact_with_it():
    data = random_hetero_graph(seed=4)
    torch.manual_seed(0)
    module = _initialised(_HeteroConvUserModel(data.edge_types, gcn_on_follows=True), data)
    model = UserHeteroModel(module, TARGET)
    assert model.serving_needs.boundary_degrees
    assert typed_gaps(model, data, hops=2, boundary=True, embedding=False).output <= TOLERANCE
    assert typed_gaps(model, data, hops=2, boundary=False, embedding=False).output > 1e-4
