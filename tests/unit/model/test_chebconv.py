"""ChebConv with the graph's out-degrees (model.chebconv): on a node's ego-graph of in-edges of
a directed graph (self-loops and parallel edges included) its row equals the whole graph's, for
every K, normalization, with and without lambda_max; outside the block the layer counts degrees
on its edges again."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.nn import ChebConv
from torch_geometric.utils import degree, remove_self_loops

from model.chebconv import graph_degrees


def ego_graph(edge_index: torch.Tensor, seed: int, hops: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rows, local edge_index)``: ``seed`` first, then each hop's new in-neighbours, with
    every in-edge of the rows within ``hops - 1`` hops (what a full-fanout sampler gives)."""
    rows, frontier, kept = [seed], [seed], []
    for _ in range(hops):
        into = torch.isin(edge_index[1], torch.tensor(frontier))
        kept.append(into.nonzero().flatten())
        sources = edge_index[0, into].unique().tolist()
        frontier = [s for s in sources if s not in rows]
        rows += frontier
    edges = edge_index[:, torch.cat(kept).unique()]
    position = {node: i for i, node in enumerate(rows)}
    local = torch.tensor(
        [[position[int(n)] for n in edges[0]], [position[int(n)] for n in edges[1]]]
    )
    return torch.tensor(rows), local


@pytest.mark.parametrize("lambda_max", [None, 3.0])
@pytest.mark.parametrize("normalization", [None, "sym", "rw"])
@pytest.mark.parametrize("k", [2, 3])
def test_an_ego_graph_with_the_graphs_degrees_answers_as_the_whole_graph(
    k, normalization, lambda_max
):
    generator = torch.Generator().manual_seed(0)
    edge_index = torch.randint(0, 40, (2, 120), generator=generator)
    edge_index[0, :6] = edge_index[1, :6]  # self-loops
    edge_index = torch.cat([edge_index, edge_index[:, 10:20]], dim=1)  # parallel edges
    x = torch.randn(40, 5, generator=generator)
    torch.manual_seed(0)
    conv = ChebConv(5, 3, K=k, normalization=normalization).eval()
    kwargs = {} if lambda_max is None else {"lambda_max": lambda_max}
    full = conv(x, edge_index, **kwargs)
    loops_removed, _ = remove_self_loops(edge_index)
    out_deg = degree(loops_removed[0], 40)
    in_deg = degree(loops_removed[1], 40)
    assert bool((out_deg != in_deg).any())  # directed
    largest = int(out_deg.max())
    counted_on_the_edges = with_in_degrees = 0.0
    for seed in (0, int(out_deg.argmax()), int(in_deg.argmax()), 17):
        rows, local = ego_graph(edge_index, seed, hops=k - 1)
        alone = conv(x[rows], local, **kwargs)[0]
        with graph_degrees(conv, out_deg[rows], largest):
            served = conv(x[rows], local, **kwargs)[0]
        with graph_degrees(conv, in_deg[rows], int(in_deg.max())):
            wrong = conv(x[rows], local, **kwargs)[0]
        assert float((served - full[seed]).abs().max()) <= 1e-5
        assert float((conv(x[rows], local, **kwargs)[0] - alone).abs().max()) == 0.0
        counted_on_the_edges = max(counted_on_the_edges, float((alone - full[seed]).abs().max()))
        with_in_degrees = max(with_in_degrees, float((wrong - full[seed]).abs().max()))
    assert counted_on_the_edges > 1e-3  # what the layer alone computes on an ego-graph
    assert with_in_degrees > 1e-3  # in-degrees are not the Laplacian's on a directed graph
    assert "__norm__" not in vars(conv)
