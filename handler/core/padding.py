"""Ego-graphs padded to a few sizes, so that one captured CUDA graph serves many batches
(handler.core.captured_forward).

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
import math
from dataclasses import dataclass

import numpy as np
import torch

from handler.core.sampler import SampledSubgraph

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
    levels = np.asarray(sub.level_sizes, dtype=np.int64)
    padded = np.array([bucket(int(n), growth, smallest) for n in levels], dtype=np.int64)
    starts, new_starts = _starts(levels), _starts(padded)
    edge_index = sub.edge_index.cpu().numpy()
    hop_edges = _hop_edges(edge_index[1], starts, len(levels))
    # Row r of level l moves by the padding of the levels before l.
    moved = edge_index + np.repeat(new_starts[:-1] - starts[:-1], levels)[edge_index]
    filler = int(sub.edge[0]) if sub.num_edges else 0
    nodes, sources, destinations, edges, padded_edges = [], [], [], [], []
    node = sub.node.cpu().numpy()
    edge = sub.edge.cpu().numpy()
    for level in range(len(levels)):
        nodes += [node[starts[level] : starts[level + 1]]]
        nodes += [np.full(padded[level] - levels[level], PADDING_NODE, dtype=node.dtype)]
    first_edge = _starts(np.array(hop_edges, dtype=np.int64))
    for hop, count in enumerate(hop_edges):
        real = slice(first_edge[hop], first_edge[hop + 1])
        extra = bucket(count, growth, smallest) - count
        loop = np.full(extra, new_starts[hop] + levels[hop], dtype=edge_index.dtype)
        sources += [moved[0, real], loop]
        destinations += [moved[1, real], loop]
        edges += [edge[real], np.full(extra, filler, dtype=edge.dtype)]
        padded_edges.append(count + extra)
    padded_sub = SampledSubgraph(
        node=torch.from_numpy(np.concatenate(nodes)),
        edge_index=torch.from_numpy(
            np.stack([np.concatenate(sources), np.concatenate(destinations)])
        ),
        edge=torch.from_numpy(np.concatenate(edges)),
        num_seeds=sub.num_seeds,
        level_sizes=tuple(int(n) for n in padded),
        boundary=sub.boundary,
    )
    return PaddedSubgraph(padded_sub, tuple(padded_edges))


def _starts(sizes: np.ndarray) -> np.ndarray:
    """Where each group starts, and the end of the last."""
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


def _hop_edges(destinations: np.ndarray, starts: np.ndarray, num_levels: int) -> list[int]:
    """Edges into each level but the last, checked to come grouped in hop order."""
    hop = np.searchsorted(starts[1:], destinations, side="right")
    if hop.size and (np.any(np.diff(hop) < 0) or hop[-1] >= num_levels - 1):
        raise ValueError(
            "pad_subgraph needs the sampler's layout: edges grouped by the hop of their "
            "destination, none into the last level"
        )
    return np.bincount(hop, minlength=num_levels - 1)[: num_levels - 1].tolist()
