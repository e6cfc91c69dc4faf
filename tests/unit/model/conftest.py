"""Small graphs for the model tests, generated here so the tests need no store on disk."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch


@dataclass(frozen=True)
class Graph:
    x: torch.Tensor
    edge_index: torch.Tensor
    labels: torch.Tensor
    num_classes: int


def random_graph(num_nodes: int, num_edges: int, num_isolated: int, seed: int) -> Graph:
    """Random directed graph without self-loops or duplicates; the last nodes have no edges."""
    generator = torch.Generator().manual_seed(seed)
    connected = num_nodes - num_isolated
    edges = torch.randint(0, connected, (2, num_edges), generator=generator)
    edges = edges[:, edges[0] != edges[1]]
    edges = torch.unique(edges, dim=1)
    x = torch.randn(num_nodes, 6, generator=generator)
    labels = torch.randint(0, 3, (num_nodes,), generator=generator)
    return Graph(x, edges, labels, 3)


def homophilous_graph(
    num_nodes: int = 300, num_classes: int = 3, feature_dim: int = 16, seed: int = 0
) -> Graph:
    """Labelled graph whose edges mostly join nodes of one class and whose features carry a
    weak class signal, so neighbours help; a tenth of the labels are hidden (-1)."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, num_classes, (num_nodes,), generator=generator)
    centres = torch.randn(num_classes, feature_dim, generator=generator)
    x = 0.3 * centres[labels] + torch.randn(num_nodes, feature_dim, generator=generator)
    src = torch.randint(0, num_nodes, (num_nodes * 5,), generator=generator)
    same_class = torch.rand(src.numel(), generator=generator) < 0.8
    by_class = [torch.nonzero(labels == c).flatten() for c in range(num_classes)]
    dst = torch.randint(0, num_nodes, (src.numel(),), generator=generator)
    for i in torch.nonzero(same_class).flatten().tolist():
        pool = by_class[int(labels[src[i]])]
        dst[i] = pool[torch.randint(0, pool.numel(), (1,), generator=generator)]
    edges = torch.stack([src, dst])
    edges = edges[:, edges[0] != edges[1]]
    edges = torch.unique(torch.cat([edges, edges.flip(0)], dim=1), dim=1)
    hidden = torch.rand(num_nodes, generator=generator) < 0.1
    labels = torch.where(hidden, torch.full_like(labels, -1), labels)
    return Graph(x, edges, labels, num_classes)


@pytest.fixture(scope="session")
def small_graph() -> Graph:
    return random_graph(num_nodes=40, num_edges=110, num_isolated=4, seed=1)


@pytest.fixture(scope="session")
def labelled_graph() -> Graph:
    return homophilous_graph()
