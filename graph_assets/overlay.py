"""Live updates on top of a memory-mapped base graph, without copying the base.

The overlay holds only what changed: new nodes (internal indices ``N``, ``N+1``, ... after the
base's ``N``), replaced feature rows, removed nodes, and an explicit in-edge list for every
node whose in-edges changed ("dirty" nodes). A sampler reads a clean node's in-edges from the
base CSC arrays and a dirty node's from the overlay, so serving cost stays proportional to the
sampled subgraph. Every request's operations are applied all-or-nothing: a bad operation
undoes the ones before it and raises :class:`UpdateRejected` naming the offending item.

The graph stays as given: ``add_edge`` may add a self-loop, and adding a pair that exists adds
a parallel edge. Every edge has an ID: a base edge keeps its CSC position, an added edge gets
``base.num_edges + k`` (the ``k``-th edge an update added; never reused) and its features live
here, as do features that ``set_edge_features`` set on base edges. A dirty node's in-list holds
its sources in ascending order, a run of parallel edges in ascending edge ID, so ``remove_edge``
takes the pair's edge with the highest ID: the one added last.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from graph_assets.operations import (
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
from graph_assets.store import GraphStore, check_edge_ids, node_key


@dataclass(frozen=True)
class InEdges:
    """In-edge lists of some nodes as a small CSC: node ``i``'s sources are
    ``indices[indptr[i]:indptr[i+1]]`` and ``edge_ids`` (int64, same layout) holds each edge's
    ID (:meth:`GraphOverlay.edge_feature_rows` reads its features by it)."""

    indptr: np.ndarray
    indices: np.ndarray
    edge_ids: np.ndarray


@dataclass
class OverlayChange:
    """What one applied request changed: the nodes whose feature row was set (new nodes
    included) and the nodes whose in-edges changed as a layer sees them (an edge added or
    removed, or an in-edge's features set), each with its in-neighbour list before."""

    feature_rows: set[int]
    in_lists_before: dict[int, np.ndarray]


class GraphOverlay:
    """The updates applied so far to one base graph, with the lookups serving needs.

    ``listeners`` are called with each applied request's :class:`OverlayChange`, after it is
    committed and the seq moved (precomputed rows refresh from it)."""

    def __init__(self, base: GraphStore, max_new_nodes: int = 10_000_000) -> None:
        self.base = base
        self.max_new_nodes = max_new_nodes
        # A compacted store already holds its lineage's records up to folded_seq.
        self._base_seq = base.folded_seq
        self.seq = self._base_seq
        self.new_ids: list[int | str] = []
        self.new_labels: list[int] = []
        self._new_index: dict[int | bytes, int] = {}
        self.removed: set[int] = set()
        self.changed_rows: dict[int, np.ndarray] = {}  # feature rows set by updates
        self.in_lists: dict[int, np.ndarray] = {}  # a dirty node's sources
        self.in_edge_ids: dict[int, np.ndarray] = {}  # and the ID of each of those edges
        self.added_edges = 0  # edge IDs given out: base.num_edges .. base.num_edges + this - 1
        # Row k: features of the edge with ID base.num_edges + k (grown by doubling).
        self._added_edge_rows = np.zeros((0, base.edge_feature_dim), dtype=np.float32)
        self.changed_edge_rows: dict[int, np.ndarray] = {}  # base edges' rows set by updates
        self._base_out: tuple[np.ndarray, np.ndarray] | None = None
        # Plain ndarray views of the base's memory maps (no copy): numpy.memmap indexes through
        # a Python-level __getitem__ (~1 us a call), which replay paid several times per edge
        # operation (a quarter of applying a 10-edge update) and sampling per changed node.
        self._indptr = np.asarray(base.indptr)
        self._indices = np.asarray(base.indices)
        self._features = np.asarray(base.features)
        self._base_index: dict[int | str, int] = {}  # during apply: base index of each ID
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
        """Applies one request's operations (decoded: graph_assets.operations), all or none;
        ``seq`` becomes the graph version.

        ``commit`` runs once every operation is known to be valid (e.g. the durable append to
        the update log); if it raises, the operations are undone too.
        """
        undo: list[Callable[[], None]] = []
        self._base_index = self._look_up_base_ids(operations)
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
            self._change = OverlayChange(set(), {})
        self.seq = seq
        for listener in self.listeners:
            listener(change)

    def changes_so_far(self) -> OverlayChange:
        """Everything applied on top of the base as one change (a listener that starts after
        the log was replayed catches up with it)."""
        nodes = set(self.in_lists)
        if self.changed_edge_rows:  # a base edge's destination: the node whose CSC range holds it
            ids = np.fromiter(self.changed_edge_rows, dtype=np.int64)
            nodes.update((np.searchsorted(self._indptr, ids, side="right") - 1).tolist())
        return OverlayChange(
            feature_rows=set(self.changed_rows),
            in_lists_before={node: self._base_in_list(node) for node in nodes},
        )

    def _base_in_list(self, node: int) -> np.ndarray:
        if node < self.base.num_nodes:
            start, end = int(self._indptr[node]), int(self._indptr[node + 1])
            return np.asarray(self._indices[start:end], dtype=np.int64)
        return np.empty(0, dtype=np.int64)

    def _look_up_base_ids(self, operations: Sequence[Operation]) -> dict[int | str, int]:
        """Base index of every node ID the operations name, in one lookup (one per ID cost
        ~60 us each). Base IDs never change, so the answers hold for the whole request."""
        ids: set[int | str] = set()
        for operation in operations:
            if isinstance(operation, AddNode | SetFeatures | RemoveNode):
                ids.add(operation.node_id)
            else:
                ids.update((operation.src, operation.dst))
        if not ids:
            return {}
        listed = list(ids)
        return dict(zip(listed, self.base.lookup(listed).tolist(), strict=True))

    def _node_of(self, node_id: int | str) -> int:
        """``lookup`` of one ID, from the request's pre-looked-up base indices when it has it."""
        base = self._base_index.get(node_id)
        if base is None:
            return int(self.lookup([node_id])[0])
        node = base if base >= 0 or not self.new_ids else self._new_node(node_id)
        return -1 if node in self.removed else node

    def _new_node(self, node_id: int | str) -> int:
        """Index of a node added by an update, -1 if no update added ``node_id``."""
        key = node_key(self.base.id_kind, node_id)
        return self._new_index.get(key, -1) if key is not None else -1

    def lookup(self, ids: Sequence[int | str]) -> np.ndarray:
        """Internal indices of external IDs as of now; -1 for unknown or removed nodes."""
        nodes = self.base.lookup(ids)
        if self.new_ids:
            for position, node_id in enumerate(ids):
                if nodes[position] < 0:
                    nodes[position] = self._new_node(node_id)
        if self.removed:
            nodes[np.isin(nodes, np.fromiter(self.removed, dtype=np.int64))] = -1
        return nodes

    def in_list(self, node: int) -> np.ndarray:
        """The current in-neighbours of ``node`` (int64, ascending; a source once per edge)."""
        if node in self.in_lists:
            return self.in_lists[node]
        return self._base_in_list(node)

    def in_list_edge_ids(self, node: int) -> np.ndarray:
        """The ID of each edge of ``in_list(node)``, in the same order (int64)."""
        if node in self.in_edge_ids:
            return self.in_edge_ids[node]
        if node < self.base.num_nodes:
            return np.arange(int(self._indptr[node]), int(self._indptr[node + 1]), dtype=np.int64)
        return np.empty(0, dtype=np.int64)

    def dirty_mask(self, nodes: np.ndarray) -> np.ndarray:
        """Which of ``nodes`` must read their in-edges from the overlay (O(len(nodes)))."""
        mask = nodes >= self.base.num_nodes
        base = ~mask
        mask[base] = self._dirty[nodes[base]]
        return mask

    def in_edges(self, nodes: np.ndarray) -> InEdges:
        """In-edge lists of (dirty) ``nodes`` as a small CSC, with their edge IDs."""
        lists = [self.in_list(int(node)) for node in nodes.tolist()]
        ids = [self.in_list_edge_ids(int(node)) for node in nodes.tolist()]
        counts = np.array([len(items) for items in lists], dtype=np.int64)
        indptr = np.zeros(len(lists) + 1, dtype=np.int64)
        np.cumsum(counts, out=indptr[1:])
        empty = np.empty(0, dtype=np.int64)
        return InEdges(
            indptr=indptr,
            indices=np.concatenate(lists).astype(np.int64) if lists else empty,
            edge_ids=np.concatenate(ids).astype(np.int64) if ids else empty,
        )

    def degree_rows(self, nodes: np.ndarray) -> np.ndarray:
        """Current in-degrees of ``nodes``, self-loops not counted, as
        ``GraphStore.degree_rows`` (base degrees unless the node is dirty or new)."""
        clean = nodes < self.base.num_nodes
        degree = np.zeros(len(nodes), dtype=np.int64)
        degree[clean] = self.base.degree_rows(nodes[clean])
        dirty = np.flatnonzero(self.dirty_mask(nodes))
        for position in dirty:
            node = int(nodes[position])
            in_list = self.in_list(node)
            degree[position] = len(in_list) - int(np.count_nonzero(in_list == node))
        return degree

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
        """float32 ``[len(edge_ids), D]`` current features of edges by ID (a copy): a base
        edge's stored row unless ``set_edge_features`` replaced it, an added edge's from the
        overlay."""
        edge_ids = np.asarray(edge_ids)
        stored = self.base.num_edges
        if edge_ids.size == 0 or (
            not self.changed_edge_rows and edge_ids.ndim == 1 and int(edge_ids.max()) < stored
        ):
            return self.base.edge_feature_rows(edge_ids)  # it checks what it is given
        check_edge_ids(edge_ids, self.num_edge_ids, "stored or added edges")
        edge_ids = edge_ids.astype(np.int64, copy=False)
        added = edge_ids >= stored
        rows = np.empty((len(edge_ids), self.edge_feature_dim), dtype=np.float32)
        rows[~added] = self.base.edge_feature_rows(edge_ids[~added])
        rows[added] = self._added_edge_rows[edge_ids[added] - stored]
        if self.changed_edge_rows:
            changed = np.fromiter(self.changed_edge_rows, dtype=np.int64)
            for position in np.flatnonzero(np.isin(edge_ids, changed)).tolist():
                rows[position] = self.changed_edge_rows[int(edge_ids[position])]
        return rows

    def feature_rows(self, nodes: np.ndarray) -> np.ndarray:
        """Current feature rows of ``nodes`` (float32 ``[len(nodes), F]``)."""
        base_rows = np.minimum(nodes, self.base.num_nodes - 1)
        # np.take, not fancy indexing: half the time for a sampled subgraph's rows (a copy).
        rows = np.take(self._features, base_rows, axis=0).astype(np.float32, copy=False)
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
            self._set_row(self._existing(index, operation.node_id, "id"), operation.x, undo)
        elif isinstance(operation, RemoveNode):
            self._remove_node(self._existing(index, operation.node_id, "id"), undo)
        else:
            self._edge_operation(index, operation, undo)

    def _edge_operation(
        self, index: int, operation: EdgeOperation, undo: list[Callable[[], None]]
    ) -> None:
        """``add_edge``, ``remove_edge`` or ``set_edge_features`` of the pair ``src -> dst``."""
        src = self._existing(index, operation.src, "src")
        dst = self._existing(index, operation.dst, "dst")
        current, ids = self.in_list(dst), self.in_list_edge_ids(dst)
        # The pair's edges are one run of the ascending sources, in ascending edge ID.
        end = int(current.searchsorted(src, side="right"))
        if isinstance(operation, AddEdge):
            edge_id = np.array([self._new_edge(operation.attr, undo)], dtype=np.int64)
            added = np.array([src], dtype=np.int64)
            self._set_in_list(
                dst,
                np.concatenate((current[:end], added, current[end:])),
                np.concatenate((ids[:end], edge_id, ids[end:])),
                undo,
            )
            return
        start = int(current.searchsorted(src, side="left"))
        if start == end:
            raise UpdateRejected(
                Rejection.MISSING,
                index,
                f"edge {shown(operation.src)} -> {shown(operation.dst)} does not exist",
            )
        if isinstance(operation, RemoveEdge):  # the pair's last edge: the one added last
            last = end - 1
            self._set_in_list(
                dst,
                np.concatenate((current[:last], current[end:])),
                np.concatenate((ids[:last], ids[end:])),
                undo,
            )
            return
        for edge_id in ids[start:end].tolist():
            self._set_edge_row(edge_id, operation.attr, undo)
        if dst not in self._change.in_lists_before:  # its in-edges changed as a layer sees them
            self._change.in_lists_before[dst] = current

    def _add_node(self, index: int, operation: AddNode, undo: list[Callable[[], None]]) -> None:
        node_id = operation.node_id
        key = node_key(self.base.id_kind, node_id)
        if key is None or (isinstance(node_id, str) and not node_id):
            raise UpdateRejected(
                Rejection.INVALID, index, f"{shown(node_id)} cannot be a node ID of this graph"
            )
        existing = self._base_index.get(node_id)
        if existing is None:
            existing = int(self.base.lookup([node_id])[0])
        if existing >= 0 or key in self._new_index:
            node = int(existing) if existing >= 0 else self._new_index[key]
            state = "was removed (IDs are not reused)" if node in self.removed else "already exists"
            raise UpdateRejected(Rejection.CONFLICT, index, f"node {shown(node_id)} {state}")
        if self.base.was_removed(node_id):  # removed before the base was compacted
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
        self._new_index[key] = node
        self.changed_rows[node] = operation.x
        self._change.feature_rows.add(node)

        def forget() -> None:
            self.new_ids.pop()
            self.new_labels.pop()
            del self._new_index[key]
            self.changed_rows.pop(node, None)
            self.in_lists.pop(node, None)
            self.in_edge_ids.pop(node, None)

        undo.append(forget)

    def _remove_node(self, node: int, undo: list[Callable[[], None]]) -> None:
        for target in self._out_neighbours(node).tolist():
            current = self.in_list(target)
            if _contains(current, node):
                kept = current != node
                self._set_in_list(target, current[kept], self.in_list_edge_ids(target)[kept], undo)
        none = np.empty(0, dtype=np.int64)
        self._set_in_list(node, none, none, undo)
        self.removed.add(node)
        undo.append(lambda: self.removed.discard(node))

    def _out_neighbours(self, node: int) -> np.ndarray:
        """Current out-neighbours of ``node``: base ones (via a reverse index) plus the dirty
        nodes whose overlay in-list holds it. The scan over dirty lists makes a removal cost
        O(overlay edges); keeping no out-lists halves the overlay's memory, and removals are
        rare next to edge additions."""
        found = {target for target, sources in self.in_lists.items() if _contains(sources, node)}
        if node < self.base.num_nodes:
            order, indptr = self._reverse_index()
            positions = order[indptr[node] : indptr[node + 1]]
            targets = np.searchsorted(self._indptr, positions, side="right") - 1
            found.update(targets.tolist())
        return np.array(sorted(found), dtype=np.int64)

    def _reverse_index(self) -> tuple[np.ndarray, np.ndarray]:
        """CSR of the base graph, built once on the first node removal (O(E log E))."""
        if self._base_out is None:
            indices = np.asarray(self._indices, dtype=np.int64)
            order = np.argsort(indices, kind="stable")
            indptr = np.zeros(self.base.num_nodes + 1, dtype=np.int64)
            np.cumsum(np.bincount(indices, minlength=self.base.num_nodes), out=indptr[1:])
            self._base_out = (order, indptr)
        return self._base_out

    def _set_in_list(
        self,
        node: int,
        sources: np.ndarray,
        edge_ids: np.ndarray,
        undo: list[Callable[[], None]],
    ) -> None:
        previous = self.in_lists.get(node)
        previous_ids = self.in_edge_ids.get(node)
        if node not in self._change.in_lists_before:
            self._change.in_lists_before[node] = self.in_list(node)
        # Callers pass fresh arrays.
        self.in_lists[node] = np.asarray(sources, dtype=np.int64)
        self.in_edge_ids[node] = np.asarray(edge_ids, dtype=np.int64)
        if node < self.base.num_nodes:
            self._dirty[node] = True

        def restore() -> None:
            if previous is not None and previous_ids is not None:
                self.in_lists[node], self.in_edge_ids[node] = previous, previous_ids
            else:
                self.in_lists.pop(node, None)
                self.in_edge_ids.pop(node, None)

        undo.append(restore)

    def _new_edge(self, attr: np.ndarray | None, undo: list[Callable[[], None]]) -> int:
        """The next edge ID, its features stored (``attr``: ``[D]``)."""
        k = self.added_edges
        if k == len(self._added_edge_rows):
            grown = np.zeros((max(64, 2 * k), self.edge_feature_dim), dtype=np.float32)
            grown[:k] = self._added_edge_rows
            self._added_edge_rows = grown
        if attr is not None and attr.size:
            self._added_edge_rows[k] = attr
        self.added_edges = k + 1

        def forget() -> None:
            self.added_edges = k

        undo.append(forget)
        return self.base.num_edges + k

    def _set_edge_row(self, edge_id: int, attr: np.ndarray, undo: list[Callable[[], None]]) -> None:
        stored = self.base.num_edges
        if edge_id >= stored:
            k = edge_id - stored
            previous = self._added_edge_rows[k].copy()
            self._added_edge_rows[k] = attr

            def restore_added() -> None:
                self._added_edge_rows[k] = previous

            undo.append(restore_added)
            return
        replaced = self.changed_edge_rows.get(edge_id)
        self.changed_edge_rows[edge_id] = attr

        def restore() -> None:
            if replaced is None:
                self.changed_edge_rows.pop(edge_id, None)
            else:
                self.changed_edge_rows[edge_id] = replaced

        undo.append(restore)

    def _set_row(self, node: int, vector: np.ndarray, undo: list[Callable[[], None]]) -> None:
        previous = self.changed_rows.get(node)
        self.changed_rows[node] = vector
        self._change.feature_rows.add(node)

        def restore() -> None:
            if previous is None:
                self.changed_rows.pop(node, None)
            else:
                self.changed_rows[node] = previous

        undo.append(restore)

    def _existing(self, index: int, node_id: int | str, field: str) -> int:
        node = self._node_of(node_id)
        if node < 0:
            raise UpdateRejected(
                Rejection.MISSING, index, f"node {shown(node_id)} ({field}) is not in the graph"
            )
        return node


def _contains(ascending: np.ndarray, value: int) -> bool:
    """Whether a sorted in-list holds ``value``: a binary search (``np.isin`` sorts first and
    cost ~150 us per edge operation)."""
    at = int(ascending.searchsorted(value))
    return at < len(ascending) and int(ascending[at]) == value
