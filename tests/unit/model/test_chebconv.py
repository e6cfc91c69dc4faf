"""ChebConv with the graph's degrees (model.chebconv): on a node's ego-graph of in-edges its
row equals the whole graph's, for every normalization, with and without lambda_max; outside
the block the layer counts degrees on its edges again."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.nn import ChebConv
from torch_geometric.utils import degree, remove_self_loops, to_undirected

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
def test_an_ego_graph_with_the_graphs_degrees_answers_as_the_whole_graph(normalization, lambda_max):
    generator = torch.Generator().manual_seed(0)
    edge_index = to_undirected(torch.randint(0, 40, (2, 120), generator=generator))
    x = torch.randn(40, 5, generator=generator)
    torch.manual_seed(0)
    conv = ChebConv(5, 3, K=3, normalization=normalization).eval()
    kwargs = {} if lambda_max is None else {"lambda_max": lambda_max}
    full = conv(x, edge_index, **kwargs)
    loops_removed, _ = remove_self_loops(edge_index)
    deg = degree(loops_removed[1], 40)  # in-degrees: out-degrees on an undirected graph
    largest = int(deg.max())
    counted_on_the_edges = 0.0
    for seed in (0, int(deg.argmax()), 17):
        rows, local = ego_graph(edge_index, seed, hops=2)
        alone = conv(x[rows], local, **kwargs)[0]
        with graph_degrees(conv, deg[rows], largest):
            served = conv(x[rows], local, **kwargs)[0]
        assert float((served - full[seed]).abs().max()) <= 1e-5
        assert float((conv(x[rows], local, **kwargs)[0] - alone).abs().max()) == 0.0
        counted_on_the_edges = max(counted_on_the_edges, float((alone - full[seed]).abs().max()))
    assert counted_on_the_edges > 1e-3  # what the layer alone computes on an ego-graph
    assert "__norm__" not in vars(conv)
