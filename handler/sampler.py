"""Deterministic k-hop in-neighbour sampler on a CSC graph, vectorized torch (CPU or CUDA).

pyg-lib and torch-sparse are not installable everywhere we run, so PyG's ``NeighborLoader`` is
not available; this sampler is ours. Its one design rule: the in-neighbours chosen for a
``(node, hop)`` pair depend only on that pair, the graph and a configured seed. Rows of the
sampled subgraph are ``(node, hop)`` pairs, so each row has one fixed in-edge set, and a seed's
answer does not depend on which other seeds share its batch or which worker serves it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from graph_assets.overlay import GraphOverlay
from handler.settings import parse_fanouts

# splitmix64 constants, as signed int64 so that torch's wrapping int64 arithmetic applies.
_MIX_1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_MIX_2 = 0x94D049BB133111EB - (1 << 64)
_GOLDEN = 0x9E3779B97F4A7C15
_LOW_63 = (1 << 63) - 1
ALL_NEIGHBOURS = -1


class SubgraphTooLarge(Exception):
    """The ego-graph would exceed the configured node or edge limit; raised before building it."""

    def __init__(self, nodes: int, edges: int, max_nodes: int, max_edges: int) -> None:
        super().__init__(
            f"the sampled ego-graph would have at least {nodes} nodes and {edges} edges; "
            f"the limits are {max_nodes} nodes and {max_edges} edges"
        )
        self.nodes = nodes
        self.edges = edges


@dataclass(frozen=True)
class SampledSubgraph:
    """An ego-graph ready for a forward pass.

    Attributes:
        node: global node index of every row; rows ``0..num_seeds-1`` are the seeds, in the order
            given to :meth:`NeighbourSampler.sample`.
        edge_index: ``[2, E]`` local row indices, ``edge_index[0]`` -> ``edge_index[1]``
            (message direction); only rows of hops ``< k`` have in-edges.
        num_seeds: how many leading rows are seeds.
        level_sizes: rows per hop, hop 0 first.
    """

    node: torch.Tensor
    edge_index: torch.Tensor
    num_seeds: int
    level_sizes: tuple[int, ...]

    @property
    def num_nodes(self) -> int:
        return int(self.node.numel())

    @property
    def num_edges(self) -> int:
        return int(self.edge_index.shape[1])


def _as_int64(value: int) -> int:
    """Wraps a Python int to the signed int64 that torch arithmetic would produce."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's ``>>`` is arithmetic on signed ints)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """splitmix64 finaliser: a counter-based hash, identical on CPU and CUDA."""
    x = (x ^ _shift_right(x, 30)) * _MIX_1
    x = (x ^ _shift_right(x, 27)) * _MIX_2
    return x ^ _shift_right(x, 31)


def _ragged_arange(counts: torch.Tensor) -> torch.Tensor:
    """``cat([arange(c) for c in counts])`` without a Python loop."""
    total = int(counts.sum())
    ends = torch.cumsum(counts, 0)
    offsets = torch.repeat_interleave(ends - counts, counts, output_size=total)
    return torch.arange(total, device=counts.device) - offsets


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
    ) -> None:
        self.indptr = indptr
        self.indices = indices
        self.fanouts = parse_fanouts(list(fanouts))
        self.max_nodes = max_nodes
        self.max_edges = max_edges
        self.overlay = overlay
        base = torch.tensor([seed & _LOW_63, graph_key & _LOW_63], dtype=torch.int64)
        self._base_key = int(_mix(_mix(base[0:1]) ^ base[1:2]).item())
        self._salts: dict[tuple[int, int, torch.device], torch.Tensor] = {}

    @property
    def num_hops(self) -> int:
        return len(self.fanouts)

    def sample(self, seeds: torch.Tensor) -> SampledSubgraph:
        """Samples the union ego-graph of ``seeds`` (unique global indices, any order)."""
        device = self.indptr.device
        levels = [seeds.to(device=device, dtype=torch.int64)]
        src_parts: list[torch.Tensor] = []
        dst_parts: list[torch.Tensor] = []
        offset = 0
        total_nodes = int(seeds.numel())
        total_edges = 0
        for hop, fanout in enumerate(self.fanouts):
            frontier = levels[-1]
            rows, neighbours = self._sample_hop(frontier, hop, fanout, total_nodes, total_edges)
            next_level, inverse = torch.unique(neighbours, return_inverse=True)
            next_offset = offset + int(frontier.numel())
            src_parts.append(next_offset + inverse)
            dst_parts.append(offset + rows)
            total_nodes += int(next_level.numel())
            total_edges += int(neighbours.numel())
            self._check_limits(total_nodes, total_edges)
            levels.append(next_level)
            offset = next_offset
        edge_index = torch.stack([torch.cat(src_parts), torch.cat(dst_parts)])
        return SampledSubgraph(
            node=torch.cat(levels),
            edge_index=edge_index,
            num_seeds=int(seeds.numel()),
            level_sizes=tuple(int(level.numel()) for level in levels),
        )

    def _check_limits(self, nodes: int, edges: int) -> None:
        if nodes > self.max_nodes or edges > self.max_edges:
            raise SubgraphTooLarge(nodes, edges, self.max_nodes, self.max_edges)

    def _sample_hop(
        self, frontier: torch.Tensor, hop: int, fanout: int, nodes_so_far: int, edges_so_far: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (frontier row of each sampled edge, its source node).

        Nodes whose in-edges changed since the base graph was built read them from the overlay;
        the others from the base CSC arrays.
        """
        overlay = self.overlay
        if overlay is None or overlay.is_empty:
            return self._sample_csc(
                self.indptr,
                self.indices,
                frontier,
                frontier,
                hop,
                fanout,
                nodes_so_far,
                edges_so_far,
            )
        device = frontier.device
        dirty = torch.from_numpy(overlay.dirty_mask(frontier.cpu().numpy())).to(device)
        clean_rows = torch.nonzero(~dirty).flatten()
        dirty_rows = torch.nonzero(dirty).flatten()
        rows, neighbours = self._sample_csc(
            self.indptr,
            self.indices,
            frontier[clean_rows],
            frontier[clean_rows],
            hop,
            fanout,
            nodes_so_far,
            edges_so_far,
        )
        changed = overlay.in_edges(frontier[dirty_rows].cpu().numpy())
        more_rows, more_neighbours = self._sample_csc(
            torch.from_numpy(changed.indptr).to(device),
            torch.from_numpy(changed.indices).to(device),
            torch.arange(dirty_rows.numel(), device=device),
            frontier[dirty_rows],
            hop,
            fanout,
            nodes_so_far,
            edges_so_far + neighbours.numel(),
        )
        return (
            torch.cat([clean_rows[rows], dirty_rows[more_rows]]),
            torch.cat([neighbours, more_neighbours]),
        )

    def _sample_csc(
        self,
        indptr: torch.Tensor,
        indices: torch.Tensor,
        position: torch.Tensor,
        nodes: torch.Tensor,
        hop: int,
        fanout: int,
        nodes_so_far: int,
        edges_so_far: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Samples the in-edges of ``nodes``, found at ``position`` in (``indptr``, ``indices``);
        the random draws depend on ``nodes`` (global IDs), not on where their lists live."""
        starts = indptr[position].to(torch.int64)
        counts = indptr[position + 1].to(torch.int64) - starts
        take = counts if fanout == ALL_NEIGHBOURS else torch.clamp(counts, max=fanout)
        new_edges = int(take.sum())
        # Each new edge brings at most one new row: check before gathering anything.
        self._check_limits(nodes_so_far, edges_so_far + new_edges)
        rows = torch.repeat_interleave(
            torch.arange(nodes.numel(), device=nodes.device), take, output_size=new_edges
        )
        chosen = starts[rows] + self._choose(nodes, hop, counts, take, rows)
        return rows, indices[chosen].to(torch.int64)

    def _choose(
        self,
        frontier: torch.Tensor,
        hop: int,
        counts: torch.Tensor,
        take: torch.Tensor,
        rows: torch.Tensor,
    ) -> torch.Tensor:
        """Offsets into each row's neighbour list, laid out row by row like ``rows``."""
        offsets = _ragged_arange(take)
        partial = take < counts
        if not bool(partial.any()):
            return offsets
        fanout = int(take[partial].max())
        chosen = self._floyd(frontier[partial], hop, counts[partial], fanout)
        # Rows that keep only a subset read their offsets from Floyd's choice instead.
        partial_rank = torch.cumsum(partial.to(torch.int64), 0) - 1
        edge_partial = partial[rows]
        edge_rows = rows[edge_partial]
        offsets[edge_partial] = chosen[partial_rank[edge_rows], offsets[edge_partial]]
        return offsets

    def _floyd(
        self, nodes: torch.Tensor, hop: int, counts: torch.Tensor, fanout: int
    ) -> torch.Tensor:
        """Floyd's algorithm: ``fanout`` distinct offsets in ``[0, count)`` per node, O(fanout²).

        The random draws are hashes of (node, hop, step, seed, graph), so they are repeatable.
        All ``fanout`` draws are hashed at once, as an ``[n, fanout]`` matrix; only the collision
        fix-up is sequential over steps (a few tensor ops per step, not a whole hash: per-op
        overhead dominates at these sizes).
        """
        device = nodes.device
        key = _mix(nodes ^ self._base_key)
        salts = self._salts.get((hop, fanout, device))
        if salts is None:
            salts = torch.tensor(
                [_as_int64((hop * 4096 + step + 1) * _GOLDEN) for step in range(fanout)],
                dtype=torch.int64,
                device=device,
            )
            self._salts[(hop, fanout, device)] = salts
        draws = _mix(key[:, None] + salts)
        # Step s draws uniformly from [0, limit_s], limit_s = count - fanout + s.
        limits = counts[:, None] + torch.arange(-fanout, 0, device=device)
        chosen = (draws & _LOW_63) % (limits + 1)
        if chosen.device.type == "cpu":  # numpy views of the same memory: 5x less per-op cost
            _keep_or_take_limit(chosen.numpy(), limits.numpy(), np.where)
        else:
            _keep_or_take_limit(chosen, limits, torch.where)
        return chosen


def _keep_or_take_limit(chosen: Any, limits: Any, where: Callable[..., Any]) -> None:
    """Floyd's sequential step, in place: step s keeps its draw unless an earlier step chose
    it, then takes ``limit_s``. Written once for numpy arrays and torch tensors alike."""
    for step in range(1, chosen.shape[1]):
        candidate = chosen[:, step]
        seen = (chosen[:, :step] == candidate[:, None]).any(1)
        chosen[:, step] = where(seen, limits[:, step], candidate)
