"""A seed's answer on its full-neighbourhood (node, hop) ego-graph equals the full-graph forward.

This is the property the server's exactness rests on (design §5): the sampler hands the model
such ego-graphs with the full-graph in-degree of every row.
"""

from __future__ import annotations

import pytest
import torch

from model import build_model

ARCHS = ["gcn", "sage", "gat", "gin"]


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


def seed_probabilities(model, graph, degree_on_subgraph: bool, hops: int):
    """(ego-graph answer, full-graph answer) for every node as the seed, stacked."""
    num_nodes = graph.x.size(0)
    degree = in_degree(graph.edge_index, num_nodes)
    with torch.no_grad():
        full = model(graph.x, graph.edge_index).softmax(dim=-1)
        ego = []
        for seed in range(num_nodes):
            nodes, sub_edges = ego_tree(graph.edge_index, num_nodes, seed, hops)
            sub_degree = degree[nodes] if degree_on_subgraph else None
            ego.append(model(graph.x[nodes], sub_edges, sub_degree)[0].softmax(dim=-1))
    return torch.stack(ego), full


@pytest.mark.parametrize("num_layers", [2, 3])
@pytest.mark.parametrize("arch", ARCHS)
def test_ego_graph_answer_equals_full_graph_answer(small_graph, arch, num_layers):
    torch.manual_seed(0)
    model = build_model(
        {"arch": arch, "in_dim": 6, "out_dim": 3, "hidden_dim": 16, "num_layers": num_layers}
    ).eval()
    ego, full = seed_probabilities(model, small_graph, degree_on_subgraph=True, hops=num_layers)
    assert (ego - full).abs().max().item() <= 1e-5


def test_gcn_needs_full_graph_degrees(small_graph):
    """Without ``degree`` GCN normalises with ego-graph degrees, which the tree truncates."""
    torch.manual_seed(0)
    model = build_model({"arch": "gcn", "in_dim": 6, "out_dim": 3, "hidden_dim": 16}).eval()
    ego, full = seed_probabilities(model, small_graph, degree_on_subgraph=False, hops=2)
    assert (ego - full).abs().max().item() > 1e-3


@pytest.mark.parametrize("arch", ARCHS)
def test_one_hop_too_few_changes_answers(small_graph, arch):
    """The comparison is sensitive: an ego-graph one hop short of the layers is not exact."""
    torch.manual_seed(0)
    model = build_model({"arch": arch, "in_dim": 6, "out_dim": 3, "hidden_dim": 16}).eval()
    ego, full = seed_probabilities(model, small_graph, degree_on_subgraph=True, hops=1)
    assert (ego - full).abs().max().item() > 1e-3


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
