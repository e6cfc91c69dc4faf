"""Live updates on top of a memory-mapped base graph, without copying the base.

The overlay holds only what changed: new nodes (internal indices ``N``, ``N+1``, ... after the
base's ``N``), replaced feature rows, removed nodes, and an explicit in-neighbour list for every
node whose in-edges changed ("dirty" nodes). A sampler reads a clean node's in-edges from the
base CSC arrays and a dirty node's from the overlay, so serving cost stays proportional to the
sampled subgraph. Every request's operations are applied all-or-nothing: a bad operation
undoes the ones before it and raises :class:`UpdateRejected` naming the offending item.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np

from graph_assets.store import GraphStore, node_key

# Each operation type and the fields it may carry: anything else is refused, not stored in the
# log unread.
OPERATION_FIELDS = {
    "add_node": {"type", "id", "x", "label"},
    "add_edge": {"type", "src", "dst"},
    "remove_edge": {"type", "src", "dst"},
    "set_features": {"type", "id", "x"},
    "remove_node": {"type", "id"},
}
OPERATION_TYPES = tuple(OPERATION_FIELDS)
FLOAT32_MAX = float(np.finfo(np.float32).max)


class Rejection(Enum):
    """Why an update cannot be applied (the handler maps each to an HTTP status)."""

    INVALID = "invalid"  # a malformed operation
    MISSING = "missing"  # names a node or an edge the graph does not have
    CONFLICT = "conflict"  # adds what exists, or reuses a removed ID
    LIMIT = "limit"  # over one of the overlay's size limits


class UpdateRejected(ValueError):
    """An update request that cannot be applied: which operation, and why (``kind``)."""

    def __init__(self, kind: Rejection, index: int, message: str) -> None:
        super().__init__(f"operation {index}: {message}")
        self.kind = kind
        self.index = index


@dataclass(frozen=True)
class InEdges:
    """In-neighbour lists of some nodes as a small CSC: node ``i``'s are
    ``indices[indptr[i]:indptr[i+1]]``."""

    indptr: np.ndarray
    indices: np.ndarray


@dataclass
class OverlayChange:
    """What one applied request changed: the nodes whose feature row was set (new nodes
    included) and the nodes whose in-neighbour list changed, each with its list before."""

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
        self.in_lists: dict[int, np.ndarray] = {}
        self._base_out: tuple[np.ndarray, np.ndarray] | None = None
        # Plain ndarray views of the base's memory maps (no copy): numpy.memmap indexes through
        # a Python-level __getitem__ (~1 us a call), which replay paid several times per edge
        # operation (a quarter of applying a 10-edge update) and sampling per changed node.
        self._indptr = np.asarray(base.indptr)
        self._indices = np.asarray(base.indices)
        self._in_degree = np.asarray(base.in_degree)
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
        self, operations: Sequence[Any], seq: int, commit: Callable[[], None] | None = None
    ) -> None:
        """Applies one request's operations, all or none; ``seq`` becomes the graph version.

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
        return OverlayChange(
            feature_rows=set(self.changed_rows),
            in_lists_before={node: self._base_in_list(node) for node in self.in_lists},
        )

    def _base_in_list(self, node: int) -> np.ndarray:
        if node < self.base.num_nodes:
            start, end = int(self._indptr[node]), int(self._indptr[node + 1])
            return np.asarray(self._indices[start:end], dtype=np.int64)
        return np.empty(0, dtype=np.int64)

    def _look_up_base_ids(self, operations: Sequence[Any]) -> dict[int | str, int]:
        """Base index of every node ID the operations name, in one lookup (one per ID cost
        ~60 us each). Base IDs never change, so the answers hold for the whole request."""
        ids: set[int | str] = set()
        for operation in operations:
            if isinstance(operation, dict):
                for field in ("id", "src", "dst"):
                    value = operation.get(field)
                    if type(value) is int or type(value) is str:  # not bool: True == 1
                        ids.add(value)
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
        """The current in-neighbours of ``node`` (int64, ascending)."""
        if node in self.in_lists:
            return self.in_lists[node]
        return self._base_in_list(node)

    def dirty_mask(self, nodes: np.ndarray) -> np.ndarray:
        """Which of ``nodes`` must read their in-edges from the overlay (O(len(nodes)))."""
        mask = nodes >= self.base.num_nodes
        base = ~mask
        mask[base] = self._dirty[nodes[base]]
        return mask

    def in_edges(self, nodes: np.ndarray) -> InEdges:
        """In-neighbour lists of (dirty) ``nodes`` as a small CSC."""
        lists = [self.in_list(int(node)) for node in nodes]
        counts = np.array([len(items) for items in lists], dtype=np.int64)
        indptr = np.zeros(len(lists) + 1, dtype=np.int64)
        np.cumsum(counts, out=indptr[1:])
        indices = np.concatenate(lists) if lists else np.empty(0, dtype=np.int64)
        return InEdges(indptr=indptr, indices=indices.astype(np.int64))

    def degree_rows(self, nodes: np.ndarray) -> np.ndarray:
        """Current in-degrees of ``nodes`` (base degrees unless the node is dirty or new)."""
        clean = nodes < self.base.num_nodes
        degree = np.zeros(len(nodes), dtype=np.int64)
        degree[clean] = self._in_degree[nodes[clean]]
        dirty = np.flatnonzero(self.dirty_mask(nodes))
        for position in dirty:
            degree[position] = len(self.in_list(int(nodes[position])))
        return degree

    @property
    def edge_feature_dim(self) -> int:
        """Features per edge: the base store's (updates carry no edge features)."""
        return self.base.edge_feature_dim

    def edge_feature_rows(self, edge_ids: np.ndarray) -> np.ndarray:
        """Features of edges by ID: every edge ID is a base CSC position, since edges added by
        updates are given no IDs or features yet, so the base store answers."""
        return self.base.edge_feature_rows(edge_ids)

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

    def _apply_one(self, index: int, operation: Any, undo: list[Callable[[], None]]) -> None:
        if not isinstance(operation, dict) or operation.get("type") not in OPERATION_TYPES:
            raise UpdateRejected(
                Rejection.INVALID,
                index,
                f"each operation is an object whose type is one of {OPERATION_TYPES}",
            )
        kind = operation["type"]
        unknown = sorted(str(field) for field in set(operation) - OPERATION_FIELDS[kind])
        if unknown:
            raise UpdateRejected(
                Rejection.INVALID, index, f"unknown field(s) {unknown} in a {kind} operation"
            )
        if kind == "add_node":
            self._add_node(index, operation, undo)
        elif kind == "set_features":
            node = self._existing(index, operation, "id")
            self._set_row(node, self._vector(index, operation), undo)
        elif kind == "remove_node":
            self._remove_node(self._existing(index, operation, "id"), undo)
        else:
            src = self._existing(index, operation, "src")
            dst = self._existing(index, operation, "dst")
            if src == dst and kind == "add_edge":  # a stored one can be removed
                raise UpdateRejected(
                    Rejection.INVALID, index, "an update cannot add a self-loop (src equals dst)"
                )
            current = self.in_list(dst)
            at = int(current.searchsorted(src))  # one binary search: presence and insert point
            present = at < len(current) and int(current[at]) == src
            if kind == "add_edge":
                if present:
                    raise UpdateRejected(
                        Rejection.CONFLICT,
                        index,
                        f"edge {_edge(operation)} already exists",
                    )
                added = np.array([src], dtype=np.int64)
                grown = np.concatenate((current[:at], added, current[at:]))
                self._set_in_list(dst, grown, undo)
            else:
                if not present:
                    raise UpdateRejected(
                        Rejection.MISSING,
                        index,
                        f"edge {_edge(operation)} does not exist",
                    )
                self._set_in_list(dst, current[current != src], undo)

    def _add_node(
        self, index: int, operation: dict[str, Any], undo: list[Callable[[], None]]
    ) -> None:
        node_id = operation.get("id")
        if isinstance(node_id, bool) or not isinstance(node_id, int | str):
            raise UpdateRejected(
                Rejection.INVALID,
                index,
                f"add_node needs an integer or string id, got {_shown(node_id)}",
            )
        key = node_key(self.base.id_kind, node_id)
        if key is None or (isinstance(node_id, str) and not node_id):
            raise UpdateRejected(
                Rejection.INVALID, index, f"{_shown(node_id)} cannot be a node ID of this graph"
            )
        existing = self._base_index.get(node_id)
        if existing is None:
            existing = int(self.base.lookup([node_id])[0])
        if existing >= 0 or key in self._new_index:
            node = int(existing) if existing >= 0 else self._new_index[key]
            state = "was removed (IDs are not reused)" if node in self.removed else "already exists"
            raise UpdateRejected(Rejection.CONFLICT, index, f"node {_shown(node_id)} {state}")
        if self.base.was_removed(node_id):  # removed before the base was compacted
            raise UpdateRejected(
                Rejection.CONFLICT,
                index,
                f"node {_shown(node_id)} was removed (IDs are not reused)",
            )
        if len(self.new_ids) >= self.max_new_nodes:
            raise UpdateRejected(
                Rejection.LIMIT, index, f"the overlay holds {self.max_new_nodes} new nodes"
            )
        vector = self._vector(index, operation)
        label = self._label(index, operation.get("label"))
        node = self.num_nodes
        self.new_ids.append(key.decode("utf-8") if isinstance(key, bytes) else key)
        self.new_labels.append(label)
        self._new_index[key] = node
        self.changed_rows[node] = vector
        self._change.feature_rows.add(node)

        def forget() -> None:
            self.new_ids.pop()
            self.new_labels.pop()
            del self._new_index[key]
            self.changed_rows.pop(node, None)
            self.in_lists.pop(node, None)

        undo.append(forget)

    def _remove_node(self, node: int, undo: list[Callable[[], None]]) -> None:
        for target in self._out_neighbours(node):
            current = self.in_list(int(target))
            if _contains(current, node):
                self._set_in_list(int(target), current[current != node], undo)
        self._set_in_list(node, np.empty(0, dtype=np.int64), undo)
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

    def _set_in_list(self, node: int, values: np.ndarray, undo: list[Callable[[], None]]) -> None:
        had = node in self.in_lists
        previous = self.in_lists.get(node)
        if node not in self._change.in_lists_before:
            self._change.in_lists_before[node] = self.in_list(node)
        self.in_lists[node] = np.asarray(values, dtype=np.int64)  # callers pass fresh arrays
        if node < self.base.num_nodes:
            self._dirty[node] = True

        def restore() -> None:
            if had and previous is not None:
                self.in_lists[node] = previous
            else:
                self.in_lists.pop(node, None)

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

    def _existing(self, index: int, operation: dict[str, Any], field: str) -> int:
        node_id = operation.get(field)
        if isinstance(node_id, bool) or not isinstance(node_id, int | str):
            raise UpdateRejected(
                Rejection.INVALID, index, f"{field} must be an integer or string node ID"
            )
        node = self._node_of(node_id)
        if node < 0:
            raise UpdateRejected(
                Rejection.MISSING, index, f"node {_shown(node_id)} ({field}) is not in the graph"
            )
        return node

    def _vector(self, index: int, operation: dict[str, Any]) -> np.ndarray:
        values = operation.get("x")
        width = self.base.feature_dim
        if not isinstance(values, list) or len(values) != width:
            got = len(values) if isinstance(values, list) else type(values).__name__
            raise UpdateRejected(
                Rejection.INVALID, index, f"x must be a list of {width} numbers, got {got}"
            )
        kinds = set(map(type, values))  # one pass at C speed; JSON gives int and float only
        if not kinds <= {int, float} and not all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in values
        ):
            raise UpdateRejected(Rejection.INVALID, index, "x must hold numbers only")
        if kinds == {float}:  # the usual vector: checked in numpy
            wide = np.array(values, dtype=np.float64)
            finite = bool(np.isfinite(wide).all())
        else:  # an int is checked before any conversion: 10**400 overflows float() itself
            finite = all(
                abs(v) <= FLOAT32_MAX if isinstance(v, int) else math.isfinite(v) for v in values
            )
            wide = np.array(values, dtype=np.float64) if finite else np.empty(0)
        if not finite:
            raise UpdateRejected(
                Rejection.INVALID, index, "x holds NaN or infinity; send finite numbers"
            )
        with np.errstate(over="ignore"):
            vector = wide.astype(np.float32)
        if not np.isfinite(vector).all():
            raise UpdateRejected(
                Rejection.INVALID,
                index,
                f"x holds a value outside float32's range (±{FLOAT32_MAX:.7g})",
            )
        return vector

    def _label(self, index: int, label: Any) -> int:
        if label is None:
            return -1
        names = self.base.class_names
        if isinstance(label, str) and names and label in names:
            return names.index(label)
        if (
            isinstance(label, int)
            and not isinstance(label, bool)
            and 0 <= label < max(self.base.num_classes, 1)
        ):
            return label
        raise UpdateRejected(
            Rejection.INVALID, index, f"label {_shown(label)} is not a class of this graph"
        )


def _contains(ascending: np.ndarray, value: int) -> bool:
    """Whether a sorted in-list holds ``value``: a binary search (``np.isin`` sorts first and
    cost ~150 us per edge operation)."""
    at = int(ascending.searchsorted(value))
    return at < len(ascending) and int(ascending[at]) == value


def _shown(value: Any) -> str:
    """``repr`` of a client's value for an error message, cut short: a 400-digit ID is quoted
    by its ends, not in full."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:18]}...{text[-18:]} ({len(text)} characters)"


def _edge(operation: dict[str, Any]) -> str:
    return f"{_shown(operation['src'])} -> {_shown(operation['dst'])}"
