""":class:`PrecomputedRows`: a precomputed archive's rows (model.precompute), kept equal to the
full-graph forward of the graph version being served, in either of its two modes.

Every request that changes the graph marks the rows it reaches, in seq order, as soon as it is
applied (the overlay calls :meth:`mark` under the live graph's lock, on every worker and replica
alike). What changed: the nodes whose feature row was set (new nodes included), and the nodes
whose in-edges changed (an edge added or removed, a neighbour removed, an in-edge's features
set: the overlay lists each in ``OverlayChange.in_lists_before``); where a node's degree is part
of what its out-edges carry (GCN's normalisation, a user's degree-normalising layers), a changed
in-list changes what its out-neighbours receive too. Each stored array is then marked from the
one below it (the features below the first) with one rule, the array's reach ``r``: a row is
reached when a node within ``r`` hops upstream was reached in the array below, or within
``r - 1`` hops upstream had its in-edges (or, with degrees, an in-neighbour's in-edges) changed.

- **Per-layer rows** (``r = 1`` per layer): row ``v`` of layer ``l`` is reached when ``v`` or an
  in-neighbour was reached at layer ``l-1``, or ``v``'s neighbourhood changed. A marked row is
  recomputed from the current rows of its whole in-neighbourhood one layer below (their
  edges' features by edge ID where the layers read them), with ``model.precompute.layer_rows``,
  the rule the build used.
- **Every node's output** (one array, ``r`` = the model's hops): every node within ``hops``
  hops downstream of a changed feature row, within ``hops - 1`` of a changed in-list (``hops``
  with degrees). A marked output is recomputed by the model's own forward on the node's whole
  in-neighbourhood at the current version (``model.in_closure``), the rule the build used.

On a graph of several node types, rows are kept for the types answers read
(``Precomputed.node_types``: a node model's target, a link model's two ends): "downstream"
follows out-edges of every relation, through nodes of any type, and the rows marked are the
nodes of those types it reaches (nodes an update added included); each type's rows are
recomputed by the model's forward on their in-neighbourhoods split by type
(``model.in_closure.typed_closure_forward``, with the contract's ``rows_of``: the rows of
that type).

A marked row is recomputed before anything reads it: a read recomputes the marked rows it needs
(and, first, the marked rows those need), and the live graph's follower recomputes the rest in
the background, a bounded number of rows at a time, between batches. So no answer ever reads a
row older than the version it reports, an update is acknowledged after marking only, and a
read pays only for the marked rows it reads. Refreshed rows replace the stored ones in memory;
the stored files are never written.

Marking reads the graph (out-lists, node types), which may be in Redis. A marking that fails
(Redis timed out) keeps its change and raises (the update stays applied:
``graph_assets.live.overlay.ListenerFailed``); every read marks the kept changes first, in
order, and while that still fails it raises ``ListenerBehind`` (503) instead of reading a row
the update may have changed. The follower tries again between batches, once a second.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from graph_assets import GraphStore
from graph_assets.graph_view import GraphView
from graph_assets.live.overlay import GraphOverlay, ListenerBehind, OverlayChange
from graph_assets.remote import RemoteStore
from model.in_closure import (
    UNLIMITED,
    Closure,
    InEdgeLists,
    InEdgeReader,
    OutDegrees,
    closure_chunks,
    closure_forward,
    in_closure,
    typed_closure_forward,
)
from model.precompute import (
    CHUNK_EDGES,
    LocalGraph,
    Mode,
    Precomputed,
    check_plan,
    layer_rows,
)
from model.served import serving_needs
from model.served.contract import served
from model.user_model import EdgeInput

logger = logging.getLogger(__name__)

# Marked rows the follower recomputes per step between batches (a few ms of holding the graph).
DRAIN_ROWS = 256
# After a failed marking the follower tries it again this often (each try may wait out the
# graph's Redis timeout while holding the graph), reads on every batch.
REMARK_RETRY_S = 1.0


@dataclass
class RefreshStats:
    """What marking and refreshing cost so far (the worker's metrics report them)."""

    updates: int = 0  # updates marked
    marked: int = 0  # rows they reached, summed over layers
    rows: int = 0  # rows recomputed
    seconds: float = 0.0  # time spent marking and recomputing
    reads_refreshed: int = 0  # reads that recomputed marked rows they needed first


class PrecomputedRows:
    """Stored rows of every node of the served graph version; ``rows(l, nodes)``."""

    def __init__(
        self,
        precomputed: Precomputed,
        model: torch.nn.Module,
        store: GraphStore | RemoteStore,
        overlay: GraphOverlay | None = None,
    ) -> None:
        self.precomputed = precomputed
        self.model = model
        self.plan = check_plan(precomputed, model)
        self.store = store
        self.overlay = overlay
        self.num_layers = precomputed.num_layers
        schema = store.schema
        self._types = np.array([schema.type_index(name) for name in precomputed.node_types])
        # A typed graph's model: what each stored type's rows are computed with.
        contract = served(model)
        self._row_models = (
            {schema.type_index(name): contract.rows_of(name) for name in precomputed.node_types}
            if contract.typed
            else {}
        )
        # How far one array's change reaches in the next (module docstring).
        self.reach = 1 if self.plan.mode is Mode.LAYERS else self.plan.hops
        self.changed: list[dict[int, np.ndarray]] = [{} for _ in range(self.num_layers)]
        self.pending: list[set[int]] = [set() for _ in range(self.num_layers)]
        self._depth = 0  # > 0 while recomputing: the reads are the refresh's own
        self.out_added: dict[int, set[int]] = {}
        self.stats = RefreshStats()
        # Changes whose marking failed, oldest first: marked before any row is read.
        self._unmarked: list[OverlayChange] = []
        self._remark_at = 0.0  # when the follower may try them again
        # A ChebConv's Laplacian reads its sources' out-degrees and, without normalisation,
        # the graph's largest, which the stored rows were computed with (model.chebconv).
        needs = serving_needs(model)
        self._out_degrees = needs.out_degrees
        self._largest = store.largest_out_degree() if needs.largest_degree else None
        if overlay is not None:
            if not overlay.is_empty:  # the log was replayed before these rows existed
                self.mark(overlay.changes_so_far())
            overlay.listeners.append(self.mark)

    def describe(self) -> dict[str, Any]:
        """For ``describe``: what is stored, and what refreshing it has cost so far."""
        stats = self.stats
        return {
            "mode": self.plan.mode.value,
            "hops": self.plan.hops,
            "layers": self.num_layers,
            "dims": list(self.precomputed.meta["dims"]),
            "built_at": self.precomputed.meta["built_at"],
            "refreshed_updates": stats.updates,
            "refreshed_rows": stats.rows,
            "refresh_seconds": round(stats.seconds, 3),
            "pending_rows": self.pending_rows,
            "unmarked_updates": len(self._unmarked),
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
            return self.store.schema.target_type.feature_dim
        return self.precomputed.width(layer - 1)

    @property
    def graph(self) -> GraphView:
        """The served version's in-lists: the overlay's (which reads its base through the
        graph view) or the base's, whichever graph source it is."""
        return self.overlay if self.overlay is not None else self.store

    def in_list(self, node: int) -> np.ndarray:
        """The current in-neighbours of ``node`` (int64, grouped by relation)."""
        return self.graph.in_lists(np.array([node], dtype=np.int64)).indices

    def in_list_edge_ids(self, node: int) -> np.ndarray:
        """The ID of each edge of ``in_list(node)``, in the same order."""
        return self.graph.in_lists(np.array([node], dtype=np.int64)).edge_ids

    def in_edges(self, nodes: np.ndarray) -> InEdgeLists:
        """Every current in-edge of ``nodes`` (unique), with its edge ID, in one read: the
        :data:`model.in_closure.InEdgeReader` of the served version."""
        lists = self.graph.in_lists(nodes)
        dst = np.repeat(np.asarray(nodes, dtype=np.int64), np.diff(lists.indptr))
        return InEdgeLists(src=lists.indices, dst=dst, edge_ids=lists.edge_ids)

    def edge_rows(self, edge_ids: np.ndarray, new_edge_rows: np.ndarray | None) -> np.ndarray:
        """Features of edges by ID; an ID ``< 0`` is a cold-start node's edge, whose row is
        ``new_edge_rows[-1 - ID]``."""
        out = np.zeros((len(edge_ids), self.store.edge_feature_dim), dtype=np.float32)
        stored = edge_ids >= 0
        out[stored] = self.view.edge_feature_rows(edge_ids[stored])
        if new_edge_rows is not None and not bool(stored.all()):
            out[~stored] = new_edge_rows[-1 - edge_ids[~stored]]
        return out

    def ego_forward(
        self,
        seeds: np.ndarray,
        read: InEdgeReader | None = None,
        new_x: np.ndarray | None = None,
        new_edge_rows: np.ndarray | None = None,
        with_embedding: bool = False,
        max_nodes: int = UNLIMITED,
        max_edges: int = UNLIMITED,
        degrees: OutDegrees | None = None,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """``(rows, embeddings or None)`` of ``seeds`` from the model's forward on their whole
        in-neighbourhood (``model.in_closure``), read by ``read`` (default: the served
        version, as are the out-degrees ``degrees``); ``SubgraphTooLarge`` beyond the limits. A
        row of node ``< 0`` (a cold-start node) has the features ``new_x``, an edge of ID
        ``< 0`` the row ``new_edge_rows[-1 - ID]``."""
        closure = in_closure(read or self.in_edges, seeds, self.edge_hops, max_nodes, max_edges)
        return self._forward(closure, new_x, new_edge_rows, with_embedding, degrees)

    @property
    def edge_hops(self) -> int:
        """Levels of in-edges an output's whole in-neighbourhood holds (``model.in_closure``:
        one more for a model that reads its sources' degrees)."""
        return self.plan.hops + (1 if self.plan.degree else 0)

    def _forward(
        self,
        closure: Closure,
        new_x: np.ndarray | None = None,
        new_edge_rows: np.ndarray | None = None,
        with_embedding: bool = False,
        degrees: OutDegrees | None = None,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """The model on ``closure`` (its features, edge features and, where it reads them,
        out-degrees gathered, by default the served version's; a typed model's per type and
        relation)."""
        if self._row_models:  # the seeds are of one type (_recompute groups them so)
            [seed_type] = self.view.types_of(closure.nodes[:1]).tolist()
            return typed_closure_forward(
                self._row_models[seed_type], closure, self.store.schema, self.view, with_embedding
            )
        nodes = closure.nodes
        known = nodes >= 0
        x = np.empty((len(nodes), self.width(0)), dtype=np.float32)
        x[known] = self.view.feature_rows(nodes[known])
        if new_x is not None and not bool(known.all()):
            x[~known] = new_x
        attr = None
        if self.reads_edges:
            attr = self.edge_rows(closure.edge_ids, new_edge_rows)
        degrees = OutDegrees.of(self.view) if degrees is None else degrees
        return closure_forward(self.model, closure, x, attr, with_embedding, degrees)

    @property
    def reads_edges(self) -> bool:
        """The model reads edge features."""
        return serving_needs(self.model).edge_input is not EdgeInput.NONE

    def rows(self, layer: int, nodes: np.ndarray) -> np.ndarray:
        """float32 rows of layer ``layer`` (0: the features, ``num_layers``: the output) of
        the internal indices ``nodes``, as the served graph version has them."""
        self._caught_up()
        if layer == 0:
            return self.view.feature_rows(nodes)
        if self.pending[layer - 1] and self._ensure(layer, nodes) and self._depth == 0:
            self.stats.reads_refreshed += 1
        stored = self.precomputed
        out = stored.read(layer - 1, np.minimum(nodes, stored.count - 1))
        changed = self.changed[layer - 1]
        if changed:
            for position, node in enumerate(nodes.tolist()):
                row = changed.get(node)
                if row is not None:
                    out[position] = row
        return out

    def mark(self, change: OverlayChange) -> None:
        """Marks every row ``change`` reaches, array by array (module docstring), after any
        change whose marking failed before. A failure keeps ``change`` to mark before the next
        read, and raises."""
        self._unmarked.append(change)
        self._mark_unmarked()

    def _mark_unmarked(self) -> None:
        """Marks the kept changes in order; one that fails stays first (marking again only
        marks the same rows again)."""
        while self._unmarked:
            self._mark(self._unmarked[0])
            self._unmarked.pop(0)

    def _caught_up(self) -> None:
        """Marks the changes a failed marking kept, before a read; :class:`ListenerBehind`
        while that still fails, since a row they reach may be out of date."""
        if not self._unmarked:
            return
        behind = len(self._unmarked)
        try:
            self._mark_unmarked()
        except Exception as error:
            raise ListenerBehind(
                f"{len(self._unmarked)} update(s) are applied but the precomputed rows they "
                f"reach are not marked yet ({type(error).__name__}: {error})"
            ) from error
        logger.warning("marked the precomputed rows of %d update(s) whose marking failed", behind)

    def _mark(self, change: OverlayChange) -> None:
        started = time.perf_counter()
        self._follow_edges(change)
        neighbourhood = np.fromiter(change.in_lists_before, dtype=np.int64)
        structural = neighbourhood
        if self.plan.degree:
            structural = np.union1d(neighbourhood, self.out_neighbours(neighbourhood))
        if self._out_degrees:  # a changed in-edge moved its source's out-degree
            sources = self._sources_of(change)
            structural = np.union1d(structural, self.out_neighbours(sources))
            structural = np.union1d(structural, sources)
        structural = self.downstream(structural, self.reach - 1)
        if self._largest is not None and self._largest != self.view.largest_out_degree():
            self._largest = self.view.largest_out_degree()
            structural = np.arange(self.view.num_nodes, dtype=np.int64)  # every row's scale
        reached = np.fromiter(change.feature_rows, dtype=np.int64)
        removed = (
            np.fromiter(self.overlay.removed, dtype=np.int64)
            if self.overlay is not None and self.overlay.removed
            else np.empty(0, dtype=np.int64)
        )
        for layer in range(1, self.num_layers + 1):
            dirty = np.union1d(self.downstream(reached, self.reach), structural)
            dirty = dirty[~np.isin(dirty, removed)]
            dirty = dirty[np.isin(self.view.types_of(dirty), self._types)]
            self.pending[layer - 1].update(dirty.tolist())
            self.stats.marked += int(dirty.size)
            reached = dirty
        self.stats.updates += 1
        self.stats.seconds += time.perf_counter() - started

    def _sources_of(self, change: OverlayChange) -> np.ndarray:
        """Every source of the changed in-lists, before and now (a superset of those whose
        out-degree moved)."""
        nodes = np.fromiter(change.in_lists_before, dtype=np.int64)
        now = self.view.in_lists(nodes).indices if nodes.size else nodes
        return np.unique(np.concatenate([now, *change.in_lists_before.values()]))

    def downstream(self, nodes: np.ndarray, hops: int) -> np.ndarray:
        """``nodes`` and every node within ``hops`` out-edges of them (ascending)."""
        found = np.unique(nodes)
        frontier = found
        for _ in range(hops):
            frontier = np.setdiff1d(self.out_neighbours(frontier), found, assume_unique=True)
            if frontier.size == 0:
                break
            found = np.union1d(found, frontier)
        return found

    def drain(self, max_rows: int) -> int:
        """Recomputes up to ``max_rows`` marked rows, lowest layer first (the follower's
        background work); returns how many. Changes whose marking failed are marked first,
        tried at most once every ``REMARK_RETRY_S``."""
        if self._unmarked:
            if time.monotonic() < self._remark_at:
                return 0
            try:
                self._caught_up()
            except ListenerBehind:
                self._remark_at = time.monotonic() + REMARK_RETRY_S
                return 0
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
        self._caught_up()
        pending = self.pending[layer - 1]
        if pending:
            self._ensure(layer, np.fromiter(pending, dtype=np.int64))
        return self.changed[layer - 1]

    def out_neighbours(self, nodes: np.ndarray) -> np.ndarray:
        """Nodes with an in-edge from any of ``nodes`` (ascending; a superset after removals,
        which only recomputes a row that did not change)."""
        if nodes.size == 0:
            return nodes
        found = [self.precomputed.out_neighbours(nodes[nodes < self.store.num_nodes])]
        for node in nodes.tolist():
            added = self.out_added.get(node)
            if added:
                found.append(np.fromiter(added, dtype=np.int64))
        return np.unique(np.concatenate(found))

    def neighbours_on(
        self, node: int, in_relations: Sequence[int], relation: int
    ) -> list[np.ndarray]:
        """``node``'s neighbours on one relation now (a link archive's top-k leaves them
        out): its in-neighbours over ``in_relations`` (the relation's edges into it where it
        joins one type, its reverse's), and the nodes it has an edge of ``relation`` to."""
        self._caught_up()  # the out-lists updates added are recorded by marking
        sources = self.in_list(node)
        kinds = self.view.edge_relations(self.in_list_edge_ids(node))
        return [sources[np.isin(kinds, in_relations)], self._out_on(node, relation)]

    def _out_on(self, node: int, relation: int) -> np.ndarray:
        """The nodes with an in-edge of ``relation`` from ``node`` now: ``out_neighbours``
        without the superset, a candidate checked against its in-list where that list changed
        or where the graph has several relations."""
        found = self.out_neighbours(np.array([node], dtype=np.int64))
        if found.size == 0:
            return found
        if len(self.store.schema.relations) > 1:
            check = np.ones(len(found), dtype=bool)
        elif self.overlay is not None and not self.overlay.is_empty:
            check = self.overlay.dirty_mask(found)
        else:
            return found
        keep = ~check
        for position in np.flatnonzero(check).tolist():
            target = int(found[position])
            from_node = self.in_list(target) == node
            kinds = self.view.edge_relations(self.in_list_edge_ids(target)[from_node])
            keep[position] = bool((kinds == relation).any())
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
        """Rows ``nodes`` of ``layer``, in chunks of bounded in-edges: per-layer rows from
        layer ``layer - 1`` (whose marked rows among their inputs are recomputed first, by
        ``rows``), outputs from the model on the nodes' in-neighbourhoods (one type's nodes
        at a time)."""
        target = self.changed[layer - 1]
        if self.plan.mode is Mode.OUTPUT:
            types = self.view.types_of(nodes)
            for node_type in np.unique(types).tolist():
                mine = nodes[types == node_type]
                for closure in closure_chunks(self.in_edges, mine, self.edge_hops, CHUNK_EDGES):
                    out, _ = self._forward(closure)
                    target.update(zip(closure.nodes[: closure.seeds].tolist(), out, strict=True))
            return
        view = self.view
        degree = view.degree_rows if self.plan.degree else None
        for chunk in _chunks(nodes, view.degree_rows(nodes), CHUNK_EDGES):
            lists = self.graph.in_lists(chunk)
            local, src = _local_index(chunk, lists.indices)
            dst = np.repeat(np.arange(len(chunk), dtype=np.int64), np.diff(lists.indptr))
            edge_index = torch.from_numpy(np.stack([src, dst]))
            graph = LocalGraph(nodes=local, edge_index=edge_index, rows=len(chunk))
            out = layer_rows(
                self.plan,
                layer - 1,
                graph,
                self.rows(layer - 1, local),
                None if degree is None else degree(local),
                self.edge_rows(lists.edge_ids, None) if self.plan.edge_attr else None,
            )
            target.update(zip(chunk.tolist(), out, strict=True))


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


def _local_index(seeds: np.ndarray, sources: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The nodes of a one-hop subgraph (``seeds`` (unique) first, then the other sources,
    ascending) and each source's position among them."""
    nodes = np.concatenate([seeds, np.setdiff1d(sources, seeds)])
    order = np.argsort(nodes, kind="stable")
    return nodes, order[np.searchsorted(nodes[order], sources)]
