"""Ego-graphs padded to a few sizes, so that one captured CUDA graph serves many batches
(handler.gpu.captured_forward).

Each level's rows of each node type are padded to the next size of a geometric ladder
(``growth`` apart, at least one padding row per level and type) with rows of node ``-1 - t``
(``-1`` on a one-type graph), which the gather gives zero features and zero degree, as it gives
a boundary row; each hop's edges of each relation are padded the same way with edges from that
level's first padding row of the relation's source type to its first of the destination type
(a self-loop on a one-type graph). A padding edge touches only padding rows, so no row of the
ego-graph sees one: the seeds' outputs are those of the unpadded ego-graph, for any model (the
layout stays the sampler's: rows grouped by hop, seeds first, edges grouped by the hop of their
destination; within a level a type's padding follows the real rows, so each type's rows and
each relation's edges stay in hop order). A one-type graph is the one-type case of the typed
padding, not a path of its own.
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
class RowTypes:
    """The node type of each row and the relation of each edge of an ego-graph of a graph of
    several node types (a padding or boundary row of type ``t`` has node ``-1 - t``).

    Attributes:
        row_type: ``[n]`` each row's node type index.
        edge_relation: ``[E]`` each edge's relation index.
        relation_ends: ``[R, 2]`` each relation's source and destination type index.
        num_types: the graph's node types (each level gets padding rows of every one).
    """

    row_type: np.ndarray
    edge_relation: np.ndarray
    relation_ends: np.ndarray
    num_types: int


@dataclass(frozen=True)
class PaddedSubgraph:
    """An ego-graph padded to bucket sizes, and what the host knows of it without reading it.

    Attributes:
        sub: the padded ego-graph (CPU tensors): ``level_sizes`` are the padded levels,
            ``num_seeds`` the real seeds (rows ``0..num_seeds-1``), padding rows of type ``t``
            have node ``-1 - t`` (``-1`` on a one-type graph). On a one-type graph a padding
            edge's ID (``sub.edge``) is the ego-graph's first edge's ID, an edge that a gather
            of the real edges' features reads anyway (``0`` when it has no edge), so gathering
            every edge's features raises nothing and gives finite rows; on a typed graph it is
            ``-1`` (its relation may have no edge in the ego-graph) and ``padding_edges``
            marks it, so that the typed gather gives it zero features.
        hop_edges: edges into each hop's rows (all levels but the last), padding included: the
            forward's per-hop counts (``hop_edges=`` of the served-model protocol).
        type_rows: ``[levels][types]`` padded rows of each type in each level.
        relation_edges: ``[hops][relations]`` padded edges of each relation into each hop.
        types: the padded rows' types and edges' relations; None on a one-type graph.
        padding_edges: ``[E]`` which edges are padding (typed only: a real edge's ID may be
            negative too, as a cold-start request's new edges are).
    """

    sub: SampledSubgraph
    hop_edges: tuple[int, ...]
    type_rows: tuple[tuple[int, ...], ...] = ()
    relation_edges: tuple[tuple[int, ...], ...] = ()
    types: RowTypes | None = None
    padding_edges: np.ndarray | None = None


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
    sub: SampledSubgraph,
    growth: float = DEFAULT_GROWTH,
    smallest: int = DEFAULT_SMALLEST,
    types: RowTypes | None = None,
) -> PaddedSubgraph:
    """``sub`` with each level's rows of each type and each hop's edges of each relation
    padded to :func:`bucket` sizes (defaults: growth 1.25 from 8, at most a quarter more rows
    than needed plus one); ``types``: on a graph of several node types, its rows' types and
    edges' relations (None: one type, one relation). A type's padding rows follow a level's
    real rows, its padding edges a hop's real edges, so each type's rows and each relation's
    edges stay in hop order. ValueError when ``sub``'s edges are not grouped by the hop of
    their destination."""
    levels = list(sub.level_sizes)
    edge_index = sub.edge_index.cpu().numpy()
    starts = _starts(levels)
    hop_edges = _hop_edges(edge_index[1], starts)
    node, edge = sub.node.cpu().numpy(), sub.edge.cpu().numpy()
    if types is None:
        row_type = np.zeros(len(node), dtype=np.int64)
        relation = np.zeros(edge_index.shape[1], dtype=np.int64)
        ends, num_types = np.zeros((1, 2), dtype=np.int64), 1
    else:
        row_type, relation = types.row_type, types.edge_relation
        ends, num_types = types.relation_ends, types.num_types
    # Rows per (level, type) and edges per (hop, relation), each padded to its bucket.
    level_of = np.repeat(np.arange(len(levels)), levels)
    rows = _counts(level_of, row_type, len(levels), num_types)
    hop_of = np.repeat(np.arange(len(hop_edges)), hop_edges)
    edges = _counts(hop_of, relation, len(hop_edges), len(ends))
    padded_rows = _buckets(rows, growth, smallest)
    padded_edges = _buckets(edges, growth, smallest)
    padded_levels = padded_rows.sum(axis=1).tolist()
    padded_hops = padded_edges.sum(axis=1).tolist()
    new_starts, new_edge_starts = _starts(padded_levels), _starts(padded_hops)
    # The first padding row of each (level, type): after the level's real rows, type by type.
    first_padding = (
        np.asarray(new_starts[:-1])[:, None]
        + np.asarray(levels)[:, None]
        + np.cumsum(padded_rows - rows, axis=1)
        - (padded_rows - rows)
    )
    new_node = np.empty(new_starts[-1], dtype=node.dtype)
    new_type = np.empty(new_starts[-1], dtype=np.int64)
    for level, size in enumerate(levels):
        at = new_starts[level]
        new_node[at : at + size] = node[starts[level] : starts[level + 1]]
        new_type[at : at + size] = row_type[starts[level] : starts[level + 1]]
        for kind in range(num_types):
            first, count = first_padding[level, kind], padded_rows[level, kind] - rows[level, kind]
            new_node[first : first + count] = PADDING_NODE - kind
            new_type[first : first + count] = kind
    # Row r of level l moves by the padding of the levels before l.
    shifts = np.subtract(new_starts[:-1], starts[:-1])
    moved = edge_index + np.repeat(shifts, levels)[edge_index]
    edge_starts = _starts(hop_edges)
    new_edge_index = np.empty((2, new_edge_starts[-1]), dtype=edge_index.dtype)
    new_relation = np.empty(new_edge_starts[-1], dtype=np.int64)
    fill_id = (edge[0] if edge.size else 0) if types is None else -1
    new_edge = np.full(new_edge_starts[-1], fill_id, dtype=edge.dtype)
    padding_edges = np.ones(new_edge_starts[-1], dtype=bool)
    for hop, count in enumerate(hop_edges):
        old, new = edge_starts[hop], new_edge_starts[hop]
        new_edge_index[:, new : new + count] = moved[:, old : old + count]
        new_relation[new : new + count] = relation[old : old + count]
        new_edge[new : new + count] = edge[old : old + count]
        padding_edges[new : new + count] = False
        at = new + count
        for kind, (source, target) in enumerate(ends):
            extra = padded_edges[hop, kind] - edges[hop, kind]
            # From the level's first padding row of the source type to that of the
            # destination type: a padding edge touches padding rows only.
            new_edge_index[0, at : at + extra] = first_padding[hop, source]
            new_edge_index[1, at : at + extra] = first_padding[hop, target]
            new_relation[at : at + extra] = kind
            at += extra
    padded = SampledSubgraph(
        node=torch.from_numpy(new_node),
        edge_index=torch.from_numpy(new_edge_index),
        edge=torch.from_numpy(new_edge),
        num_seeds=sub.num_seeds,
        level_sizes=tuple(padded_levels),
        boundary=sub.boundary,
    )
    return PaddedSubgraph(
        padded,
        tuple(padded_hops),
        type_rows=tuple(tuple(level) for level in padded_rows.tolist()),
        relation_edges=tuple(tuple(hop) for hop in padded_edges.tolist()),
        types=None if types is None else RowTypes(new_type, new_relation, ends, num_types),
        padding_edges=None if types is None else padding_edges,
    )


def _buckets(counts: np.ndarray, growth: float, smallest: int) -> np.ndarray:
    sizes = [bucket(int(n), growth, smallest) for n in counts.reshape(-1)]
    return np.asarray(sizes, dtype=np.int64).reshape(counts.shape)


def _counts(group: np.ndarray, kind: np.ndarray, groups: int, kinds: int) -> np.ndarray:
    """``[groups, kinds]``: how many entries of each kind each group holds."""
    flat = np.bincount(group * kinds + kind, minlength=groups * kinds)
    return flat.reshape(groups, kinds)


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
