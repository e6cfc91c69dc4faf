"""A padded ego-graph keeps the sampler's layout and gives every model the seeds' outputs of
the ego-graph it pads."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch_geometric.nn.models import GAT, GCN

from handler.gpu.padding import PADDING_NODE, bucket, pad_subgraph
from handler.graph.ego import EgoGraphs
from handler.sampling.sampler import SampledSubgraph
from handler.settings import ServingSettings
from model.served import UserNodeModel
from model.user_model import UserModelConfig
from tests.edge_graph import CLASSES, EDGE_DIM, FEATURES, edge_feature_store
from tests.unit.archive_build import user_models

from .conftest import random_model

SEEDS = np.array([0, 3, 9, 17, 40, 75])


def sampled(store, model, fanouts) -> tuple[EgoGraphs, SampledSubgraph]:
    settings = ServingSettings(fanouts=tuple(fanouts))
    ego = EgoGraphs.create(store, model, settings, torch.device("cpu"))
    return ego, ego.sample(SEEDS)[1]


def seed_rows(ego: EgoGraphs, sub: SampledSubgraph, hop_edges=None) -> torch.Tensor:
    """The model's rows of the seeds, inputs gathered as the node engine gathers them."""
    x, degree = ego.gather(sub.node)
    edge_attr = ego.edge_features(sub.edge)
    with torch.inference_mode():
        rows = ego.model(
            x,
            sub.edge_index,
            degree=degree,
            level_sizes=sub.level_sizes,
            edge_attr=edge_attr,
            hop_edges=hop_edges,
        )
    return rows[: sub.num_seeds]


def assert_padding_changes_nothing(ego: EgoGraphs, sub: SampledSubgraph) -> None:
    padded = pad_subgraph(sub)
    expected = seed_rows(ego, sub)
    assert torch.allclose(seed_rows(ego, padded.sub, padded.hop_edges), expected, atol=1e-6)
    assert torch.allclose(seed_rows(ego, padded.sub), expected, atol=1e-6)  # counted by PyG


def test_buckets_grow_by_a_quarter_and_always_leave_a_padding_row():
    sizes = [bucket(n) for n in range(0, 5000)]
    assert sizes[:9] == [8] * 8 + [10]
    assert all(size > n for n, size in enumerate(sizes))
    assert all(size <= max(8, 1.25 * (n + 1) + 1) for n, size in enumerate(sizes))
    assert len(set(sizes)) < 35  # few sizes: few captured graphs
    assert bucket(5, growth=2.0, smallest=4) == 8
    with pytest.raises(ValueError, match="growth > 1"):
        bucket(5, growth=1.0)


@pytest.mark.parametrize("boundary", [False, True])
def test_the_padded_layout_is_the_samplers(int_store, boundary):
    torch.manual_seed(0)
    config = UserModelConfig(
        model_class="GCN", in_dim=6, out_dim=3, num_layers=2, boundary_degrees=boundary
    )
    _, sub = sampled(int_store, UserNodeModel(GCN(6, 8, 2, 3), config), [3, 3])
    assert sub.boundary is boundary
    padded = pad_subgraph(sub)
    new = padded.sub
    assert new.level_sizes == tuple(bucket(n) for n in sub.level_sizes)
    assert new.num_seeds == sub.num_seeds and new.boundary is boundary
    old_starts = np.cumsum([0, *sub.level_sizes])
    new_starts = np.cumsum([0, *new.level_sizes])
    for level, size in enumerate(sub.level_sizes):  # real rows first, then padding
        level_rows = new.node[new_starts[level] : new_starts[level + 1]]
        assert torch.equal(level_rows[:size], sub.node[old_starts[level] : old_starts[level + 1]])
        assert (level_rows[size:] == PADDING_NODE).all() and len(level_rows) > size
    shift = np.repeat(new_starts[:-1] - old_starts[:-1], sub.level_sizes)
    src, dst = new.edge_index.numpy()
    assert sum(padded.hop_edges) == new.num_edges
    assert list(padded.hop_edges) == [bucket(n) for n in _hop_edges(sub)]
    position = 0
    for hop, (real, total) in enumerate(zip(_hop_edges(sub), padded.hop_edges, strict=True)):
        old = sub.edge_index[:, sum(_hop_edges(sub)[:hop]) :][:, :real].numpy()
        assert (src[position : position + real] == old[0] + shift[old[0]]).all()
        assert (dst[position : position + real] == old[1] + shift[old[1]]).all()
        first_padding_row = new_starts[hop] + sub.level_sizes[hop]
        assert (src[position + real : position + total] == first_padding_row).all()
        assert (dst[position + real : position + total] == first_padding_row).all()
        assert (new.edge[position + real : position + total] == sub.edge[0]).all()
        position += total
    assert len(_hop_edges(sub)) == len(sub.level_sizes) - 1


def _hop_edges(sub: SampledSubgraph) -> list[int]:
    bounds = np.cumsum(sub.level_sizes)
    hops = np.searchsorted(bounds, sub.edge_index[1].numpy(), side="right")
    return np.bincount(hops, minlength=len(sub.level_sizes) - 1).tolist()


@pytest.mark.parametrize("fanouts", [[-1, -1], [3, 2]])
@pytest.mark.parametrize("arch", ["gcn", "sage", "gat", "gin"])
def test_padding_leaves_every_presets_seed_outputs(int_store, arch, fanouts):
    """GCN reads each row's degree (a padding row's is 0), GAT replaces self-loops (a padding
    edge is one), SAGE averages and GIN sums over in-edges."""
    ego, sub = sampled(int_store, random_model(int_store, arch, len(fanouts)), fanouts)
    assert_padding_changes_nothing(ego, sub)


def test_padding_leaves_a_boundary_ego_graph_exact(int_store):
    """PyG's GCN (normalize=True) as a user's model: the ego-graph carries the boundary level,
    whose degrees the padding must not change."""
    torch.manual_seed(0)
    config = UserModelConfig(
        model_class="torch_geometric.nn.models.GCN",
        in_dim=6,
        out_dim=3,
        num_layers=2,
        boundary_degrees=True,
        trim=True,
    )
    model = UserNodeModel(GCN(6, 8, 2, 3).eval(), config).eval()
    ego, sub = sampled(int_store, model, [-1, -1])
    assert sub.boundary
    assert_padding_changes_nothing(ego, sub)


@pytest.mark.parametrize("trimmed", [True, False])
def test_padding_leaves_a_user_model_with_edge_features_exact(tmp_path, trimmed):
    """A graph with self-loops and parallel edges: PyG's GAT with edge features (the trimmed
    path), or EdgeMix's GINE, Transformer and GATv2 layers run whole; padding edges gather
    the first edge's features."""
    store = edge_feature_store(tmp_path)
    torch.manual_seed(0)
    if trimmed:
        module = GAT(FEATURES, 8, 2, CLASSES, edge_dim=EDGE_DIM, heads=2).eval()
    else:
        module = user_models.EdgeMix(FEATURES, 8, CLASSES, EDGE_DIM).eval()
    config = UserModelConfig(
        model_class=type(module).__name__,
        in_dim=FEATURES,
        out_dim=CLASSES,
        num_layers=2 if trimmed else 3,
        edge_input="edge_attr",
        trim=trimmed,
    )
    model = UserNodeModel(module, config).eval()
    ego, sub = sampled(store, model, [-1, -1] if trimmed else [4, 4, 4])
    assert_padding_changes_nothing(ego, sub)


def test_edges_out_of_hop_order_are_refused():
    sub = SampledSubgraph(
        node=torch.tensor([0, 1, 2]),
        edge_index=torch.tensor([[2, 1], [1, 0]]),
        edge=torch.tensor([5, 6]),
        num_seeds=1,
        level_sizes=(1, 1, 1),
    )
    with pytest.raises(ValueError, match="grouped by the hop of their destination"):
        pad_subgraph(sub)


def test_an_ego_graph_without_edges_pads_with_edge_zero():
    sub = SampledSubgraph(
        node=torch.tensor([4, 7]),
        edge_index=torch.zeros(2, 0, dtype=torch.long),
        edge=torch.zeros(0, dtype=torch.long),
        num_seeds=2,
        level_sizes=(2, 0),
    )
    padded = pad_subgraph(sub)
    assert padded.sub.level_sizes == (8, 8) and padded.hop_edges == (8,)
    assert padded.sub.node[:2].tolist() == [4, 7] and (padded.sub.edge == 0).all()
    assert (padded.sub.edge_index == 2).all()
