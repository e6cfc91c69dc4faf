"""A PyG ``BasicGNN``'s forward on a sampled ego-graph, each layer computing only the rows a
later layer reads: the presets' and a user's ``torch_geometric.nn.models`` model's one fast path.

Rows of a sampled ego-graph are grouped by hop and its edges by the hop of their destination, so
layer ``i`` of an ``L``-layer model only has to produce hops ``0..L-1-i``: it runs bipartite,
``conv((x, x[:rows]), edges[:, :e])`` (the destination rows are a prefix of the source rows).
SAGE (mean) and GIN layers are computed from their own weights without PyG's per-call
bookkeeping, which on a few thousand rows costs about as much as the arithmetic itself.

Given the edges into each hop (``hop_edges``, which the host knows from the sampler), the
forward reads no tensor data on the host: no shape depends on a value, so a CUDA graph can
capture it (handler.gpu.captured_forward).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Protocol

import torch
from torch import Tensor
from torch_geometric.nn import (
    EdgeConv,
    GATConv,
    GATv2Conv,
    GINConv,
    GINEConv,
    GraphConv,
    MessagePassing,
    SAGEConv,
)
from torch_geometric.nn.models.basic_gnn import BasicGNN
from torch_geometric.nn.norm import BatchNorm
from torch_geometric.utils import add_self_loops

# Layers that take a (source rows, destination rows) pair, so a layer can write fewer rows
# than it reads.
_BIPARTITE = (SAGEConv, GINConv, GINEConv, GATConv, GATv2Conv, GraphConv, EdgeConv)
# Norms that act on each row alone (in eval mode), so they commute with dropping rows.
_ROW_NORMS = (torch.nn.Identity, BatchNorm, torch.nn.BatchNorm1d)


def trims_by_rows(gnn: BasicGNN) -> bool:
    """True when :func:`trimmed_forward` computes ``gnn``'s forward: bipartite layers, row-wise
    norms, no jumping knowledge (which would read every hop's rows)."""
    return (
        gnn.jk_mode is None
        and all(isinstance(conv, _BIPARTITE) for conv in gnn.convs)
        and all(isinstance(norm, _ROW_NORMS) for norm in gnn.norms)
    )


def trimmed_forward(
    gnn: BasicGNN,
    x: Tensor,
    edge_index: Tensor,
    level_sizes: Sequence[int],
    edge_attr: Tensor | None = None,
    hop_edges: Sequence[int] | None = None,
) -> Tensor:
    """``gnn``'s output for the first rows of ``x`` (at least the seeds'); layer ``i`` reads
    hops ``0..L-i`` and writes hops ``0..L-1-i``. As ``BasicGNN.forward`` between layers: act
    (first or after), norm, dropout. ``hop_edges``: edges into each hop (default: counted from
    ``edge_index``, which reads it on the host)."""
    rows = list(itertools.accumulate(level_sizes))
    edges = list(itertools.accumulate(known_hop_edges(edge_index, level_sizes, hop_edges)))
    for i in range(gnn.num_layers):
        keep = gnn.num_layers - 1 - i  # the deepest hop whose rows this layer's output feeds
        attr = None if edge_attr is None else edge_attr[: edges[keep]]
        x = gnn_layer(gnn, i, x, rows[keep], edge_index[:, : edges[keep]], attr)
    return x


class ConvOnRows(Protocol):
    """How one conv computes its destination rows (:func:`layer_on_rows`'s signature)."""

    def __call__(
        self,
        conv: torch.nn.Module,
        x: Tensor,
        rows: int,
        edge_index: Tensor,
        edge_attr: Tensor | None = None,
    ) -> Tensor: ...


def gnn_layer(
    gnn: BasicGNN,
    index: int,
    x: Tensor,
    rows: int,
    edge_index: Tensor,
    edge_attr: Tensor | None = None,
    conv_on_rows: ConvOnRows | None = None,
) -> Tensor:
    """Layer ``index`` of ``gnn``'s forward for the first ``rows`` rows of ``x`` (whose in-edges
    ``edge_index`` holds, with their features ``edge_attr`` for layers that read them), as the
    next layer reads it: the conv, then, as ``BasicGNN.forward`` does between layers, the
    activation (first or after), the norm and dropout; the last layer's output as it is.

    The one rule for a layer of every ``BasicGNN`` we serve: the trimmed forward above, and the
    rows of a precomputed archive (model.precompute), presets and a user's model alike.
    ``conv_on_rows`` stands in for :func:`layer_on_rows` where a preset computes its conv
    otherwise (GCN from full-graph degrees)."""
    attr = edge_attr if gnn.supports_edge_attr else None
    x = (conv_on_rows or layer_on_rows)(gnn.convs[index], x, rows, edge_index, attr)
    if index < gnn.num_layers - 1:
        if gnn.act is not None and gnn.act_first:
            x = gnn.act(x)
        x = gnn.norms[index](x)
        if gnn.act is not None and not gnn.act_first:
            x = gnn.act(x)
        x = gnn.dropout(x)
    return x


def layer_on_rows(
    conv: torch.nn.Module,
    x: Tensor,
    rows: int,
    edge_index: Tensor,
    edge_attr: Tensor | None = None,
) -> Tensor:
    """One layer's output for the first ``rows`` rows of ``x`` (its destinations), whose
    in-edges ``edge_index`` holds."""
    if isinstance(conv, MessagePassing) and runs_stock_propagate(conv):
        if (
            isinstance(conv, SAGEConv)
            and conv.aggr == "mean"
            and conv.root_weight
            and not (conv.project or conv.normalize)
        ):
            mean = aggregate_in_edges(x, edge_index, rows, mean=True)
            return conv.lin_l(mean) + conv.lin_r(x[:rows])
        if isinstance(conv, GINConv) and conv.aggr == "add":
            total = aggregate_in_edges(x, edge_index, rows, mean=False)
            return conv.nn(total + (1 + conv.eps) * x[:rows])
        if isinstance(conv, GATConv | GATv2Conv) and conv.add_self_loops:
            return attention_on_rows(conv, x, rows, edge_index, edge_attr)
    if edge_attr is not None:
        return conv((x, x[:rows]), edge_index, edge_attr=edge_attr)
    return conv((x, x[:rows]), edge_index)


def attention_on_rows(
    conv: GATConv | GATv2Conv,
    x: Tensor,
    rows: int,
    edge_index: Tensor,
    edge_attr: Tensor | None = None,
) -> Tensor:
    """A GAT layer's rows with its self-loops replaced as PyG does (the graph's dropped, one
    per row added after the other edges, their features ``fill_value``), without dropping
    anything: a graph self-loop is sent to one extra destination row, whose output is cut
    off. Dropping would size a tensor by its data, a host read. Each row attends over the
    same edges in the same order as in PyG's own forward."""
    src, dst = edge_index
    sink = torch.full_like(dst, rows)
    edge_index = torch.stack([src, torch.where(src == dst, sink, dst)])
    edge_index, edge_attr = add_self_loops(
        edge_index, edge_attr, fill_value=conv.fill_value, num_nodes=rows + 1
    )
    if x.size(0) == rows:  # the extra row's own self-loop needs a source row too
        x = torch.cat([x, x.new_zeros(1, x.size(1))])
    conv.add_self_loops = False
    try:
        out = conv((x, x[: rows + 1]), edge_index, edge_attr=edge_attr)
    finally:
        conv.add_self_loops = True
    return out[:rows]


def runs_stock_propagate(conv: MessagePassing) -> bool:
    """True when ``conv.propagate`` would do nothing but aggregate: no explainer masks, no
    hooks, no decomposed layers (what :func:`aggregate_in_edges` may stand in for)."""
    hooks = (
        conv._propagate_forward_pre_hooks,
        conv._propagate_forward_hooks,
        conv._message_forward_pre_hooks,
        conv._message_forward_hooks,
        conv._aggregate_forward_pre_hooks,
        conv._aggregate_forward_hooks,
    )
    return not conv.explain and conv.decomposed_layers == 1 and not any(hooks)


def aggregate_in_edges(x: Tensor, edge_index: Tensor, rows: int, mean: bool) -> Tensor:
    """Sum (or mean) of ``x[src]`` into each of the first ``rows`` rows over ``edge_index``.

    The arithmetic of PyG's ``propagate`` with ``aggr="sum"|"mean"`` (the same additions in the
    same order, so the same bits), without its per-call bookkeeping.
    """
    src, dst = edge_index
    total = x.new_zeros(rows, x.size(1)).index_add_(0, dst, x.index_select(0, src))
    if not mean:
        return total
    # Counted by index_add, not bincount: on CUDA bincount reads the largest index on the host.
    count = x.new_zeros(rows).index_add_(0, dst, x.new_ones(dst.size(0))).clamp_(min=1)
    return total / count.unsqueeze(1)


def known_hop_edges(
    edge_index: Tensor, level_sizes: Sequence[int], hop_edges: Sequence[int] | None
) -> list[int]:
    """``hop_edges`` when the caller knows them (checked against the edges' total), else
    :func:`edges_per_hop`."""
    if hop_edges is None:
        return edges_per_hop(edge_index, level_sizes)
    if len(hop_edges) != len(level_sizes) - 1 or sum(hop_edges) != edge_index.size(1):
        raise ValueError(
            f"hop_edges must give the edges into each hop but the last "
            f"({len(level_sizes) - 1} counts summing to the {edge_index.size(1)} edges), got "
            f"{list(hop_edges)}"
        )
    return list(hop_edges)


def edges_per_hop(edge_index: Tensor, level_sizes: Sequence[int]) -> list[int]:
    """Edges into each hop's rows (hops ``0..L-1``); they must come grouped in hop order."""
    bounds = torch.tensor(list(itertools.accumulate(level_sizes)), device=edge_index.device)
    hop_of_dst = torch.bucketize(edge_index[1], bounds, right=True)
    counts = torch.bincount(hop_of_dst, minlength=len(level_sizes))[: len(level_sizes) - 1]
    return [int(c) for c in counts]
