"""Live updates on top of a base graph, without copying the base.

The overlay holds only what changed: new nodes (internal indices ``N``, ``N+1``, ... after the
base's ``N``), replaced feature rows, removed nodes, and an explicit in-edge list for every
node whose in-edges changed ("dirty" nodes). A sampler reads a clean node's in-edges from the
base and a dirty node's from the overlay, so serving cost stays proportional to the sampled
subgraph. The base is read only through :class:`OverlayBase` (the graph view's batched reads,
``in_lists`` above all, one call per request), so it may be the memory-mapped store or a graph
in Redis (graph_assets.remote). The base never changes under an overlay: what a worker caches of
it stays true, and updates never invalidate it. Every request's operations are applied
all-or-nothing: a bad operation undoes the ones before it and raises :class:`UpdateRejected`
naming the offending item.

The graph stays as given: ``add_edge`` may add a self-loop, and adding a pair that exists adds
a parallel edge. Every edge has an ID: a base edge keeps its CSC position, an added edge gets
``base.num_edges + k`` (the ``k``-th edge an update added; never reused) and its features live
here, as do features that ``set_edge_features`` set on base edges. A dirty node's in-list holds
its sources grouped by relation as stored ones are, ascending within a relation, a run of
parallel edges in ascending edge ID, so ``remove_edge``
takes the pair's edge with the highest ID: the one added last.

Out-degrees (ChebConv's Laplacian reads them) are the base's plus a count per node that every
edge operation moves (self-loops not counted), and the largest of them is looked up from those
counts and the base's out-degrees in descending order, so both stay exact under every update.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from graph_assets.graph_view import GraphView, InLists
from graph_assets.live.operations import (
    AddEdge,
    AddNode,
    EdgeOperation,
    Operation,
    Rejection,
    RemoveEdge,
    RemoveNode,
    SetFeatures,
    UpdateRejected,
    shown,
)
from graph_assets.schema import GraphSchema
from graph_assets.stored.store import check_edge_ids, node_key

# Nodes per read when the reverse index is built from the base's in-lists (bounded memory per
# read; on a graph in Redis, one pipelined round each).
_REVERSE_CHUNK = 65_536


class OverlayBase(GraphView, Protocol):
    """What the overlay reads of its base graph: the graph view, plus the base's own size,
    schema and lineage (``GraphStore``; ``RemoteStore`` for a graph in Redis)."""

    @property
    def num_edges(self) -> int:
        """Edges stored: every base edge's ID is below it."""
        ...

    @property
    def schema(self) -> GraphSchema:
        """Node types and relations."""
        ...

    @property
    def folded_seq(self) -> int:
        """Seq of the last update record folded into the base (0 for a base never updated)."""
        ...

    def was_removed(self, node_id: int | str, node_type: str | None = None) -> bool:
        """Whether an update removed ``node_id`` before the base was compacted."""
        ...


# The sampler's name for the in-lists of dirty nodes (GraphOverlay.in_edges).
InEdges = InLists


@dataclass
class OverlayChange:
    """What one applied request changed: the nodes whose feature row was set (new nodes
    included) and the nodes whose in-edges changed as a layer sees them (an edge added or
    removed, or an in-edge's features set), each with its in-neighbour list before."""

    feature_rows: set[int]
    in_lists_before: dict[int, np.ndarray]


class ListenerFailed(RuntimeError):
    """A request was applied (and committed, where ``apply`` was given a commit: the update log
    holds it) but a listener failed to take in its change, e.g. Redis timed out while the
    precomputed rows it reaches were marked. Nothing is undone: ``seq`` is the graph version
    now. The listener keeps what it missed and takes it in before its state is read again, or
    refuses those reads with :class:`ListenerBehind`."""

    def __init__(self, seq: int, error: Exception) -> None:
        super().__init__(
            f"update seq {seq} is applied, but a listener failed to take in its change "
            f"({type(error).__name__}: {error})"
        )
        self.seq = seq


class ListenerBehind(RuntimeError):
    """A listener's state misses an applied change that it failed to take in and still cannot
    (what it reads to do so still fails): an answer read from that state would be older than
    the graph version it reports, so none is given until it catches up."""


class GraphOverlay:
    """The updates applied so far to one base graph, with the lookups serving needs.

    ``listeners`` are called with each applied request's :class:`OverlayChange`, after it is
    committed and the seq moved (precomputed rows refresh from it). A listener that raises
    undoes nothing: every listener is still called, then :class:`ListenerFailed` is raised."""

    def __init__(self, base: OverlayBase, max_new_nodes: int = 10_000_000) -> None:
        self.base = base
        self.max_new_nodes = max_new_nodes
        # A compacted store already holds its lineage's records up to folded_seq.
        self._base_seq = base.folded_seq
        self.seq = self._base_seq
        self.schema = base.schema
        self.new_ids: list[int | str] = []
        self.new_labels: list[int] = []
        self.new_types: list[int] = []  # the node type of each added node
        self._new_index: dict[tuple[int, int | bytes], int] = {}  # (type, ID key) -> node
        self.removed: set[int] = set()
        self.changed_rows: dict[int, np.ndarray] = {}  # feature rows set by updates
        self.changed_sources: dict[int, np.ndarray] = {}  # a dirty node's sources
        self.in_edge_ids: dict[int, np.ndarray] = {}  # and the ID of each of those edges
        self.added_edges = 0  # edge IDs given out: base.num_edges .. base.num_edges + this - 1
        # Added edge k: its relation and its row in that relation's table of added edges'
        # features (each grown by doubling).
        self._added_relation: list[int] = []
        self._added_slot: list[int] = []
        self._added_rows = [
            np.zeros((0, relation.edge_feature_dim), dtype=np.float32)
            for relation in base.schema.relations
        ]
        self._added_counts = [0] * len(base.schema.relations)
        self.changed_edge_rows: dict[int, np.ndarray] = {}  # base edges' rows set by updates
        self._edge_dst: dict[int, int] = {}  # the destination of each edge in changed_edge_rows
        self._base_out: tuple[np.ndarray, np.ndarray] | None = None
        # Out-degree (self-loops not counted) minus the base's, of each node an update moved;
        # its sorted (nodes, changes) and the largest out-degree, cached until the next move.
        self._out_change: dict[int, int] = {}
        self._out_sorted: tuple[np.ndarray, np.ndarray] | None = None
        self._largest_out: int | None = None
        self._base_out_order: np.ndarray | None = None  # base nodes, largest out-degree first
        # During apply: the base index of each (node type, ID) the request names, and the base
        # in-lists (sources, edge IDs) the request reads, fetched together.
        self._base_index: dict[tuple[int, int | str], int] = {}
        self._fetched: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._relation_ends: dict[str, tuple[int, int]] = {}
        # Set when a base node's in-list moves to the overlay; never cleared (a flagged node
        # whose list was restored just reads the base list through in_list()).
        self._dirty = np.zeros(base.num_nodes, dtype=bool)
        self.listeners: list[Callable[[OverlayChange], None]] = []
        self._change = OverlayChange(set(), {})

    @property
    def num_nodes(self) -> int:
        """Internal index space: base nodes plus every node ever added (removed ones included)."""
        return self.base.num_nodes + len(self.new_ids)

    @property
    def is_empty(self) -> bool:
        """No record applied on top of the base, so the base alone answers (the fast path)."""
        return self.seq == self._base_seq

    def apply(
        self, operations: Sequence[Operation], seq: int, commit: Callable[[], None] | None = None
    ) -> None:
        """Applies one request's operations (decoded: graph_assets.live.operations), all or none;
        ``seq`` becomes the graph version.

        ``commit`` runs once every operation is known to be valid (e.g. the durable append to
        the update log); if it raises, the operations are undone too. After it, the request is
        applied whatever a listener does (:class:`ListenerFailed`).
        """
        undo: list[Callable[[], None]] = []
        self._base_index = self._look_up_base_ids(operations)
        self._fetch_base_lists(self._destinations(operations))  # after the lookups it needs
        change = self._change = OverlayChange(set(), {})
        try:
            for index, operation in enumerate(operations):
                self._apply_one(index, operation, undo)
            if commit is not None:
                commit()
        except BaseException:
            for step in reversed(undo):
                step()
            raise
        finally:
            self._base_index = {}
            self._fetched = {}
            self._change = OverlayChange(set(), {})
        self.seq = seq
        failed: list[Exception] = []
        for listener in self.listeners:
            try:
                listener(change)
            except Exception as error:  # committed: the others still take the change in
                failed.append(error)
        if failed:
            raise ListenerFailed(seq, failed[0]) from failed[0]

    def changes_so_far(self) -> OverlayChange:
        """Everything applied on top of the base as one change (a listener that starts after
        the log was replayed catches up with it)."""
        nodes = set(self.changed_sources)
        nodes.update(self._edge_dst[edge_id] for edge_id in self.changed_edge_rows)
        ordered = np.array(sorted(nodes), dtype=np.int64)
        base = ordered[ordered < self.base.num_nodes]
        lists = self.base.in_lists(base)
        before = {
            node: lists.indices[lists.indptr[i] : lists.indptr[i + 1]]
            for i, node in enumerate(base.tolist())
        }
        empty = np.empty(0, dtype=np.int64)
        return OverlayChange(
            feature_rows=set(self.changed_rows),
            in_lists_before={node: before.get(node, empty) for node in ordered.tolist()},
        )

    def _destinations(self, operations: Sequence[Operation]) -> list[int]:
        """The nodes whose in-lists the request's edge operations read, as far as the
        pre-looked-up base indices tell (a node an earlier operation adds has none in the base)."""
        return [
            self._base_index.get((self._ends(operation.edge_type)[1], operation.dst), -1)
            for operation in operations
            if not isinstance(operation, AddNode | SetFeatures | RemoveNode)
        ]

    def _fetch_base_lists(self, nodes: Sequence[int]) -> None:
        """Reads the base in-lists of those of ``nodes`` that the request may read from the base
        (in the base, not dirty, not fetched yet), in one read: a request costs one read of the
        base, however many edges it changes."""
        wanted = sorted(
            {
                node
                for node in nodes
                if 0 <= node < self.base.num_nodes
                and node not in self.changed_sources
                and node not in self._fetched
            }
        )
        if not wanted:
            return
        lists = self.base.in_lists(np.array(wanted, dtype=np.int64))
        ptr = lists.indptr.tolist()
        for i, node in enumerate(wanted):
            self._fetched[node] = (
                lists.indices[ptr[i] : ptr[i + 1]],
                lists.edge_ids[ptr[i] : ptr[i + 1]],
            )

    def _current(self, node: int) -> tuple[np.ndarray, np.ndarray]:
        """``node``'s in-list now and its edge IDs (fetched from the base when not at hand)."""
        if node in self.changed_sources:
            return self.changed_sources[node], self.in_edge_ids[node]
        found = self._fetched.get(node)
        if found is not None:
            return found
        if node >= self.base.num_nodes:
            empty = np.empty(0, dtype=np.int64)
            return empty, empty
        lists = self.base.in_lists(np.array([node], dtype=np.int64))
        return lists.indices, lists.edge_ids

    def _look_up_base_ids(
        self, operations: Sequence[Operation]
    ) -> dict[tuple[int, int | str], int]:
        """Base index of every (node type, ID) the operations name, in one lookup per type (one
        per ID cost ~60 us each). Base IDs never change, so the answers hold for the whole
        request."""
        wanted: dict[int, set[int | str]] = {}
        for operation in operations:
            if isinstance(operation, AddNode | SetFeatures | RemoveNode):
                wanted.setdefault(self.schema.type_index(operation.node_type), set()).add(
                    operation.node_id
                )
            else:
                src, dst = self._ends(operation.edge_type)
                wanted.setdefault(src, set()).add(operation.src)
                wanted.setdefault(dst, set()).add(operation.dst)
        found: dict[tuple[int, int | str], int] = {}
        for node_type, ids in wanted.items():
            listed = list(ids)
            name = self.schema.node_types[node_type].name
            indices = self.base.lookup(listed, node_type=name).tolist()
            found.update(((node_type, i), n) for i, n in zip(listed, indices, strict=True))
        return found

    def _ends(self, edge_type: str) -> tuple[int, int]:
        """The source and destination node type of a relation (remembered: a request asks
        several times per edge operation)."""
        ends = self._relation_ends.get(edge_type)
        if ends is None:
            relation = self.schema.relations[self.schema.relation_index(edge_type)].edge_type
            ends = self.schema.type_index(relation.src), self.schema.type_index(relation.dst)
            self._relation_ends[edge_type] = ends
        return ends

    def _node_of(self, node_id: int | str, node_type: int) -> int:
        """``lookup`` of one ID of ``node_type``, from the request's pre-looked-up base
        indices when it has it."""
        base = self._base_index.get((node_type, node_id))
        if base is None:
            name = self.schema.node_types[node_type].name
            return int(self.lookup([node_id], node_type=name)[0])
        node = base if base >= 0 or not self.new_ids else self._new_node(node_id, node_type)
        return -1 if node in self.removed else node

    def _new_node(self, node_id: int | str, node_type: int) -> int:
        """Index of a node of ``node_type`` added by an update, -1 if none has ``node_id``."""
        key = node_key(self.schema.node_types[node_type].id_kind, node_id)  # type: ignore[arg-type]
        return self._new_index.get((node_type, key), -1) if key is not None else -1

    def lookup(self, ids: Sequence[int | str], node_type: str | None = None) -> np.ndarray:
        """Internal indices of external IDs of ``node_type`` (default: the graph's target type)
        as of now; -1 for unknown or removed nodes."""
        nodes = self.base.lookup(ids, node_type=node_type)
        if self.new_ids:
            index = 0 if node_type is None else self.schema.type_index(node_type)
            for position, node_id in enumerate(ids):
                if nodes[position] < 0:
                    nodes[position] = self._new_node(node_id, index)
        if self.removed:
            nodes[np.isin(nodes, np.fromiter(self.removed, dtype=np.int64))] = -1
        return nodes

    def types_of(self, nodes: np.ndarray) -> np.ndarray:
        """The node type index of each of ``nodes`` (added nodes included)."""
        nodes = np.asarray(nodes, dtype=np.int64)
        types = self.base.types_of(np.minimum(nodes, self.base.num_nodes - 1))
        added = nodes >= self.base.num_nodes
        if added.any():
            types[added] = np.asarray(self.new_types, dtype=np.int64)[
                nodes[added] - self.base.num_nodes
            ]
        return types

    def edge_relations(self, edge_ids: np.ndarray) -> np.ndarray:
        """The relation index of each edge by ID (added edges included)."""
        edge_ids = np.asarray(edge_ids, dtype=np.int64)
        if len(self.schema.relations) == 1:
            return np.zeros(len(edge_ids), dtype=np.int64)
        stored = self.base.num_edges
        added = edge_ids >= stored
        relations = self.base.edge_relations(np.where(added, 0, edge_ids))
        if added.any():
            relations[added] = np.asarray(self._added_relation, dtype=np.int64)[
                edge_ids[added] - stored
            ]
        return relations

    def in_list(self, node: int) -> np.ndarray:
        """The current in-neighbours of ``node`` (int64, grouped by relation, ascending within
        one; a source once per edge)."""
        return self._current(node)[0]

    def in_list_edge_ids(self, node: int) -> np.ndarray:
        """The ID of each edge of ``in_list(node)``, in the same order (int64)."""
        return self._current(node)[1]

    def in_lists(self, nodes: np.ndarray) -> InLists:
        """The current in-lists of any ``nodes`` with their edge IDs and relations (the graph
        view's read): a dirty node's from the overlay, the others' from the base in one read."""
        nodes = np.asarray(nodes, dtype=np.int64).reshape(-1)
        base_count = self.base.num_nodes
        own = self.dirty_mask(nodes)  # flagged: in the overlay unless an undo restored it
        own[own] = [node in self.changed_sources for node in nodes[own].tolist()]
        from_base = ~own & (nodes < base_count)
        if from_base.all():
            return self.base.in_lists(nodes)
        counts = np.zeros(len(nodes), dtype=np.int64)
        base = self.base.in_lists(nodes[from_base]) if from_base.any() else None
        if base is not None:
            counts[from_base] = np.diff(base.indptr)
        own_nodes = nodes[own].tolist()
        own_sources = [self.changed_sources[node] for node in own_nodes]
        own_ids = [self.in_edge_ids[node] for node in own_nodes]
        counts[own] = [len(sources) for sources in own_sources]
        indptr = np.zeros(len(nodes) + 1, dtype=np.int64)
        np.cumsum(counts, out=indptr[1:])
        indices = np.empty(int(indptr[-1]), dtype=np.int64)
        edge_ids = np.empty(int(indptr[-1]), dtype=np.int64)
        relations = np.empty(int(indptr[-1]), dtype=np.int64)
        if base is not None:
            at = _positions(indptr, from_base)
            indices[at], edge_ids[at], relations[at] = base.indices, base.edge_ids, base.relations
        if own_nodes:
            at = _positions(indptr, own)
            indices[at] = np.concatenate(own_sources)
            edge_ids[at] = ids = np.concatenate(own_ids)
            relations[at] = self.edge_relations(ids)
        return InLists(indptr, indices, edge_ids, relations)

    def dirty_mask(self, nodes: np.ndarray) -> np.ndarray:
        """Which of ``nodes`` must read their in-edges from the overlay (O(len(nodes)))."""
        mask = nodes >= self.base.num_nodes
        base = ~mask
        mask[base] = self._dirty[nodes[base]]
        return mask

    def in_edges(self, nodes: np.ndarray) -> InEdges:
        """``in_lists`` under the name the sampler reads dirty nodes' lists by."""
        return self.in_lists(nodes)

    def degree_rows(self, nodes: np.ndarray) -> np.ndarray:
        """Current in-degrees of ``nodes``, self-loops not counted, as
        ``GraphStore.degree_rows`` (base degrees unless the node is dirty or new)."""
        clean = nodes < self.base.num_nodes
        degree = np.zeros(len(nodes), dtype=np.int64)
        degree[clean] = self.base.degree_rows(nodes[clean])
        dirty = np.flatnonzero(self.dirty_mask(nodes))
        if dirty.size:
            lists = self.in_lists(nodes[dirty])
            counts = np.diff(lists.indptr)
            loops = lists.indices == np.repeat(nodes[dirty], counts)
            owner = np.repeat(np.arange(len(dirty)), counts)
            degree[dirty] = counts - np.bincount(owner[loops], minlength=len(dirty))
        return degree

    def out_degree_rows(self, nodes: np.ndarray) -> np.ndarray:
        """Current out-degrees of ``nodes``, self-loops not counted: the base's (0 for a new
        node) plus what updates moved (module docstring)."""
        nodes = np.asarray(nodes, dtype=np.int64)
        stored = nodes < self.base.num_nodes
        degree = np.zeros(len(nodes), dtype=np.int64)
        if stored.all():
            degree = self.base.out_degree_rows(nodes).astype(np.int64)
        elif stored.any():
            degree[stored] = self.base.out_degree_rows(nodes[stored])
        if self._out_change and len(nodes):
            moved, change = self._moved_out_degrees()
            at = np.minimum(np.searchsorted(moved, nodes), len(moved) - 1)
            hit = moved[at] == nodes
            degree[hit] += change[at[hit]]
        return degree

    def largest_out_degree(self) -> int:
        """The largest current out-degree: of the moved nodes, or else of the first base node
        in descending out-degree order that no update moved (exact under every update)."""
        if self._largest_out is None:
            largest = 0
            moved, _ = self._moved_out_degrees()
            if len(moved):
                largest = int(self.out_degree_rows(moved).max())
            order = self._base_order()
            first = order[: len(moved) + 1]  # one of these was not moved
            kept = first[~np.isin(first, moved)]
            if len(kept):
                largest = max(largest, int(self.base.out_degree_rows(kept[:1])[0]))
            self._largest_out = largest
        return self._largest_out

    def _moved_out_degrees(self) -> tuple[np.ndarray, np.ndarray]:
        """The nodes whose out-degree an update moved, ascending, and by how much."""
        if self._out_sorted is None:
            moved = np.fromiter(self._out_change, dtype=np.int64, count=len(self._out_change))
            change = np.fromiter(
                self._out_change.values(), dtype=np.int64, count=len(self._out_change)
            )
            order = np.argsort(moved)
            self._out_sorted = moved[order], change[order]
        return self._out_sorted

    def _base_order(self) -> np.ndarray:
        """Base nodes by descending out-degree, read once on first use (in blocks of nodes; on
        a graph in Redis, a read of every node's degrees)."""
        if self._base_out_order is None:
            count = self.base.num_nodes
            degree = np.concatenate(
                [
                    self.base.out_degree_rows(np.arange(start, min(count, start + _REVERSE_CHUNK)))
                    for start in range(0, count, _REVERSE_CHUNK)
                ]
                or [np.empty(0, dtype=np.int64)]
            )
            self._base_out_order = np.argsort(-degree, kind="stable")
        return self._base_out_order

    @property
    def edge_feature_dim(self) -> int:
        """Features per edge: the base store's (an update's ``attr`` has that width)."""
        return self.base.edge_feature_dim

    @property
    def num_edge_ids(self) -> int:
        """Size of the edge ID space: base edges plus every edge ever added (removed ones
        included)."""
        return self.base.num_edges + self.added_edges

    def edge_feature_rows(self, edge_ids: np.ndarray) -> np.ndarray:
        """float32 ``[len(edge_ids), D]`` current features of edges by ID, all of one relation
        (a copy): a base edge's stored row unless ``set_edge_features`` replaced it, an added
        edge's from the overlay."""
        edge_ids = np.asarray(edge_ids)
        stored = self.base.num_edges
        if edge_ids.size == 0 or (
            not self.changed_edge_rows and edge_ids.ndim == 1 and int(edge_ids.max()) < stored
        ):
            return self.base.edge_feature_rows(edge_ids)  # it checks what it is given
        check_edge_ids(edge_ids, self.num_edge_ids, "stored or added edges")
        edge_ids = edge_ids.astype(np.int64, copy=False)
        relations = self.edge_relations(edge_ids)
        relation = int(relations[0])
        if (relations != relation).any():
            raise ValueError("edge features of several relations have several widths")
        added = edge_ids >= stored
        width = self.schema.relations[relation].edge_feature_dim
        rows = np.empty((len(edge_ids), width), dtype=np.float32)
        if not added.all():  # asked for no edges, the base gives relation 0's width
            rows[~added] = self.base.edge_feature_rows(edge_ids[~added])
        if added.any():
            slots = np.asarray(self._added_slot, dtype=np.int64)[edge_ids[added] - stored]
            rows[added] = self._added_rows[relation][slots]
        if self.changed_edge_rows:
            changed = np.fromiter(self.changed_edge_rows, dtype=np.int64)
            for position in np.flatnonzero(np.isin(edge_ids, changed)).tolist():
                rows[position] = self.changed_edge_rows[int(edge_ids[position])]
        return rows

    def feature_rows(self, nodes: np.ndarray) -> np.ndarray:
        """Current feature rows of ``nodes``, all of one type (float32 ``[len(nodes), F]``)."""
        nodes = np.asarray(nodes, dtype=np.int64)
        added = nodes >= self.base.num_nodes
        if not added.any():
            rows = self.base.feature_rows(nodes)  # np.take on the memory map: a copy
        else:
            types = self.types_of(nodes)
            if (types != types[0]).any():
                raise ValueError("feature rows of nodes of several types have several widths")
            width = self.schema.node_types[int(types[0])].feature_dim
            rows = np.empty((len(nodes), width), dtype=np.float32)
            rows[~added] = self.base.feature_rows(nodes[~added])
        if self.changed_rows:
            for position, node in enumerate(nodes.tolist()):
                replaced = self.changed_rows.get(node)
                if replaced is not None:
                    rows[position] = replaced
        return rows

    def external_ids(self, nodes: np.ndarray) -> list[int | str]:
        """External IDs of internal ``nodes``, nodes added by updates included."""
        nodes = np.asarray(nodes, dtype=np.int64)
        base = self.base.num_nodes
        if not self.new_ids or nodes.size == 0 or nodes.max() < base:
            return self.base.external_ids(nodes)
        ids: list[int | str] = [0] * len(nodes)
        old = np.flatnonzero(nodes < base)
        for position, node_id in zip(old.tolist(), self.base.external_ids(nodes[old]), strict=True):
            ids[position] = node_id
        for position in np.flatnonzero(nodes >= base).tolist():
            ids[position] = self.new_ids[int(nodes[position]) - base]
        return ids

    # -- applying operations -------------------------------------------------------------

    def _apply_one(self, index: int, operation: Operation, undo: list[Callable[[], None]]) -> None:
        if isinstance(operation, AddNode):
            self._add_node(index, operation, undo)
        elif isinstance(operation, SetFeatures):
            node_type = self.schema.type_index(operation.node_type)
            node = self._existing(index, operation.node_id, "id", node_type)
            self._set_row(node, operation.x, undo)
        elif isinstance(operation, RemoveNode):
            node_type = self.schema.type_index(operation.node_type)
            self._remove_node(self._existing(index, operation.node_id, "id", node_type), undo)
        else:
            self._edge_operation(index, operation, undo)

    def _edge_operation(
        self, index: int, operation: EdgeOperation, undo: list[Callable[[], None]]
    ) -> None:
        """``add_edge``, ``remove_edge`` or ``set_edge_features`` of the pair ``src -> dst``."""
        relation = self.schema.relation_index(operation.edge_type)
        src_type, dst_type = self._ends(operation.edge_type)
        src = self._existing(index, operation.src, "src", src_type)
        dst = self._existing(index, operation.dst, "dst", dst_type)
        current, ids = self._current(dst)
        # An in-list is grouped by relation, ascending sources within a relation, the pair's
        # edges one run in ascending edge ID: one sort key, (relation, source).
        keys = self._sort_keys(current, ids)
        wanted = relation * self.num_nodes + src
        end = int(keys.searchsorted(wanted, side="right"))
        if isinstance(operation, AddEdge):
            edge_id = np.array([self._new_edge(operation.attr, relation, undo)], dtype=np.int64)
            added = np.array([src], dtype=np.int64)
            if src != dst:
                self._shift_out_degrees(added, 1, undo)
            self._set_in_list(
                dst,
                np.concatenate((current[:end], added, current[end:])),
                np.concatenate((ids[:end], edge_id, ids[end:])),
                undo,
            )
            return
        start = int(keys.searchsorted(wanted, side="left"))
        if start == end:
            raise UpdateRejected(
                Rejection.MISSING,
                index,
                f"edge {shown(operation.src)} -> {shown(operation.dst)} does not exist",
            )
        if isinstance(operation, RemoveEdge):  # the pair's last edge: the one added last
            last = end - 1
            if src != dst:
                self._shift_out_degrees(current[last:end], -1, undo)
            self._set_in_list(
                dst,
                np.concatenate((current[:last], current[end:])),
                np.concatenate((ids[:last], ids[end:])),
                undo,
            )
            return
        for edge_id in ids[start:end].tolist():
            self._set_edge_row(edge_id, dst, operation.attr, undo)
        if dst not in self._change.in_lists_before:  # its in-edges changed as a layer sees them
            self._change.in_lists_before[dst] = current

    def _add_node(self, index: int, operation: AddNode, undo: list[Callable[[], None]]) -> None:
        node_id, node_type = operation.node_id, self.schema.type_index(operation.node_type)
        key = node_key(self.schema.node_types[node_type].id_kind, node_id)  # type: ignore[arg-type]
        if key is None or (isinstance(node_id, str) and not node_id):
            raise UpdateRejected(
                Rejection.INVALID, index, f"{shown(node_id)} cannot be a node ID of this graph"
            )
        existing = self._base_index.get((node_type, node_id))
        if existing is None:
            existing = int(self.base.lookup([node_id], node_type=operation.node_type)[0])
        if existing >= 0 or (node_type, key) in self._new_index:
            node = int(existing) if existing >= 0 else self._new_index[(node_type, key)]
            state = "was removed (IDs are not reused)" if node in self.removed else "already exists"
            raise UpdateRejected(Rejection.CONFLICT, index, f"node {shown(node_id)} {state}")
        if self.base.was_removed(node_id, operation.node_type):  # before the base's compaction
            raise UpdateRejected(
                Rejection.CONFLICT,
                index,
                f"node {shown(node_id)} was removed (IDs are not reused)",
            )
        if len(self.new_ids) >= self.max_new_nodes:
            raise UpdateRejected(
                Rejection.LIMIT, index, f"the overlay holds {self.max_new_nodes} new nodes"
            )
        node = self.num_nodes
        self.new_ids.append(key.decode("utf-8") if isinstance(key, bytes) else key)
        self.new_labels.append(operation.label)
        self.new_types.append(node_type)
        self._new_index[(node_type, key)] = node
        self.changed_rows[node] = operation.x
        self._change.feature_rows.add(node)

        def forget() -> None:
            self.new_ids.pop()
            self.new_labels.pop()
            self.new_types.pop()
            del self._new_index[(node_type, key)]
            self.changed_rows.pop(node, None)
            self.changed_sources.pop(node, None)
            self.in_edge_ids.pop(node, None)

        undo.append(forget)

    def _holds(self, sources: np.ndarray, node: int) -> bool:
        """Whether an in-list holds ``node``: a binary search on one relation's ascending
        sources; with several relations the list is ascending per relation only."""
        if len(self.schema.relations) == 1:
            return _contains(sources, node)
        return bool((sources == node).any())

    def _remove_node(self, node: int, undo: list[Callable[[], None]]) -> None:
        targets = self._out_neighbours(node).tolist()
        self._fetch_base_lists([*targets, node])
        for target in targets:
            current, ids = self._current(target)
            if self._holds(current, node):
                kept = current != node
                if target != node:
                    self._shift_out_degrees(current[~kept], -1, undo)
                self._set_in_list(target, current[kept], ids[kept], undo)
        senders = self.in_list(node)
        self._shift_out_degrees(senders[senders != node], -1, undo)
        none = np.empty(0, dtype=np.int64)
        self._set_in_list(node, none, none, undo)
        self.removed.add(node)
        undo.append(lambda: self.removed.discard(node))

    def _out_neighbours(self, node: int) -> np.ndarray:
        """Current out-neighbours of ``node``: base ones (via a reverse index) plus the dirty
        nodes whose overlay in-list holds it. The scan over dirty lists makes a removal cost
        O(overlay edges); keeping no out-lists halves the overlay's memory, and removals are
        rare next to edge additions."""
        found = {
            target for target, sources in self.changed_sources.items() if self._holds(sources, node)
        }
        if node < self.base.num_nodes:
            targets, indptr = self._reverse_index()
            found.update(targets[indptr[node] : indptr[node + 1]].tolist())
        return np.array(sorted(found), dtype=np.int64)

    def _reverse_index(self) -> tuple[np.ndarray, np.ndarray]:
        """The base graph's out-lists (targets, CSR pointers), built once on the first node
        removal from every base in-list (O(E log E); on a graph in Redis, a read of all of it:
        removing a base node is the one update that reads the whole base)."""
        if self._base_out is None:
            count = self.base.num_nodes
            sources = np.empty(self.base.num_edges, dtype=np.int64)
            targets = np.empty(self.base.num_edges, dtype=np.int64)
            for start in range(0, count, _REVERSE_CHUNK):
                nodes = np.arange(start, min(count, start + _REVERSE_CHUNK), dtype=np.int64)
                lists = self.base.in_lists(nodes)
                sources[lists.edge_ids] = lists.indices
                targets[lists.edge_ids] = np.repeat(nodes, np.diff(lists.indptr))
            order = np.argsort(sources, kind="stable")
            indptr = np.zeros(count + 1, dtype=np.int64)
            np.cumsum(np.bincount(sources, minlength=count), out=indptr[1:])
            self._base_out = (targets[order], indptr)
        return self._base_out

    def _set_in_list(
        self,
        node: int,
        sources: np.ndarray,
        edge_ids: np.ndarray,
        undo: list[Callable[[], None]],
    ) -> None:
        previous = self.changed_sources.get(node)
        previous_ids = self.in_edge_ids.get(node)
        if node not in self._change.in_lists_before:
            self._change.in_lists_before[node] = self.in_list(node)
        # Callers pass fresh arrays.
        self.changed_sources[node] = np.asarray(sources, dtype=np.int64)
        self.in_edge_ids[node] = np.asarray(edge_ids, dtype=np.int64)
        if node < self.base.num_nodes:
            self._dirty[node] = True

        def restore() -> None:
            if previous is not None and previous_ids is not None:
                self.changed_sources[node], self.in_edge_ids[node] = previous, previous_ids
            else:
                self.changed_sources.pop(node, None)
                self.in_edge_ids.pop(node, None)

        undo.append(restore)

    def _shift_out_degrees(
        self, sources: np.ndarray, step: int, undo: list[Callable[[], None]]
    ) -> None:
        """The out-degree of each of ``sources`` moves by ``step`` per time it is listed (the
        callers leave self-loops out)."""
        if not len(sources):
            return
        nodes, counts = np.unique(sources, return_counts=True)
        moves = list(zip(nodes.tolist(), (step * counts).tolist(), strict=True))

        def move(sign: int) -> None:
            for node, by in moves:
                self._out_change[node] = self._out_change.get(node, 0) + sign * by
            self._out_sorted = self._largest_out = None

        move(1)
        undo.append(lambda: move(-1))

    def _new_edge(
        self, attr: np.ndarray | None, relation: int, undo: list[Callable[[], None]]
    ) -> int:
        """The next edge ID, of ``relation``, its features stored (``attr``: ``[D_r]``)."""
        k, slot = self.added_edges, self._added_counts[relation]
        table = self._added_rows[relation]
        if slot == len(table):
            grown = np.zeros((max(64, 2 * slot), table.shape[1]), dtype=np.float32)
            grown[:slot] = table
            self._added_rows[relation] = table = grown
        if attr is not None and attr.size:
            table[slot] = attr
        self._added_relation.append(relation)
        self._added_slot.append(slot)
        self._added_counts[relation] = slot + 1
        self.added_edges = k + 1

        def forget() -> None:
            self.added_edges = k
            self._added_counts[relation] = slot
            self._added_relation.pop()
            self._added_slot.pop()

        undo.append(forget)
        return self.base.num_edges + k

    def _sort_keys(self, sources: np.ndarray, edge_ids: np.ndarray) -> np.ndarray:
        """An in-list's order as one ascending key per edge: (relation, source)."""
        if len(self.schema.relations) == 1:
            return sources
        return self.edge_relations(edge_ids) * self.num_nodes + sources

    def _set_edge_row(
        self, edge_id: int, dst: int, attr: np.ndarray, undo: list[Callable[[], None]]
    ) -> None:
        stored = self.base.num_edges
        if edge_id >= stored:
            k = edge_id - stored
            relation, slot = self._added_relation[k], self._added_slot[k]
            previous = self._added_rows[relation][slot].copy()
            self._added_rows[relation][slot] = attr

            def restore_added() -> None:  # the table then, which a later growth may replace
                self._added_rows[relation][slot] = previous

            undo.append(restore_added)
            return
        _set_undoably(self.changed_edge_rows, edge_id, attr, undo)
        self._edge_dst[edge_id] = dst  # a base edge's destination never changes

    def _set_row(self, node: int, vector: np.ndarray, undo: list[Callable[[], None]]) -> None:
        _set_undoably(self.changed_rows, node, vector, undo)
        self._change.feature_rows.add(node)

    def _existing(self, index: int, node_id: int | str, field: str, node_type: int) -> int:
        node = self._node_of(node_id, node_type)
        if node < 0:
            what = (
                "node"
                if len(self.schema.node_types) == 1
                else self.schema.node_types[node_type].name
            )
            raise UpdateRejected(
                Rejection.MISSING, index, f"{what} {shown(node_id)} ({field}) is not in the graph"
            )
        return node


def _contains(ascending: np.ndarray, value: int) -> bool:
    """Whether a sorted in-list holds ``value``: a binary search (``np.isin`` sorts first and
    cost ~150 us per edge operation)."""
    at = int(ascending.searchsorted(value))
    return at < len(ascending) and int(ascending[at]) == value


def _positions(indptr: np.ndarray, which: np.ndarray) -> np.ndarray:
    """The positions, in a CSC of ``indptr``, of the lists ``which`` selects, end to end."""
    starts, counts = indptr[:-1][which], np.diff(indptr)[which]
    total = int(counts.sum())
    return np.repeat(starts - np.cumsum(counts) + counts, counts) + np.arange(total)


def _set_undoably(
    rows: dict[int, np.ndarray], key: int, row: np.ndarray, undo: list[Callable[[], None]]
) -> None:
    """Sets ``rows[key]``; the undo appended puts back the row there before (or none)."""
    previous = rows.get(key)
    rows[key] = row

    def restore() -> None:
        if previous is None:
            rows.pop(key, None)
        else:
            rows[key] = previous

    undo.append(restore)
