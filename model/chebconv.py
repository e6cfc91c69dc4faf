"""ChebConv on an ego-graph: its Laplacian with the graph's degrees.

PyG's ``ChebConv`` builds its scaled Laplacian from the graph it is given (``get_laplacian``):
each node's degree is its count of out-edges (``scatter`` over ``edge_index[0]``, self-loops
removed), and without ``lambda_max`` the scale is ``2 * max`` of the Laplacian's entries: 2 for
``sym`` and ``rw``, twice the graph's largest degree for ``normalization=None``. An ego-graph
holds the in-edges of its inner hops only, so the degrees it would count are not the graph's.

Served, each ChebConv's normalisation reads the degrees the ego-graph carries instead
(``degree``: full-graph in-degrees, self-loops not counted, the ones GCN reads) and, for
``normalization=None`` without ``lambda_max``, the graph's largest degree recorded at build (or
a row's, when larger: a cold-start node's neighbour).
That is the full-graph Laplacian where each node has as many out-edges as in-edges (an
undirected graph, ``--undirected``), which the build checks (:func:`check_chebconv`); the
verification then compares the answers as for any model.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch_geometric.nn import ChebConv
from torch_geometric.utils import add_self_loops, remove_self_loops


def chebconv_layers(module: torch.nn.Module) -> list[ChebConv]:
    """The ChebConv layers of ``module``."""
    return [sub for sub in module.modules() if isinstance(sub, ChebConv)]


def check_chebconv(
    module: torch.nn.Module,
    in_degree: np.ndarray,
    out_degree: np.ndarray,
    edge_weight: bool,
) -> None:
    """ValueError naming why ``module``'s ChebConv layers cannot be served exactly: a node with
    other out- than in-degree (``in_degree``/``out_degree``: every node's), or edge weights
    (their weighted degrees are not carried); nothing for a module without ChebConv."""
    if not chebconv_layers(module):
        return
    name = type(module).__name__
    if edge_weight:
        raise ValueError(
            f"{name} holds ChebConv, whose Laplacian would sum the edge weights of each node's "
            "out-edges, which an ego-graph does not carry: build with --edge-input none"
        )
    differ = np.flatnonzero(np.asarray(in_degree) != np.asarray(out_degree))
    if len(differ):
        raise ValueError(
            f"{name} holds ChebConv, which normalises by each node's out-degree; an ego-graph "
            "holds in-edges, so it is served with the in-degree, the same number only where "
            f"every node has as many out- as in-edges, and {len(differ)} of this graph's "
            f"nodes do not (e.g. internal index {int(differ[0])}): build the graph with "
            "--undirected"
        )


def max_degree(module: torch.nn.Module, degree: np.ndarray) -> int:
    """The graph's largest degree (self-loops not counted) where a ChebConv without
    normalisation scales by it (its default ``lambda_max``), else 0."""
    if not any(conv.normalization is None for conv in chebconv_layers(module)):
        return 0
    return int(np.max(degree, initial=0))


@contextmanager
def graph_degrees(module: torch.nn.Module, degree: Tensor, largest: int) -> Iterator[None]:
    """Within the block, ``module``'s ChebConv layers normalise with ``degree`` (one per row of
    the ego-graph) and ``largest`` (module docstring)."""
    layers = chebconv_layers(module)
    for conv in layers:
        conv.__norm__ = _norm_with(degree, largest)
    try:
        yield
    finally:
        for conv in layers:
            del conv.__norm__


def _norm_with(degree: Tensor, largest: int) -> Any:
    """``ChebConv.__norm__`` (PyG 2.x) with the degrees given, not counted on the edges."""

    def norm(
        edge_index: Tensor,
        num_nodes: int | None,
        edge_weight: Tensor | None,
        normalization: str | None,
        lambda_max: Any = None,
        dtype: torch.dtype | None = None,
        batch: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        if edge_weight is not None:
            raise ValueError("ChebConv with edge weights is not served (check_chebconv)")
        edge_index, _ = remove_self_loops(edge_index)
        weight = torch.ones(edge_index.size(1), dtype=dtype, device=edge_index.device)
        deg = degree.to(dtype=weight.dtype, device=weight.device)
        row, col = edge_index[0], edge_index[1]
        if normalization is None:  # L = D - A
            edge_index, _ = add_self_loops(edge_index, num_nodes=num_nodes)
            weight = torch.cat([-weight, deg])
        else:  # L = I - D^-1/2 A D^-1/2 (sym) or I - D^-1 A (rw)
            if normalization == "sym":
                inverse = deg.pow(-0.5)
                inverse.masked_fill_(inverse == float("inf"), 0)
                weight = inverse[row] * weight * inverse[col]
            else:
                inverse = 1.0 / deg
                inverse.masked_fill_(inverse == float("inf"), 0)
                weight = inverse[row] * weight
            edge_index, filled = add_self_loops(
                edge_index, -weight, fill_value=1.0, num_nodes=num_nodes
            )
            assert filled is not None
            weight = filled
        if lambda_max is None:  # 2 x the full graph's largest Laplacian entry
            # A cold-start node raises its neighbours' degrees: one may become the largest.
            top = max(float(largest), float(deg.max())) if deg.numel() else float(largest)
            lambda_max = 2.0 * (top if normalization is None else 1.0)
        if not isinstance(lambda_max, Tensor):
            lambda_max = torch.tensor(lambda_max, dtype=dtype, device=edge_index.device)
        if batch is not None and lambda_max.numel() > 1:
            lambda_max = lambda_max[batch[edge_index[0]]]
        weight = (2.0 * weight) / lambda_max
        weight.masked_fill_(weight == float("inf"), 0)
        weight[edge_index[0] == edge_index[1]] -= 1
        return edge_index, weight

    return norm
