""":class:`PrecomputedRows`: a precomputed archive's layer rows (model.precompute), kept equal to
the full-graph forward of the graph version being served.

Every request that changes the graph is followed, in seq order, by a refresh of the rows it
reaches, before any answer can read that version (the overlay calls :meth:`refresh` right after
applying the request, under the live graph's lock, on every worker and replica alike):

- layer 0 (the features) changed at the nodes whose feature row was set (new nodes included);
- a node whose in-neighbour list changed (an edge added or removed, a neighbour removed) has a
  new neighbourhood at every layer; with GCN its degree changed too, which changes the weight of
  each of its out-edges, so its out-neighbours are reached at every layer as well;
- row ``v`` of layer ``l`` is recomputed when ``v`` or one of its in-neighbours was reached at
  layer ``l-1``, or its neighbourhood changed: from the (already refreshed) rows of its whole
  in-neighbourhood at layer ``l-1``, with ``NodeClassifier.layer``, the rule the build used.

A refreshed row replaces the stored one in memory; the stored files are never written. The cost
of an update is the rows it reaches times their in-degrees (a hub's neighbour: the hub's row
reads all of its in-neighbours once), paid before the update is acknowledged on the worker that
takes it and before the next answer on the others.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
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


@dataclass
class RefreshStats:
    """What the refreshes cost so far (the worker's metrics report them)."""

    updates: int = 0
    rows: int = 0
    seconds: float = 0.0
    last_rows: int = 0
    last_seconds: float = 0.0
    per_layer: list[int] = field(default_factory=list)


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
                self.refresh(overlay.changes_so_far())
            overlay.listeners.append(self.refresh)

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
        }

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
        stored = self.precomputed.layers[layer - 1]
        out = np.take(stored, np.minimum(nodes, stored.shape[0] - 1), axis=0)
        changed = self.changed[layer - 1]
        if changed:
            for position, node in enumerate(nodes.tolist()):
                row = changed.get(node)
                if row is not None:
                    out[position] = row
        return out

    def refresh(self, change: OverlayChange) -> None:
        """Recomputes every row ``change`` reaches, layer by layer (module docstring)."""
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
        per_layer = []
        for layer in range(1, self.num_layers + 1):
            dirty = np.union1d(np.union1d(reached, self.out_neighbours(reached)), structural)
            dirty = dirty[~np.isin(dirty, removed)]
            self._recompute(layer, dirty)
            per_layer.append(int(dirty.size))
            reached = dirty
        seconds = time.perf_counter() - started
        stats = self.stats
        stats.updates += 1
        stats.last_rows, stats.last_seconds = sum(per_layer), seconds
        stats.rows += stats.last_rows
        stats.seconds += seconds
        stats.per_layer = per_layer

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

    def _recompute(self, layer: int, nodes: np.ndarray) -> None:
        """Rows ``nodes`` of ``layer`` from layer ``layer - 1``, in chunks of bounded edges."""
        if nodes.size == 0:
            return
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
