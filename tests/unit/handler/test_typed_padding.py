"""A typed ego-graph padded per node type and relation keeps the sampler's layout for every
type and relation, and the padded forward (run eager on the CPU) gives every typed model the
seeds' outputs of the ego-graph it pads."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graph_assets import GraphStore
from handler.gpu.padding import PADDING_NODE, RowTypes, bucket, pad_subgraph
from handler.graph.ego import EgoGraphs
from handler.graph.typed_ego import pad_typed, typed_answer
from handler.sampling.sampler import SampledSubgraph
from handler.settings import ServingSettings
from model.typed_rows import gather_typed
from tests.typed_graphs import fraud_store, hetero_conv_model, node_recipe

from .conftest import random_model

CPU = torch.device("cpu")
SEEDS = np.array([0, 3, 9, 17, 40, 75])
ARCHS = ["sage", "gat", "gcn", "gin", "rgcn", "hgt", "user"]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> GraphStore:
    return fraud_store(tmp_path_factory.mktemp("typed_padding") / "store", 120, 20, 50, 400, 3)


def typed_model(store: GraphStore, arch: str) -> torch.nn.Module:
    return hetero_conv_model(store) if arch == "user" else node_recipe(store, arch)


def sampled(
    store: GraphStore, model: torch.nn.Module, fanouts
) -> tuple[EgoGraphs, SampledSubgraph]:
    settings = ServingSettings(fanouts=tuple(fanouts))
    ego = EgoGraphs.create(store, model, settings, CPU)
    return ego, ego.sample(SEEDS)[1]


def padded_rows(ego: EgoGraphs, sub: SampledSubgraph) -> torch.Tensor:
    """The seeds' rows of the typed model on ``sub`` padded, run eager (the CPU's forward)."""
    view = ego.view()
    padded = pad_typed(ego.store, view, sub)
    new = padded.sub
    assert padded.types is not None
    typed = gather_typed(
        ego.store.schema,
        view,
        new.node.numpy(),
        new.edge_index,
        new.edge.numpy(),
        CPU,
        relation=padded.types.edge_relation,
        padding_edges=padded.padding_edges,
    )
    inputs = typed.layout.inputs(
        typed.features, typed.n_id, typed.edge_features, new.level_sizes, new.edge_index
    )
    with torch.inference_mode():
        return ego.model(inputs)[: new.num_seeds]


@pytest.mark.parametrize("fanouts", [[3, 3], [-1, -1]])
def test_each_type_and_relation_is_padded_in_hop_order(store, fanouts):
    ego, sub = sampled(store, node_recipe(store, "gcn"), fanouts)  # gcn: a boundary level
    assert sub.boundary
    view = ego.view()
    padded = pad_typed(store, view, sub)
    types, new = padded.types, padded.sub
    assert types is not None and new.num_seeds == sub.num_seeds
    old_node, node_now = sub.node.numpy(), padded.sub.node.numpy()
    old_type = np.where(old_node >= 0, view.types_of(np.maximum(old_node, 0)), -1 - old_node)
    old_starts, new_starts = np.cumsum([0, *sub.level_sizes]), np.cumsum([0, *new.level_sizes])
    num_types = len(store.schema.node_types)
    for level, size in enumerate(sub.level_sizes):
        rows = slice(new_starts[level], new_starts[level + 1])
        node, kind = new.node[rows].numpy(), types.row_type[rows]
        assert np.array_equal(node[:size], sub.node[old_starts[level] : old_starts[level + 1]])
        padding = node[size:]
        assert (padding < 0).all() and np.array_equal(padding, PADDING_NODE - kind[size:])
        assert (np.diff(kind[size:]) >= 0).all()  # padding rows type by type
        for t in range(num_types):
            real = int((old_type[old_starts[level] : old_starts[level + 1]] == t).sum())
            assert padded.type_rows[level][t] == bucket(real) == int((kind == t).sum())
    # A row's type is the one its node says (the gather reads it so), and every edge joins
    # rows of its relation's types; padding edges only padding rows.
    assert np.array_equal(
        types.row_type,
        np.where(node_now >= 0, view.types_of(np.maximum(node_now, 0)), -1 - node_now),
    )
    src, dst = new.edge_index.numpy()
    ends = types.relation_ends[types.edge_relation]
    assert np.array_equal(types.row_type[src], ends[:, 0])
    assert np.array_equal(types.row_type[dst], ends[:, 1])
    padding_edge = padded.padding_edges
    assert padding_edge is not None and np.array_equal(padding_edge, new.edge.numpy() < 0)
    assert (new.node[src[padding_edge]] < 0).all() and (new.node[dst[padding_edge]] < 0).all()
    assert int((~padding_edge).sum()) == sub.num_edges
    assert sum(padded.hop_edges) == new.num_edges
    assert padded.hop_edges == tuple(sum(hop) for hop in padded.relation_edges)
    # Edges stay grouped by their destination's hop, real ones before padding in each hop.
    hop = np.searchsorted(new_starts[1:], dst, side="right")
    assert (np.diff(hop) >= 0).all()
    for h in range(len(padded.hop_edges)):
        assert (np.diff(padding_edge[hop == h].astype(int)) >= 0).all()


def test_a_one_type_graph_is_the_one_type_case_of_the_typed_padding(int_store):
    """Padding with every row of type 0 and every edge of relation 0 lays out the rows and
    edges as the one-type padding does (only a padding edge's ID differs: -1 for typed)."""
    settings = ServingSettings(fanouts=(3, 3))
    ego = EgoGraphs.create(int_store, random_model(int_store, "sage"), settings, CPU)
    sub = ego.sample(SEEDS)[1]
    plain = pad_subgraph(sub)
    types = RowTypes(
        row_type=np.zeros(sub.num_nodes, dtype=np.int64),
        edge_relation=np.zeros(sub.num_edges, dtype=np.int64),
        relation_ends=np.zeros((1, 2), dtype=np.int64),
        num_types=1,
    )
    typed = pad_subgraph(sub, types=types)
    assert plain.types is None and typed.types is not None
    assert typed.sub.level_sizes == plain.sub.level_sizes and typed.hop_edges == plain.hop_edges
    assert torch.equal(typed.sub.node, plain.sub.node)
    assert torch.equal(typed.sub.edge_index, plain.sub.edge_index)
    real = typed.sub.edge >= 0
    assert torch.equal(typed.sub.edge[real], plain.sub.edge[real])
    assert plain.type_rows == tuple((size,) for size in plain.sub.level_sizes)


@pytest.mark.parametrize("fanouts", [[3, 3], [-1, -1]])
@pytest.mark.parametrize("arch", ARCHS)
def test_padding_leaves_every_typed_models_seed_outputs(store, arch, fanouts):
    """The padded forward on the CPU equals the eager typed answer of the unpadded ego-graph
    (recipes trimmed per hop, gcn with its boundary, rgcn and hgt whole, a user's HeteroConv
    stack with edge features and learned embeddings)."""
    ego, sub = sampled(store, typed_model(store, arch), fanouts)
    with torch.inference_mode():
        expected, _ = typed_answer(store, ego.view(), ego.model, sub, CPU)
    got = padded_rows(ego, sub)
    assert torch.allclose(got, expected, atol=1e-5)
    assert torch.equal(got.argmax(dim=1), expected.argmax(dim=1))


def test_padding_edges_get_zero_edge_features(store):
    ego, sub = sampled(store, hetero_conv_model(store), [3, 3])
    view = ego.view()
    padded = pad_typed(store, view, sub)
    assert padded.types is not None and padded.padding_edges is not None
    typed = gather_typed(
        store.schema,
        view,
        padded.sub.node.numpy(),
        padded.sub.edge_index,
        padded.sub.edge.numpy(),
        CPU,
        relation=padded.types.edge_relation,
        padding_edges=padded.padding_edges,
    )
    featured = [r.edge_type.triple for r in store.schema.relations if r.edge_feature_dim]
    assert featured
    for triple in featured:
        positions = typed.layout.edges[triple].numpy()
        ids, padding = padded.sub.edge.numpy()[positions], padded.padding_edges[positions]
        attr = typed.edge_features[triple]
        assert padding.any() and (~padding).any()
        assert (attr[torch.from_numpy(padding)] == 0).all()
        real = torch.from_numpy(view.edge_feature_rows(ids[~padding]))
        assert torch.equal(attr[torch.from_numpy(~padding)], real)
