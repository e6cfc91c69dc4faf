"""Deterministic k-hop in-neighbour sampler on a CSC graph: compiled hops on the CPU
(handler.sampling.sampler_kernels), vectorised torch on a GPU, the same draws bit for bit.

pyg-lib and torch-sparse are not installable everywhere we run, so PyG's ``NeighborLoader`` is
not available; this sampler is ours. Its one design rule: the in-neighbours chosen for a
``(node, hop)`` pair depend only on that pair, the graph and a configured seed. Rows of the
sampled subgraph are ``(node, hop)`` pairs, so each row has one fixed in-edge set, and a seed's
answer does not depend on which other seeds share its batch or which worker serves it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from graph_assets.errors import SubgraphTooLarge
from graph_assets.graph_view import GraphView
from graph_assets.live.overlay import GraphOverlay
from graph_assets.remote import RemoteStore
from graph_assets.stored.store import GraphStore
from handler.sampling import sampler_kernels
from handler.sampling.arrays import Array, ArrayOps, ops_for, readonly_tensor
from handler.settings import ServingSettings, parse_fanouts

# splitmix64 constants, as signed int64 so that wrapping int64 arithmetic applies.
_MIX_1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_MIX_2 = 0x94D049BB133111EB - (1 << 64)
_GOLDEN = 0x9E3779B97F4A7C15
_LOW_63 = (1 << 63) - 1
ALL_NEIGHBOURS = -1


@dataclass(frozen=True)
class SampledSubgraph:
    """An ego-graph ready for a forward pass.

    Attributes:
        node: global node index of every row; rows ``0..num_seeds-1`` are the seeds, in the order
            given to :meth:`NeighbourSampler.sample`.
            A boundary row (see ``boundary``) has node ``-1`` and zero features.
        edge_index: ``[2, E]`` local row indices, ``edge_index[0]`` -> ``edge_index[1]``
            (message direction), grouped by the hop of their destination; only rows of hops
            ``< k`` have in-edges (and hop ``k`` rows with a boundary). A self-loop of the graph
            is a self-loop of its row, so layers that replace self-loops see it as one.
        edge: ``[E]`` the graph's edge ID of each edge, as PyG's ``SamplerOutput.edge``: its
            CSC position, or for an edge a live update added the ID the overlay gave it.
        num_seeds: how many leading rows are seeds.
        level_sizes: rows per hop, hop 0 first (a boundary adds one last level of one row).
        boundary: the deepest hop's rows also have their whole in-edge lists, every source
            being one zero-feature row: their in-degrees (and edge weights) are the graph's, as
            a degree-normalising layer (GCNConv, SGConv, APPNP, ...) needs for its sources,
            while no output that a seed reads depends on that row.
    """

    node: torch.Tensor
    edge_index: torch.Tensor
    edge: torch.Tensor
    num_seeds: int
    level_sizes: tuple[int, ...]
    boundary: bool = False

    @property
    def num_nodes(self) -> int:
        return int(self.node.numel())

    @property
    def num_edges(self) -> int:
        return int(self.edge_index.shape[1])


@dataclass(frozen=True)
class RelationSegments:
    """Where each relation's in-edges sit in the in-lists of a graph with several relations
    (``graph_assets.schema``: node types hold global ranges, a node's in-list holds one
    segment per relation into its type), and how many of them each hop samples.

    Attributes:
        dst_range: per relation, the global range ``[start, stop)`` of its destination type
            in the stored graph (nodes added by updates lie beyond every range).
        dst_type: per relation, the index of its destination node type.
        starts, ends: per relation, ``[n_dst]`` absolute CSC positions of each destination's
            segment (by its index within its type); empty for a graph read through its view
            (a remote store), whose segments each hop finds from its in-lists' relations.
        src_type: per relation, the index of its source node type.
        fanouts: per relation, neighbours kept per hop (``-1``: all).
        whole: per relation, its segments are whole in-lists (its destination type has no
            other relation into it), so a hop reads them from the CSC pointers at the nodes'
            global indices in the same pass as it draws.
        one_type: the graph has one node type, so every frontier row is a destination of
            every relation (no row needs its type looked up).

    A graph of one type and one relation is the one-relation case (:meth:`one_relation`).
    """

    dst_range: tuple[tuple[int, int], ...]
    dst_type: tuple[int, ...]
    starts: tuple[Array, ...]
    ends: tuple[Array, ...]
    src_type: tuple[int, ...]
    fanouts: tuple[tuple[int, ...], ...]
    whole: tuple[bool, ...]
    one_type: bool

    @classmethod
    def one_relation(cls, fanouts: Sequence[int]) -> RelationSegments:
        """The segments of a graph of one node type and one relation: whole in-lists."""
        return cls(((0, _LOW_63),), (0,), (), (), (0,), (tuple(fanouts),), (True,), True)

    @classmethod
    def of(
        cls, store: GraphStore | RemoteStore, settings: ServingSettings, ops: ArrayOps
    ) -> RelationSegments:
        """The store's segments with the archive's fanouts per relation (ValueError naming
        the graph's relations for a relation it does not have)."""
        schema = store.schema
        unknown = sorted(set(settings.relation_fanouts) - set(schema.edge_type_names))
        if unknown:
            raise ValueError(
                f"relation_fanouts names {', '.join(unknown)}, which this graph does not have; "
                f"its edge types are {', '.join(schema.edge_type_names)}"
            )
        dst_range, dst_type, src_type, fanouts, whole = [], [], [], [], []
        for relation in schema.relations:
            dst = schema.type_index(relation.edge_type.dst)
            node_type = schema.node_types[dst]
            dst_range.append((node_type.offset, node_type.stop))
            dst_type.append(dst)
            src_type.append(schema.type_index(relation.edge_type.src))
            fanouts.append(settings.fanouts_of(relation.name))
            whole.append(len(schema.relations_into(node_type.name)) == 1)
        starts, ends = _segment_bounds(store, ops) if isinstance(store, GraphStore) else ((), ())
        return cls(
            tuple(dst_range),
            tuple(dst_type),
            starts,
            ends,
            tuple(src_type),
            tuple(fanouts),
            tuple(whole),
            len(schema.node_types) == 1,
        )


def _segment_bounds(store: GraphStore, ops: ArrayOps) -> tuple[tuple[Array, ...], ...]:
    """Per relation, where each destination's segment of its in-list starts and ends in the
    mapped CSC arrays: the pointers themselves for a type with one relation into it, its
    ``relation_bounds`` columns otherwise."""
    schema = store.schema
    indptr = ops.from_numpy(np.asarray(store.indptr, dtype=np.int64))
    starts, ends = [], []
    for relation in schema.relations:
        dst = schema.type_index(relation.edge_type.dst)
        node_type = schema.node_types[dst]
        into = schema.relations_into(node_type.name)
        if len(into) == 1:
            starts.append(indptr[node_type.offset : node_type.stop])
            ends.append(indptr[node_type.offset + 1 : node_type.stop + 1])
        else:
            slot = into.index(schema.relation_index(relation.name))
            bounds = np.asarray(store.relation_bounds[dst], dtype=np.int64)
            starts.append(ops.from_numpy(np.ascontiguousarray(bounds[:, slot])))
            ends.append(ops.from_numpy(np.ascontiguousarray(bounds[:, slot + 1])))
    return tuple(starts), tuple(ends)


def boundary_node(node_type: int) -> int:
    """The node label of the zero-feature boundary row of sources of ``node_type``."""
    return -1 - node_type


def _as_int64(value: int) -> int:
    """Wraps a Python int to the signed int64 that int64 array arithmetic would produce."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def _shift_right(x: Array, bits: int) -> Array:
    """Logical right shift of int64 (``>>`` is arithmetic on signed ints)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _mix(x: Array) -> Array:
    """splitmix64 finaliser: a counter-based hash, identical in numpy and torch, CPU and CUDA."""
    x = (x ^ _shift_right(x, 30)) * _MIX_1
    x = (x ^ _shift_right(x, 27)) * _MIX_2
    return x ^ _shift_right(x, 31)


def _relation_salt(relation: int) -> int:
    """What a relation adds to a node's key: relation 0 adds 0, so a graph's only relation
    draws what a graph of one relation did."""
    return _as_int64(relation * _GOLDEN)


def _ragged_arange(ops: ArrayOps, counts: Array) -> Array:
    """``cat([arange(c) for c in counts])`` without a Python loop."""
    total = int(counts.sum())
    ends = ops.cumsum(counts)
    return ops.arange(total) - ops.repeat(ends - counts, counts, total)


@dataclass(frozen=True)
class _HopPart:
    """A hop's sampled in-edges of one relation: frontier row, source node and edge ID of each."""

    rows: Array
    sources: Array
    edges: Array
    relation: int


def _joined(parts: list[_HopPart], ops: ArrayOps) -> tuple[Array, Array, Array]:
    """(rows, sources, edge IDs) of a hop's parts, in order (no copy for one part)."""
    if len(parts) == 1:
        return parts[0].rows, parts[0].sources, parts[0].edges
    if not parts:
        empty = ops.arange(0)
        return empty, empty, empty
    return (
        ops.cat([part.rows for part in parts]),
        ops.cat([part.sources for part in parts]),
        ops.cat([part.edges for part in parts]),
    )


@dataclass(frozen=True)
class _RelationLists:
    """In-lists of some nodes read through a graph view (the overlay's, or a remote store's),
    grouped by relation as stored ones are, with where each relation's segment of each list
    starts."""

    indices: np.ndarray
    edge_ids: np.ndarray
    keys: np.ndarray  # per edge: its list's position * relations + its relation, ascending
    relations: int

    @classmethod
    def of(cls, view: GraphView, nodes: np.ndarray, relations: int) -> _RelationLists:
        lists = view.in_lists(nodes)
        owner = np.repeat(np.arange(len(nodes), dtype=np.int64), np.diff(lists.indptr))
        keys = owner * relations + lists.relations
        return cls(lists.indices, lists.edge_ids, keys, relations)

    def segment(self, lists: np.ndarray, relation: int) -> tuple[np.ndarray, np.ndarray]:
        """(start, count) of ``relation``'s segment in each of ``lists``."""
        wanted = lists.astype(np.int64) * self.relations + relation
        starts = np.searchsorted(self.keys, wanted, side="left")
        ends = np.searchsorted(self.keys, wanted, side="right")
        return starts.astype(np.int64), (ends - starts).astype(np.int64)


class NeighbourSampler:
    """Samples k-hop in-neighbourhoods from CSC arrays (``indptr``, ``indices``).

    Args:
        indptr: ``[N+1]`` CSC pointers; in-edges of ``v`` are ``indices[indptr[v]:indptr[v+1]]``.
        indices: ``[E]`` source node of each in-edge.
        fanouts: neighbours kept per hop, hop 0 first; ``-1`` keeps all of them.
        seed: the configured sampling seed.
        graph_key: an integer derived from the graph's checksum, so a new graph version draws
            new samples.
        max_nodes, max_edges: a sample that would exceed either raises :class:`SubgraphTooLarge`
            before it is built.
        overlay: live updates on top of the base arrays (changed in-edges, new nodes).
        boundary: add the deepest hop's whole in-edge lists from one zero-feature row
            (:class:`SampledSubgraph` says why); on a graph of several node types, one per
            source type (``boundary_node``).
        relations: a graph with several relations: each hop samples each relation's segment of
            an in-list with the relation's own fanout (``fanouts`` then only counts the hops).
            Without it the graph is the one-relation case (``RelationSegments.one_relation``
            of ``fanouts``): one hop routine samples every graph, with the same draws.
        ops: the array library to sample with; by default numpy for CPU tensors (views of the
            same memory), with compiled hops, and torch on their device otherwise
            (handler.sampling.arrays says why). The hops are compiled here, not on a request.
        view: a graph that is not mapped here (a remote store): each hop reads its frontier's
            in-lists, every relation at once, in one ``view.in_lists`` call and samples them
            with the same draws, so the ego-graph is the stored arrays' (``indptr`` and
            ``indices`` are then empty and only name the device; with live updates the
            overlay's in-lists are read, the overlay reading its base's in one call).
    """

    def __init__(
        self,
        indptr: torch.Tensor,
        indices: torch.Tensor,
        fanouts: Sequence[int],
        seed: int,
        graph_key: int,
        max_nodes: int,
        max_edges: int,
        overlay: GraphOverlay | None = None,
        boundary: bool = False,
        ops: ArrayOps | None = None,
        relations: RelationSegments | None = None,
        view: GraphView | None = None,
    ) -> None:
        self.view = view
        self.relations = relations
        self.fanouts = parse_fanouts(list(fanouts))
        self._segments = relations or RelationSegments.one_relation(self.fanouts)
        self.ops = ops or ops_for(indptr.device)
        self.device = indptr.device
        self.indptr, self.indices = indptr, indices
        # The same memory as the ops' arrays (numpy views on the CPU).
        self._indptr, self._indices = self.ops.from_torch(indptr), self.ops.from_torch(indices)
        self.max_nodes = max_nodes
        self.max_edges = max_edges
        self.overlay = overlay
        self.boundary = boundary
        self._seed, self._graph_key = seed, graph_key
        self._base_key = _as_int64(
            int(_mix(_mix(self.ops.of_ints([seed & _LOW_63])) ^ (graph_key & _LOW_63))[0])
        )
        self._salts: dict[tuple[int, int], Array] = {}
        if self.ops.fused:
            lists = overlay is not None or view is not None
            sampler_kernels.warm(self._indptr.dtype, self._indices.dtype, lists)

    @property
    def num_hops(self) -> int:
        return len(self.fanouts)

    def with_fanouts(
        self, fanouts: Sequence[int], relations: RelationSegments | None = None
    ) -> NeighbourSampler:
        """A sampler of the same graph, seed, limits and live updates with other fanouts (cold
        start samples one hop at a time), sharing this one's arrays; without a boundary. On a
        graph of several relations, ``relations`` holds each one's fanouts (default: these)."""
        return NeighbourSampler(
            self.indptr,
            self.indices,
            fanouts=fanouts,
            seed=self._seed,
            graph_key=self._graph_key,
            max_nodes=self.max_nodes,
            max_edges=self.max_edges,
            overlay=self.overlay,
            ops=self.ops,
            relations=self.relations if relations is None else relations,
            view=self.view,
        )

    def sample(self, seeds: torch.Tensor) -> SampledSubgraph:
        """Samples the union ego-graph of ``seeds`` (unique global indices, any order)."""
        ops = self.ops
        levels = [ops.int64(ops.from_torch(seeds.to(self.device)))]
        src_parts: list[Array] = []
        dst_parts: list[Array] = []
        edge_parts: list[Array] = []
        offset = 0
        total_nodes = len(levels[0])
        total_edges = 0
        for hop in range(self.num_hops):
            frontier = levels[-1]
            rows, neighbours, edges = _joined(
                self._sample_hop(frontier, hop, None, total_nodes, total_edges), ops
            )
            next_offset = offset + len(frontier)
            next_level, sources = self._relabel(frontier, rows, neighbours, offset, next_offset)
            src_parts.append(sources)
            dst_parts.append(offset + rows)
            edge_parts.append(edges)
            total_nodes += len(next_level)
            total_edges += len(neighbours)
            self._check_limits(total_nodes, total_edges)
            levels.append(next_level)
            offset = next_offset
        if self.boundary:
            frontier = levels[-1]
            dummy = offset + len(frontier)
            parts = self._sample_hop(
                frontier, self.num_hops, ALL_NEIGHBOURS, total_nodes, total_edges
            )
            # One zero-feature row per source type the boundary's edges come from (a graph of
            # one type has its one row, edges or not), in type order.
            src_type = self._segments.src_type
            present = sorted({src_type[part.relation] for part in parts})
            if not present and self._segments.one_type:
                present = [0]
            row_of = {node_type: dummy + rank for rank, node_type in enumerate(present)}
            sources = ops.cat(
                [ops.int64(part.rows) * 0 + row_of[src_type[part.relation]] for part in parts]
                or [ops.arange(0)]
            )
            rows, neighbours, edges = _joined(parts, ops)
            boundary_rows = ops.of_ints([-1 - node_type for node_type in present])
            src_parts.append(self_loops_in_place(frontier, rows, neighbours, offset, sources, ops))
            dst_parts.append(offset + rows)
            edge_parts.append(edges)
            self._check_limits(total_nodes + len(boundary_rows), total_edges + len(neighbours))
            levels.append(boundary_rows)
        if not edge_parts:  # no hop (a model without message passing): the seeds alone
            src_parts = dst_parts = edge_parts = [ops.of_ints([])]
        edge_index = ops.stack([ops.cat(src_parts), ops.cat(dst_parts)])
        return SampledSubgraph(
            node=ops.to_torch(ops.cat(levels)),
            edge_index=ops.to_torch(edge_index),
            edge=ops.to_torch(ops.cat(edge_parts)),
            num_seeds=len(levels[0]),
            level_sizes=tuple(len(level) for level in levels),
            boundary=self.boundary,
        )

    def _relabel(
        self, frontier: Array, rows: Array, neighbours: Array, offset: int, next_offset: int
    ) -> tuple[Array, Array]:
        """(next level: the hop's sources, unique and ascending; each edge's local source row,
        ``self_loops_in_place``)."""
        if self.ops.fused:
            return sampler_kernels.relabel(neighbours, frontier, rows, offset, next_offset)
        next_level, inverse = self.ops.unique_inverse(neighbours)
        sources = self_loops_in_place(
            frontier, rows, neighbours, offset, next_offset + inverse, self.ops
        )
        return next_level, sources

    def _lists_source(self) -> GraphView:
        """Where lists that are not read from the mapped arrays come from: the overlay when it
        holds updates (its base's lists in one read of the base), else the remote view."""
        if self.overlay is not None and not self.overlay.is_empty:
            return self.overlay
        assert self.view is not None
        return self.view

    def _check_limits(self, nodes: int, edges: int) -> None:
        if nodes > self.max_nodes or edges > self.max_edges:
            raise SubgraphTooLarge(nodes, edges, self.max_nodes, self.max_edges)

    def _sample_hop(
        self,
        frontier: Array,
        hop: int,
        fanout: int | None,
        nodes_so_far: int,
        edges_so_far: int,
    ) -> list[_HopPart]:
        """One hop: each relation's segment of the in-list of each frontier node of its
        destination type, with the relation's fanout (``fanout`` overrides it). Nodes whose
        in-edges changed (or were added) read their segments from the overlay's in-lists,
        which keep the same grouping; on a graph read through its view every node does, from
        one read. Returns the sampled edges relation by relation, each one's unchanged rows
        first."""
        ops, segments, overlay = self.ops, self._segments, self.overlay
        live = overlay is not None and not overlay.is_empty
        nodes_np = ops.to_numpy(frontier)
        dirty = overlay.dirty_mask(nodes_np) if live and overlay else None
        types = None
        if live and overlay and not segments.one_type:
            types = overlay.types_of(nodes_np)
        if self.view is not None:
            dirty = np.ones(len(nodes_np), dtype=bool)
        changed = None
        if dirty is not None and dirty.any():
            changed = _RelationLists.of(
                self._lists_source(), nodes_np[dirty], len(segments.dst_range)
            )
            changed_row = np.cumsum(dirty) - 1  # a dirty frontier row's place in ``changed``
        else:
            dirty = None  # no changed node in this frontier: the base arrays alone
        parts: list[_HopPart] = []
        for relation, (start, stop) in enumerate(segments.dst_range):
            count = segments.fanouts[relation][hop] if fanout is None else fanout
            if segments.one_type:
                mine = None
            elif types is None:
                mine = (frontier >= start) & (frontier < stop)
            else:
                mine = ops.from_numpy(types == segments.dst_type[relation])
            clean = self._clean_rows(frontier, mine, dirty)
            if clean is None or len(clean):
                nodes = frontier if clean is None else frontier[clean]
                if segments.whole[relation]:
                    rows, neighbours, chosen = self._sample_csc(
                        self._indptr, self._indices, nodes, nodes, hop, count, relation,
                        nodes_so_far, edges_so_far,
                    )  # fmt: skip
                else:
                    starts = ops.int64(segments.starts[relation][nodes - start])
                    counts = ops.int64(segments.ends[relation][nodes - start]) - starts
                    rows, neighbours, chosen = self._sample_segments(
                        self._indices, starts, counts, nodes, hop, count, relation,
                        nodes_so_far, edges_so_far,
                    )  # fmt: skip
                edges_so_far += len(neighbours)
                found = rows if clean is None else clean[rows]
                parts.append(_HopPart(found, neighbours, chosen, relation))
            if changed is None:
                continue
            assert dirty is not None
            position = np.flatnonzero(dirty if mine is None else ops.to_numpy(mine) & dirty)
            if not len(position):
                continue
            lists = changed_row[position]
            starts_np, counts_np = changed.segment(lists, relation)
            rows, neighbours, chosen = self._sample_segments(
                ops.from_numpy(changed.indices), ops.from_numpy(starts_np),
                ops.from_numpy(counts_np), frontier[ops.from_numpy(position)], hop, count,
                relation, nodes_so_far, edges_so_far,
            )  # fmt: skip
            edges_so_far += len(neighbours)
            edge_ids = ops.from_numpy(changed.edge_ids)[chosen]
            parts.append(_HopPart(ops.from_numpy(position)[rows], neighbours, edge_ids, relation))
        return parts

    def _clean_rows(
        self, frontier: Array, mine: Array | None, dirty: np.ndarray | None
    ) -> Array | None:
        """Rows of a relation's destinations whose in-lists are the stored ones (``None``:
        every row of the frontier, the common case, with no index built)."""
        if dirty is None:
            return None if mine is None else self.ops.flatnonzero(mine)
        unchanged = ~self.ops.from_numpy(dirty)
        return self.ops.flatnonzero(unchanged if mine is None else mine & unchanged)

    def _sample_csc(
        self,
        indptr: Array,
        indices: Array,
        position: Array,
        nodes: Array,
        hop: int,
        fanout: int,
        relation: int,
        nodes_so_far: int,
        edges_so_far: int,
    ) -> tuple[Array, Array, Array]:
        """Samples the in-edges of ``nodes``, found at ``position`` in (``indptr``, ``indices``);
        the random draws depend on ``nodes`` (global IDs), not on where their lists live.
        Returns (row, source, position of the edge in ``indices``)."""
        ops = self.ops
        if ops.fused:
            drawn = sampler_kernels.draw_csc(
                indptr, indices, position, nodes, fanout, _relation_salt(relation),
                self._base_key, self._salts_of(hop, fanout), self.max_edges - edges_so_far,
            )  # fmt: skip
            return self._within_limits(drawn, nodes_so_far, edges_so_far)
        starts = ops.int64(indptr[position])
        counts = ops.int64(indptr[position + 1]) - starts
        return self._sample_segments(
            indices, starts, counts, nodes, hop, fanout, relation, nodes_so_far, edges_so_far
        )

    def _sample_segments(
        self,
        indices: Array,
        starts: Array,
        counts: Array,
        nodes: Array,
        hop: int,
        fanout: int,
        relation: int,
        nodes_so_far: int,
        edges_so_far: int,
    ) -> tuple[Array, Array, Array]:
        """Samples up to ``fanout`` of the ``counts[i]`` in-edges at ``starts[i]`` of each of
        ``nodes``; the draws depend on (node, hop, relation). Returns (row, source, position
        of the edge in ``indices``)."""
        ops = self.ops
        if ops.fused:
            drawn = sampler_kernels.draw_segments(
                indices, starts, counts, nodes, fanout, _relation_salt(relation), self._base_key,
                self._salts_of(hop, fanout), self.max_edges - edges_so_far,
            )  # fmt: skip
            return self._within_limits(drawn, nodes_so_far, edges_so_far)
        take = counts if fanout == ALL_NEIGHBOURS else ops.clamp_max(counts, fanout)
        new_edges = int(take.sum())
        # Each new edge brings at most one new row: check before gathering anything.
        self._check_limits(nodes_so_far, edges_so_far + new_edges)
        rows = ops.repeat(ops.arange(len(nodes)), take, new_edges)
        chosen = starts[rows] + self._choose(nodes, hop, counts, take, rows, relation)
        return rows, ops.int64(indices[chosen]), chosen

    def _within_limits(
        self, drawn: tuple[Array, Array, Array, int], nodes_so_far: int, edges_so_far: int
    ) -> tuple[Array, Array, Array]:
        """A kernel's (row, source, position), or SubgraphTooLarge for its total as the
        vectorised steps raise it (past ``max_edges`` the kernel gathered nothing)."""
        rows, sources, chosen, total = drawn
        self._check_limits(nodes_so_far, edges_so_far + total)
        return rows, sources, chosen

    def _choose(
        self, frontier: Array, hop: int, counts: Array, take: Array, rows: Array, relation: int
    ) -> Array:
        """Offsets into each row's neighbour list, laid out row by row like ``rows``."""
        ops = self.ops
        offsets = _ragged_arange(ops, take)
        partial = take < counts
        if not bool(partial.any()):
            return offsets
        fanout = int(take[partial].max())
        chosen = self._floyd(frontier[partial], hop, counts[partial], fanout, relation)
        # Rows that keep only a subset read their offsets from Floyd's choice instead.
        partial_rank = ops.cumsum(ops.int64(partial)) - 1
        edge_partial = partial[rows]
        edge_rows = rows[edge_partial]
        offsets[edge_partial] = chosen[partial_rank[edge_rows], offsets[edge_partial]]
        return offsets

    def _floyd(self, nodes: Array, hop: int, counts: Array, fanout: int, relation: int) -> Array:
        """Floyd's algorithm: ``fanout`` distinct offsets in ``[0, count)`` per node, O(fanout²).

        The random draws are hashes of (node, hop, relation, step, seed, graph), so they are
        repeatable (relation 0, a graph's only one, draws what a graph of one relation did).
        All ``fanout`` draws are hashed at once; only the collision fix-up is sequential over
        steps (a few array ops per step, not a whole hash: per-op overhead dominates at these
        sizes). The work is laid out step-major, ``[fanout, n]``, so that each step's check
        reduces over earlier steps' contiguous rows instead of along short strided rows (half
        the time for 320 nodes, a quarter for 3,200); the result is the ``[n, fanout]`` view.
        """
        ops = self.ops
        key = _mix((nodes ^ self._base_key) + _relation_salt(relation))
        draws = _mix(self._salts_of(hop, fanout)[:, None] + key)
        # Step s draws uniformly from [0, limit_s], limit_s = count - fanout + s.
        limits = ops.arange(-fanout, 0)[:, None] + counts
        chosen = (draws & _LOW_63) % (limits + 1)
        # Floyd keeps step s's draw unless an earlier step chose it, then takes limit_s.
        for step in range(1, fanout):
            candidate = chosen[step]
            seen = (chosen[:step] == candidate).any(0)
            chosen[step] = ops.where(seen, limits[step], candidate)
        return chosen.T

    def _salts_of(self, hop: int, fanout: int) -> Array:
        """What each of a hop's ``fanout`` Floyd steps adds to a node's key (none for -1)."""
        salts = self._salts.get((hop, fanout))
        if salts is None:
            salts = self.ops.of_ints(
                [_as_int64((hop * 4096 + step + 1) * _GOLDEN) for step in range(fanout)]
            )
            self._salts[(hop, fanout)] = salts
        return salts


def self_loops_in_place(
    frontier: Array, rows: Array, neighbours: Array, offset: int, sources: Array, ops: ArrayOps
) -> Array:
    """Local source rows of a hop's edges: a graph self-loop ``v -> v`` reads row ``v`` of the
    destination's own hop (the same state one level deeper would hold), so that layers which
    drop or replace self-loops (GATConv, GCNConv) recognise it as in the full graph."""
    loops = neighbours == frontier[rows]
    if not bool(loops.any()):  # most hops of most graphs: no copy of the sources
        return sources
    return ops.where(loops, offset + rows, sources)


def sampler_for(
    store: GraphStore | RemoteStore,
    settings: ServingSettings,
    device: torch.device,
    overlay: GraphOverlay | None = None,
    boundary: bool = False,
) -> NeighbourSampler:
    """The one way a serving sampler is built: the archive's fanouts, seed and limits, keyed on
    the graph's checksum. A GPU worker samples on the CPU unless ``settings.sampling_device``
    is ``gpu``: then the structure (small next to the features) moves there. A remote store is
    read through its view, one read of in-lists per hop."""
    if settings.sampling_device != "gpu":
        device = torch.device("cpu")
    view: GraphView | None = None
    if isinstance(store, GraphStore):
        indptr, indices = readonly_tensor(store.indptr), readonly_tensor(store.indices)
        if device.type != "cpu":
            indptr, indices = indptr.to(device), indices.to(device)
    else:
        indptr = indices = torch.empty(0, dtype=torch.int64, device=device)
        view = store
    relations = None
    if len(store.schema.relations) > 1:
        relations = RelationSegments.of(store, settings, ops_for(device))
    return NeighbourSampler(
        indptr,
        indices,
        fanouts=settings.fanouts,
        seed=settings.sampling_seed,
        graph_key=int(store.checksum[:15], 16),
        max_nodes=settings.max_subgraph_nodes,
        max_edges=settings.max_subgraph_edges,
        overlay=overlay,
        boundary=boundary,
        relations=relations,
        view=view,
    )
