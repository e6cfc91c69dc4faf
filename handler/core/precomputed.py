""":class:`PrecomputedRows`: a precomputed archive's layer rows (model.precompute), kept equal to
the full-graph forward of the graph version being served.

Every request that changes the graph marks the rows it reaches, in seq order, as soon as it is
applied (the overlay calls :meth:`mark` under the live graph's lock, on every worker and replica
alike):

- layer 0 (the features) changed at the nodes whose feature row was set (new nodes included);
- a node whose in-edges changed (an edge added or removed, a neighbour removed, an in-edge's
  features set: the overlay lists each in ``OverlayChange.in_lists_before``) has a new
  neighbourhood at every layer; with GCN its degree changed too, which changes the weight of
  each of its out-edges, so its out-neighbours are reached at every layer as well;
- row ``v`` of layer ``l`` is reached when ``v`` or one of its in-neighbours was reached at layer
  ``l-1``, or its neighbourhood changed.

A marked row is recomputed from the current rows of its whole in-neighbourhood one layer below,
with ``NodeClassifier.layer`` (the rule the build used), before anything reads it: a read
recomputes the marked rows it needs (and, first, the marked rows those need), and the live
graph's follower recomputes the rest in the background, a bounded number of rows at a time,
between batches. So no answer ever reads a row older than the version it reports, an update is
acknowledged after marking only, and a read pays only for the marked rows it reads. Refreshed
rows replace the stored ones in memory; the stored files are never written.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from graph_assets import GraphStore
from graph_assets.graph_view import GraphView
from graph_assets.overlay import GraphOverlay, OverlayChange
from handler.core.arrays import readonly_tensor
from handler.core.sampler import NeighbourSampler
from model.precompute import (
    CHUNK_EDGES,
    LocalGraph,
    Precomputed,
    layer_rows,
    needs_degree,
    node_level,
)

_UNLIMITED = 1 << 62
# Marked rows the follower recomputes per step between batches (a few ms of holding the graph).
DRAIN_ROWS = 256


@dataclass
class RefreshStats:
    """What marking and refreshing cost so far (the worker's metrics report them)."""

    updates: int = 0  # updates marked
    marked: int = 0  # rows they reached, summed over layers
    rows: int = 0  # rows recomputed
    seconds: float = 0.0  # time spent marking and recomputing
    reads_refreshed: int = 0  # reads that recomputed marked rows they needed first


class PrecomputedRows:
    """Layer rows of every node of the served graph version; ``rows(l, nodes)``."""

    def __init__(
        self,
        precomputed: Precomputed,
        model: torch.nn.Module,
        store: GraphStore,
        overlay: GraphOverlay | None = None,
    ) -> None:
        self.precomputed = precomputed
        self.model = node_level(model)
        self.store = store
        self.overlay = overlay
        self.num_layers = precomputed.num_layers
        self.changed: list[dict[int, np.ndarray]] = [{} for _ in range(self.num_layers)]
        self.pending: list[set[int]] = [set() for _ in range(self.num_layers)]
        self._depth = 0  # > 0 while recomputing: the reads are the refresh's own
        self.out_added: dict[int, set[int]] = {}
        self.stats = RefreshStats()
        self._out_indptr = np.asarray(precomputed.out_indptr, dtype=np.int64)
        self._out_indices = np.asarray(precomputed.out_indices)
        if overlay is not None:
            self._in_neighbourhoods = NeighbourSampler(
                readonly_tensor(store.indptr),
                readonly_tensor(store.indices),
                fanouts=[-1],
                seed=0,
                graph_key=0,
                max_nodes=_UNLIMITED,
                max_edges=_UNLIMITED,
                overlay=overlay,
            )
            if not overlay.is_empty:  # the log was replayed before these rows existed
                self.mark(overlay.changes_so_far())
            overlay.listeners.append(self.mark)

    def describe(self) -> dict[str, Any]:
        """For ``describe``: what is stored, and what refreshing it has cost so far."""
        stats = self.stats
        return {
            "layers": self.num_layers,
            "dims": list(self.precomputed.meta["dims"]),
            "built_at": self.precomputed.meta["built_at"],
            "refreshed_updates": stats.updates,
            "refreshed_rows": stats.rows,
            "refresh_seconds": round(stats.seconds, 3),
            "pending_rows": self.pending_rows,
        }

    @property
    def pending_rows(self) -> int:
        """Rows marked by updates and not recomputed yet, over all layers."""
        return sum(len(pending) for pending in self.pending)

    @property
    def view(self) -> GraphView:
        if self.overlay is not None and not self.overlay.is_empty:
            return self.overlay
        return self.store

    def width(self, layer: int) -> int:
        """Columns of layer ``layer``'s rows (0: the features)."""
        if layer == 0:
            return self.store.feature_dim
        return int(self.precomputed.layers[layer - 1].shape[1])

    def in_list(self, node: int) -> np.ndarray:
        """The current in-neighbours of ``node`` (int64, ascending)."""
        if self.overlay is not None:
            return self.overlay.in_list(node)
        start, end = int(self.store.indptr[node]), int(self.store.indptr[node + 1])
        return np.asarray(self.store.indices[start:end], dtype=np.int64)

    def rows(self, layer: int, nodes: np.ndarray) -> np.ndarray:
        """float32 rows of layer ``layer`` (0: the features, ``num_layers``: the output) of
        the internal indices ``nodes``, as the served graph version has them."""
        if layer == 0:
            return self.view.feature_rows(nodes)
        if self.pending[layer - 1] and self._ensure(layer, nodes) and self._depth == 0:
            self.stats.reads_refreshed += 1
        stored = self.precomputed.layers[layer - 1]
        out = np.take(stored, np.minimum(nodes, stored.shape[0] - 1), axis=0)
        changed = self.changed[layer - 1]
        if changed:
            for position, node in enumerate(nodes.tolist()):
                row = changed.get(node)
                if row is not None:
                    out[position] = row
        return out

    def mark(self, change: OverlayChange) -> None:
        """Marks every row ``change`` reaches, layer by layer (module docstring)."""
        started = time.perf_counter()
        self._follow_edges(change)
        neighbourhood = np.fromiter(change.in_lists_before, dtype=np.int64)
        structural = neighbourhood
        if needs_degree(self.model):
            structural = np.union1d(neighbourhood, self.out_neighbours(neighbourhood))
        reached = np.fromiter(change.feature_rows, dtype=np.int64)
        removed = (
            np.fromiter(self.overlay.removed, dtype=np.int64)
            if self.overlay is not None and self.overlay.removed
            else np.empty(0, dtype=np.int64)
        )
        for layer in range(1, self.num_layers + 1):
            dirty = np.union1d(np.union1d(reached, self.out_neighbours(reached)), structural)
            dirty = dirty[~np.isin(dirty, removed)]
            self.pending[layer - 1].update(dirty.tolist())
            self.stats.marked += int(dirty.size)
            reached = dirty
        self.stats.updates += 1
        self.stats.seconds += time.perf_counter() - started

    def drain(self, max_rows: int) -> int:
        """Recomputes up to ``max_rows`` marked rows, lowest layer first (the follower's
        background work); returns how many."""
        done = 0
        for layer in range(1, self.num_layers + 1):
            pending = self.pending[layer - 1]
            if pending and done < max_rows:
                some = np.fromiter(
                    pending, dtype=np.int64, count=min(len(pending), max_rows - done)
                )
                done += self._ensure(layer, some)
        return done

    def current(self, layer: int) -> dict[int, np.ndarray]:
        """Layer ``layer``'s rows that differ from the stored ones, all recomputed first (a
        top-k search reads every node's row)."""
        pending = self.pending[layer - 1]
        if pending:
            self._ensure(layer, np.fromiter(pending, dtype=np.int64))
        return self.changed[layer - 1]

    def out_neighbours(self, nodes: np.ndarray) -> np.ndarray:
        """Nodes with an in-edge from any of ``nodes`` (ascending; a superset after removals,
        which only recomputes a row that did not change)."""
        if nodes.size == 0:
            return nodes
        base = nodes[nodes < len(self._out_indptr) - 1]
        starts, ends = self._out_indptr[base], self._out_indptr[base + 1]
        counts = ends - starts
        total = int(counts.sum())
        offsets = np.repeat(starts - np.cumsum(counts) + counts, counts)
        found = [np.asarray(self._out_indices[offsets + np.arange(total)], dtype=np.int64)]
        for node in nodes.tolist():
            added = self.out_added.get(node)
            if added:
                found.append(np.fromiter(added, dtype=np.int64))
        return np.unique(np.concatenate(found))

    def exact_out_neighbours(self, node: int) -> np.ndarray:
        """The nodes with an in-edge from ``node`` now (``out_neighbours`` without the
        superset: a candidate whose in-list changed is checked against it)."""
        found = self.out_neighbours(np.array([node], dtype=np.int64))
        if self.overlay is None or self.overlay.is_empty or found.size == 0:
            return found
        changed = self.overlay.dirty_mask(found)
        keep = ~changed
        for position in np.flatnonzero(changed).tolist():
            keep[position] = node in set(self.in_list(int(found[position])).tolist())
        return found[keep]

    def _follow_edges(self, change: OverlayChange) -> None:
        """Records the sources each changed in-list gained, so out-neighbours stay complete."""
        if self.overlay is None:
            return
        for node, before in change.in_lists_before.items():
            for source in np.setdiff1d(self.overlay.in_list(node), before).tolist():
                self.out_added.setdefault(source, set()).add(node)

    def _ensure(self, layer: int, nodes: np.ndarray) -> int:
        """Recomputes the marked rows among ``nodes`` of ``layer``; returns how many."""
        pending = self.pending[layer - 1]
        need = np.unique(np.fromiter((n for n in nodes.tolist() if n in pending), dtype=np.int64))
        if need.size == 0:
            return 0
        started = time.perf_counter()
        self._depth += 1
        try:
            self._recompute(layer, need)
        finally:
            self._depth -= 1
        pending.difference_update(need.tolist())
        self.stats.rows += int(need.size)
        if self._depth == 0:
            self.stats.seconds += time.perf_counter() - started
        return int(need.size)

    def _recompute(self, layer: int, nodes: np.ndarray) -> None:
        """Rows ``nodes`` of ``layer`` from layer ``layer - 1`` (whose marked rows among their
        inputs are recomputed first, by ``rows``), in chunks of bounded edges."""
        view = self.view
        degree = view.degree_rows if needs_degree(self.model) else None
        target = self.changed[layer - 1]
        for chunk in _chunks(nodes, view.degree_rows(nodes), CHUNK_EDGES):
            sub = self._in_neighbourhoods.sample(torch.from_numpy(chunk))
            local = sub.node.numpy()
            graph = LocalGraph(nodes=local, edge_index=sub.edge_index, rows=len(chunk))
            out = layer_rows(
                self.model,
                layer - 1,
                graph,
                self.rows(layer - 1, local),
                None if degree is None else degree(local),
            )
            for node, row in zip(chunk.tolist(), out, strict=True):
                target[node] = row


def _chunks(nodes: np.ndarray, degrees: np.ndarray, budget: int) -> list[np.ndarray]:
    """``nodes`` split in order so that each part's in-edges stay within ``budget`` (a node
    with more is a part of its own)."""
    ends = np.cumsum(degrees)
    parts, start = [], 0
    while start < len(nodes):
        base = ends[start - 1] if start else 0
        stop = int(np.searchsorted(ends, base + budget, side="right"))
        stop = max(stop, start + 1)
        parts.append(nodes[start:stop])
        start = stop
    return parts
