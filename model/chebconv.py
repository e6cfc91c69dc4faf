"""ChebConv on an ego-graph: its Laplacian with the graph's out-degrees.

PyG's ``ChebConv`` builds its scaled Laplacian from the graph it is given (``get_laplacian``):
each node's degree is its count of out-edges (``scatter`` over ``edge_index[0]``, self-loops
removed), and without ``lambda_max`` the scale is ``2 * max`` of the Laplacian's entries: 2 for
``sym`` and ``rw``, twice the graph's largest out-degree for ``normalization=None``. An
ego-graph holds the in-edges of its inner hops only, so the degrees it would count are not the
graph's.

Served, such a model's ego-graph carries each row's full-graph out-degree (self-loops not
counted; ``GraphView.out_degree_rows``, which the stored graph, live updates, a cold-start node
and a graph in Redis all answer) as ``degree`` (:class:`model.served.ServingNeeds`
``out_degrees``), and each ChebConv's normalisation reads those instead of counting, with the
graph version's largest out-degree (``GraphView.largest_out_degree``) as the scale of
``normalization=None`` without ``lambda_max``. That is the full-graph Laplacian on any graph,
directed or not, so the answers equal the full-graph forward. Edge weights are refused
(:func:`check_chebconv`): their weighted out-degree sums are not carried.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor
from torch_geometric.nn import ChebConv
from torch_geometric.utils import add_self_loops, remove_self_loops


def chebconv_layers(module: torch.nn.Module) -> list[ChebConv]:
    """The ChebConv layers of ``module``."""
    return [sub for sub in module.modules() if isinstance(sub, ChebConv)]


def check_chebconv(module: torch.nn.Module, edge_weight: bool) -> None:
    """ValueError where ``module``'s ChebConv layers would read edge weights (``edge_weight``),
    whose weighted out-degrees the ego-graph does not carry; nothing otherwise."""
    if edge_weight and chebconv_layers(module):
        raise ValueError(
            f"{type(module).__name__} holds ChebConv, whose Laplacian would sum the edge "
            "weights of each node's out-edges, which an ego-graph does not carry: build with "
            "--edge-input none"
        )


def scales_by_largest_degree(module: torch.nn.Module) -> bool:
    """Whether a ChebConv of ``module`` has no normalisation, whose default ``lambda_max`` is
    twice the graph's largest out-degree."""
    return any(conv.normalization is None for conv in chebconv_layers(module))


@contextmanager
def graph_degrees(module: torch.nn.Module, degree: Tensor, largest: int) -> Iterator[None]:
    """Within the block, ``module``'s ChebConv layers normalise with ``degree`` (each row's
    full-graph out-degree) and ``largest`` (the graph's largest out-degree; module docstring)."""
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
            lambda_max = 2.0 * (float(largest) if normalization is None else 1.0)
        if not isinstance(lambda_max, Tensor):
            lambda_max = torch.tensor(lambda_max, dtype=dtype, device=edge_index.device)
        if batch is not None and lambda_max.numel() > 1:
            lambda_max = lambda_max[batch[edge_index[0]]]
        weight = (2.0 * weight) / lambda_max
        weight.masked_fill_(weight == float("inf"), 0)
        weight[edge_index[0] == edge_index[1]] -= 1
        return edge_index, weight

    return norm
