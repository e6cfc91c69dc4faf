"""Ego-graphs padded to a few sizes, so that one captured CUDA graph serves many batches
(handler.gpu.captured_forward).

Each level of rows is padded to the next size of a geometric ladder (``growth`` apart, at least
one padding row per level) with rows of node ``-1``, which the gather gives zero features and
zero degree, as it gives a boundary row; each hop's edges are padded the same way with
self-loops of that level's first padding row. A padding edge touches only padding rows, so no
row of the ego-graph sees one: the seeds' outputs are those of the unpadded ego-graph, for any
model (the layout stays the sampler's: rows grouped by hop, seeds first, edges grouped by the
hop of their destination).
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
from dataclasses import dataclass

import numpy as np
import torch

from handler.sampling.sampler import SampledSubgraph

PADDING_NODE = -1
DEFAULT_GROWTH = 1.25
DEFAULT_SMALLEST = 8


@dataclass(frozen=True)
class PaddedSubgraph:
    """An ego-graph padded to bucket sizes, and what the host knows of it without reading it.

    Attributes:
        sub: the padded ego-graph (CPU tensors): ``level_sizes`` are the padded levels,
            ``num_seeds`` the real seeds (rows ``0..num_seeds-1``), padding rows have node
            ``-1``. A padding edge's ID (``sub.edge``) is the ego-graph's first edge's ID, an
            edge that a gather of the real edges' features reads anyway (``0`` when it has no
            edge), so gathering every edge's features raises nothing and gives finite rows.
        hop_edges: edges into each hop's rows (all levels but the last), padding included: the
            forward's per-hop counts (``hop_edges=`` of the served-model protocol).
    """

    sub: SampledSubgraph
    hop_edges: tuple[int, ...]


def bucket(count: int, growth: float = DEFAULT_GROWTH, smallest: int = DEFAULT_SMALLEST) -> int:
    """The smallest size of the ladder ``smallest, ceil(smallest * growth), ...`` (each at
    least one more than the last) that holds ``count`` and one more: padding makes at least
    one row per level."""
    ladder = _ladder(growth, smallest)
    return ladder[bisect.bisect_left(ladder, count + 1)]


@functools.lru_cache(maxsize=8)
def _ladder(growth: float, smallest: int) -> tuple[int, ...]:
    if growth <= 1.0 or smallest < 1:
        raise ValueError(
            f"bucket sizes need growth > 1 and smallest >= 1, got growth={growth}, "
            f"smallest={smallest}"
        )
    sizes = [smallest]
    while sizes[-1] < 2**40:
        sizes.append(max(sizes[-1] + 1, math.ceil(sizes[-1] * growth)))
    return tuple(sizes)


def pad_subgraph(
    sub: SampledSubgraph, growth: float = DEFAULT_GROWTH, smallest: int = DEFAULT_SMALLEST
) -> PaddedSubgraph:
    """``sub`` with each level and each hop's edges padded to :func:`bucket` sizes (defaults:
    growth 1.25 from 8, at most a quarter more rows than needed plus one). ValueError when
    ``sub``'s edges are not grouped by the hop of their destination."""
    levels = list(sub.level_sizes)
    padded_levels = [bucket(n, growth, smallest) for n in levels]
    starts, new_starts = _starts(levels), _starts(padded_levels)
    edge_index = sub.edge_index.cpu().numpy()
    hop_edges = _hop_edges(edge_index[1], starts)
    padded_edges = [bucket(n, growth, smallest) for n in hop_edges]
    edge_starts, new_edge_starts = _starts(hop_edges), _starts(padded_edges)
    node, edge = sub.node.cpu().numpy(), sub.edge.cpu().numpy()
    new_node = np.full(new_starts[-1], PADDING_NODE, dtype=node.dtype)
    for level, size in enumerate(levels):
        new_node[new_starts[level] : new_starts[level] + size] = node[
            starts[level] : starts[level + 1]
        ]
    # Row r of level l moves by the padding of the levels before l.
    shifts = np.subtract(new_starts[:-1], starts[:-1])
    moved = edge_index + np.repeat(shifts, levels)[edge_index]
    new_edge_index = np.empty((2, new_edge_starts[-1]), dtype=edge_index.dtype)
    new_edge = np.full(new_edge_starts[-1], edge[0] if edge.size else 0, dtype=edge.dtype)
    for hop, count in enumerate(hop_edges):
        old, new = edge_starts[hop], new_edge_starts[hop]
        new_edge_index[:, new : new + count] = moved[:, old : old + count]
        new_edge_index[:, new + count : new_edge_starts[hop + 1]] = new_starts[hop] + levels[hop]
        new_edge[new : new + count] = edge[old : old + count]
    padded = SampledSubgraph(
        node=torch.from_numpy(new_node),
        edge_index=torch.from_numpy(new_edge_index),
        edge=torch.from_numpy(new_edge),
        num_seeds=sub.num_seeds,
        level_sizes=tuple(padded_levels),
        boundary=sub.boundary,
    )
    return PaddedSubgraph(padded, tuple(padded_edges))


def _starts(sizes: list[int]) -> list[int]:
    """Where each group starts, and the end of the last."""
    return [0, *itertools.accumulate(sizes)]


def _hop_edges(destinations: np.ndarray, starts: list[int]) -> list[int]:
    """Edges into each level but the last, checked to come grouped in hop order."""
    hop = np.searchsorted(starts[1:], destinations, side="right")
    levels = len(starts) - 1
    if hop.size and (np.any(hop[1:] < hop[:-1]) or hop[-1] >= levels - 1):
        raise ValueError(
            "pad_subgraph needs the sampler's layout: edges grouped by the hop of their "
            "destination, none into the last level"
        )
    bounds = np.searchsorted(hop, np.arange(levels), side="left").tolist()
    return [b - a for a, b in itertools.pairwise(bounds)]
