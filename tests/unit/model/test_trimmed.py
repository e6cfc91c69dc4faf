"""The trimmed forward given the edges into each hop (``hop_edges``, the served-model protocol)
answers as when it counts them, and its GAT layers replace self-loops as PyG's do without
dropping any edge (a drop sizes a tensor by its data)."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.nn import GATConv, GATv2Conv
from torch_geometric.nn.models import GraphSAGE

from model import build_model
from model.architectures import gcn_norm_with_degree
from model.served import UserNodeModel
from model.trimmed import edges_per_hop, layer_on_rows
from model.user_model import UserModelConfig

LEVELS = (4, 7, 12)


def layered_graph(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x, edge_index, degree)`` laid out as the sampler lays out an ego-graph: rows grouped
    by hop, edges grouped by the hop of their destination (sources one hop deeper, and some
    self-loops)."""
    generator = torch.Generator().manual_seed(seed)
    starts = [0, LEVELS[0], LEVELS[0] + LEVELS[1], sum(LEVELS)]
    groups = []
    for hop in range(len(LEVELS) - 1):
        dst = torch.randint(starts[hop], starts[hop + 1], (3 * LEVELS[hop],), generator=generator)
        src = torch.randint(starts[hop + 1], starts[hop + 2], dst.shape, generator=generator)
        loops = torch.arange(starts[hop], starts[hop + 1], 2)
        groups.append(torch.cat([torch.stack([src, dst]), torch.stack([loops, loops])], dim=1))
    x = torch.randn(sum(LEVELS), 5, generator=generator)
    degree = torch.randint(1, 9, (sum(LEVELS),), generator=generator)
    return x, torch.cat(groups, dim=1), degree


@pytest.mark.parametrize("arch", ["gcn", "sage", "gat", "gin"])
def test_given_hop_edges_answer_as_counted_ones(arch):
    torch.manual_seed(0)
    model = build_model({"arch": arch, "in_dim": 5, "out_dim": 3, "hidden_dim": 8}).eval()
    x, edge_index, degree = layered_graph()
    hop_edges = edges_per_hop(edge_index, LEVELS)
    with torch.no_grad():
        counted = model(x, edge_index, degree, LEVELS)
        given = model(x, edge_index, degree, LEVELS, hop_edges=hop_edges)
    assert torch.equal(given, counted)


def test_a_users_basic_gnn_takes_hop_edges_on_either_trimmed_path():
    x, edge_index, _ = layered_graph()
    hop_edges = edges_per_hop(edge_index, LEVELS)
    torch.manual_seed(0)
    for conv_kwargs in ({}, {"aggr": "max"}):  # by rows; PyG's trim-to-layer
        module = GraphSAGE(5, 8, 2, 3, **conv_kwargs).eval()
        config = UserModelConfig(
            model_class="GraphSAGE", in_dim=5, out_dim=3, num_layers=2, trim=True
        )
        model = UserNodeModel(module, config).eval()
        with torch.no_grad():
            counted = model(x, edge_index, level_sizes=LEVELS)[: LEVELS[0]]
            given = model(x, edge_index, level_sizes=LEVELS, hop_edges=hop_edges)
        assert torch.equal(given[: LEVELS[0]], counted)


def test_hop_edges_that_do_not_add_up_are_refused():
    model = build_model({"arch": "sage", "in_dim": 5, "out_dim": 3}).eval()
    x, edge_index, _ = layered_graph()
    with pytest.raises(ValueError, match=r"2 counts summing to the \d+ edges"):
        model(x, edge_index, level_sizes=LEVELS, hop_edges=[1, 2])


@pytest.mark.parametrize("rows", [4, 11, 23])
@pytest.mark.parametrize("layer", ["gat", "gat-edges", "gatv2-edges"])
def test_gat_layers_replace_self_loops_as_pyg_does(layer, rows):
    """Every destination row attends over its in-edges but its self-loops, then one self-loop
    of its own (with edge features: the mean of its in-edges'), as PyG's conv computes it;
    ``rows`` 23 is every row of x."""
    torch.manual_seed(0)
    x, edge_index, _ = layered_graph()
    edge_index = torch.cat([edge_index, torch.tensor([[20, 3, 1], [20, 3, 9]])], dim=1)
    into = edge_index[:, edge_index[1] < rows]
    edge_attr = torch.randn(into.size(1), 2)
    if layer == "gat":
        conv, edge_attr = GATConv(5, 4, heads=2).eval(), None
    elif layer == "gat-edges":
        conv = GATConv(5, 4, heads=2, edge_dim=2).eval()
    else:
        conv = GATv2Conv(5, 4, heads=2, edge_dim=2, fill_value=0.5).eval()
    with torch.no_grad():
        expected = conv((x, x[:rows]), into, edge_attr=edge_attr)
        got = layer_on_rows(conv, x, rows, into, edge_attr)
    assert got.shape == expected.shape
    assert torch.allclose(got, expected, atol=1e-6)
    assert conv.add_self_loops


def test_gcn_can_keep_the_graphs_self_loops_at_weight_zero():
    edge_index = torch.tensor([[1, 0, 2], [0, 0, 1]])
    degree = torch.tensor([3, 8, 1])
    dropped, weight = gcn_norm_with_degree(edge_index, 3, degree, torch.float32)
    kept, kept_weight = gcn_norm_with_degree(edge_index, 3, degree, torch.float32, keep_loops=True)
    assert kept.tolist() == [[1, 0, 2, 0, 1, 2], [0, 0, 1, 0, 1, 2]]
    assert kept_weight[1] == 0
    assert torch.equal(kept_weight[[0, 2, 3, 4, 5]], weight)
    assert torch.equal(dropped, kept[:, [0, 2, 3, 4, 5]])
