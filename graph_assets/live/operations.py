"""Graph update operations, decoded once from their JSON form into typed records.

An update request's ``operations`` (and every update log record's) are decoded here, at the
edge, into frozen dataclasses: each field checked (IDs, finite float32 vectors of the right
width, labels of the graph's classes, node and edge types the graph has), so the overlay that
applies them sees only valid, typed operations and checks only what depends on the graph's
current state (a node exists, an ID is free). :func:`encode_operations` is the canonical JSON
form the log stores (``LOG_FORMAT`` 2: every operation names its node or edge type); a log
record written before (format 1, no types) decodes the same way, its types the graph's only
ones.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

import numpy as np

from graph_assets.schema import GraphSchema

LOG_FORMAT = 2  # the operations' form in update log records; 1: before node and edge types
NodeId = int | str
# Each operation type and the fields it may carry: anything else is refused, not stored in the
# log unread.
OPERATION_FIELDS = {
    "add_node": {"type", "id", "x", "label", "node_type"},
    "add_edge": {"type", "src", "dst", "attr", "edge_type"},
    "remove_edge": {"type", "src", "dst", "edge_type"},
    "set_edge_features": {"type", "src", "dst", "attr", "edge_type"},
    "set_features": {"type", "id", "x", "node_type"},
    "remove_node": {"type", "id", "node_type"},
}
OPERATION_TYPES = tuple(OPERATION_FIELDS)
FLOAT32_MAX = float(np.finfo(np.float32).max)


class DecodingGraph(Protocol):
    """What decoding checks operations against: the graph's types, widths and classes
    (``GraphStore``, or ``RemoteStore`` for a graph in Redis)."""

    @property
    def schema(self) -> GraphSchema: ...

    @property
    def num_classes(self) -> int: ...

    @property
    def class_names(self) -> list[str] | None: ...


class Rejection(Enum):
    """Why an update cannot be applied (the handler maps each to an HTTP status)."""

    INVALID = "invalid"  # a malformed operation
    MISSING = "missing"  # names a node or an edge the graph does not have
    CONFLICT = "conflict"  # adds a node that exists, or reuses a removed ID
    LIMIT = "limit"  # over one of the overlay's size limits


class UpdateRejected(ValueError):
    """An update request that cannot be applied: which operation, and why (``kind``)."""

    def __init__(self, kind: Rejection, index: int, message: str) -> None:
        super().__init__(f"operation {index}: {message}")
        self.kind = kind
        self.index = index


@dataclass(frozen=True, eq=False)
class AddNode:
    """A new node of ``node_type`` with its features and class index (-1: unlabelled)."""

    node_id: NodeId
    x: np.ndarray
    label: int
    node_type: str


@dataclass(frozen=True, eq=False)
class SetFeatures:
    node_id: NodeId
    x: np.ndarray
    node_type: str


@dataclass(frozen=True)
class RemoveNode:
    node_id: NodeId
    node_type: str


@dataclass(frozen=True, eq=False)
class AddEdge:
    """``src -> dst`` under ``edge_type``; ``attr`` its features (None on a relation
    without)."""

    src: NodeId
    dst: NodeId
    attr: np.ndarray | None
    edge_type: str


@dataclass(frozen=True)
class RemoveEdge:
    src: NodeId
    dst: NodeId
    edge_type: str


@dataclass(frozen=True, eq=False)
class SetEdgeFeatures:
    src: NodeId
    dst: NodeId
    attr: np.ndarray
    edge_type: str


Operation = AddNode | SetFeatures | RemoveNode | AddEdge | RemoveEdge | SetEdgeFeatures
EdgeOperation = AddEdge | RemoveEdge | SetEdgeFeatures


def decode_operations(raw: Sequence[Any], graph: DecodingGraph) -> list[Operation]:
    """``raw`` (JSON objects) as typed operations of ``graph``; :class:`UpdateRejected`
    (``INVALID``) naming the first malformed one."""
    return [_decode(index, operation, graph) for index, operation in enumerate(raw)]


def encode_operations(operations: Sequence[Operation]) -> list[dict[str, Any]]:
    """The canonical JSON form of ``operations`` (what the update log stores)."""
    return [_encode(operation) for operation in operations]


def _decode(index: int, operation: Any, graph: DecodingGraph) -> Operation:
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
    if kind in ("add_node", "set_features", "remove_node"):
        node_type = _node_type(index, operation, graph)
        if kind == "add_node":
            node_id = operation.get("id")
            if isinstance(node_id, bool) or not isinstance(node_id, int | str):
                raise UpdateRejected(
                    Rejection.INVALID,
                    index,
                    f"add_node needs an integer or string id, got {shown(node_id)}",
                )
            width = graph.schema.node_type(node_type).feature_dim
            if width == 0:
                raise UpdateRejected(
                    Rejection.INVALID,
                    index,
                    f"{node_type} nodes have no features, so a model tells them apart by their "
                    "stored index (an embedding per node): a new one cannot be added",
                )
            x = _vector(index, operation, "x", width)
            if node_type != graph.schema.target and operation.get("label") is not None:
                raise UpdateRejected(
                    Rejection.INVALID,
                    index,
                    f"only {graph.schema.target} nodes have labels; send this {node_type} "
                    "without one",
                )
            label = _label(index, operation.get("label"), graph)
            return AddNode(node_id, x, label, node_type)
        node_id = _node_id(index, operation, "id")
        if kind == "set_features":
            x = _vector(index, operation, "x", graph.schema.node_type(node_type).feature_dim)
            return SetFeatures(node_id, x, node_type)
        return RemoveNode(node_id, node_type)
    edge_type = _edge_type(index, operation, graph)
    src, dst = _node_id(index, operation, "src"), _node_id(index, operation, "dst")
    if kind == "remove_edge":
        return RemoveEdge(src, dst, edge_type)
    attr = _edge_attr(index, kind, operation, graph, edge_type)
    if kind == "add_edge":
        return AddEdge(src, dst, attr, edge_type)
    assert attr is not None
    return SetEdgeFeatures(src, dst, attr, edge_type)


def _encode(operation: Operation) -> dict[str, Any]:
    if isinstance(operation, AddNode):
        encoded: dict[str, Any] = {"type": "add_node", "id": operation.node_id}
        encoded["x"] = operation.x.tolist()
        if operation.label >= 0:
            encoded["label"] = operation.label
        return {**encoded, "node_type": operation.node_type}
    if isinstance(operation, SetFeatures):
        return {
            "type": "set_features",
            "id": operation.node_id,
            "x": operation.x.tolist(),
            "node_type": operation.node_type,
        }
    if isinstance(operation, RemoveNode):
        return {"type": "remove_node", "id": operation.node_id, "node_type": operation.node_type}
    kind = {AddEdge: "add_edge", RemoveEdge: "remove_edge", SetEdgeFeatures: "set_edge_features"}
    encoded = {"type": kind[type(operation)], "src": operation.src, "dst": operation.dst}
    attr = getattr(operation, "attr", None)
    if attr is not None:
        encoded["attr"] = attr.tolist()
    return {**encoded, "edge_type": operation.edge_type}


def _node_type(index: int, operation: dict[str, Any], graph: DecodingGraph) -> str:
    """The operation's ``node_type``, by default the type the graph serves."""
    node_type = operation.get("node_type", graph.schema.target)
    if node_type not in graph.schema.node_type_names:
        raise UpdateRejected(
            Rejection.INVALID,
            index,
            f"node_type {shown(node_type)} is not a node type of this graph "
            f"({', '.join(graph.schema.node_type_names)})",
        )
    return str(node_type)


def _edge_type(index: int, operation: dict[str, Any], graph: DecodingGraph) -> str:
    """The operation's ``edge_type``, by default the graph's only relation."""
    names = graph.schema.edge_type_names
    if "edge_type" not in operation:
        if len(names) == 1:
            return names[0]
        raise UpdateRejected(
            Rejection.INVALID,
            index,
            f"this graph has several relations: name the edge's edge_type, one of "
            f"{', '.join(names)}",
        )
    edge_type = operation["edge_type"]
    if edge_type not in names:
        raise UpdateRejected(
            Rejection.INVALID,
            index,
            f"edge_type {shown(edge_type)} is not an edge type of this graph ({', '.join(names)})",
        )
    return str(edge_type)


def _node_id(index: int, operation: dict[str, Any], field: str) -> NodeId:
    node_id = operation.get(field)
    if isinstance(node_id, bool) or not isinstance(node_id, int | str):
        raise UpdateRejected(
            Rejection.INVALID, index, f"{field} must be an integer or string node ID"
        )
    return node_id


def _edge_attr(
    index: int, kind: str, operation: dict[str, Any], graph: DecodingGraph, edge_type: str
) -> np.ndarray | None:
    """The operation's ``attr`` as float32: required by ``set_edge_features`` and, on a
    relation with edge features, by ``add_edge``; refused on a relation without."""
    relation = graph.schema.relations[graph.schema.relation_index(edge_type)]
    width = relation.edge_feature_dim
    if width == 0:
        if kind == "set_edge_features":
            problem = f"{edge_type} has no edge features, so set_edge_features does not apply"
        elif "attr" in operation:
            problem = f"{edge_type} has no edge features: send add_edge without attr"
        else:
            return None
        having = [r.name for r in graph.schema.relations if r.edge_feature_dim]
        if having:
            problem += f" (the relations with edge features: {', '.join(having)})"
        raise UpdateRejected(Rejection.INVALID, index, problem)
    if "attr" not in operation:
        names = ", ".join(relation.edge_feature_names)
        raise UpdateRejected(
            Rejection.INVALID,
            index,
            f"{kind} needs attr, a list of the {width} edge features of this graph ({names})",
        )
    return _vector(index, operation, "attr", width)


def _vector(index: int, operation: dict[str, Any], field: str, width: int) -> np.ndarray:
    """``operation[field]`` as a finite float32 vector, ``width`` long."""
    values = operation.get(field)
    if not isinstance(values, list) or len(values) != width:
        got = len(values) if isinstance(values, list) else type(values).__name__
        raise UpdateRejected(
            Rejection.INVALID, index, f"{field} must be a list of {width} numbers, got {got}"
        )
    kinds = set(map(type, values))  # one pass at C speed; JSON gives int and float only
    if not kinds <= {int, float} and not all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in values
    ):
        raise UpdateRejected(Rejection.INVALID, index, f"{field} must hold numbers only")
    if kinds == {float}:  # the usual vector: checked in numpy
        wide = np.array(values, dtype=np.float64)
        finite = bool(np.isfinite(wide).all())
    else:  # an int is checked before any conversion: 10**400 overflows float() itself
        huge = next(
            (i for i, v in enumerate(values) if isinstance(v, int) and abs(v) > FLOAT32_MAX), None
        )
        if huge is not None:
            raise UpdateRejected(
                Rejection.INVALID,
                index,
                f"{field}[{huge}] is an integer of {len(str(abs(values[huge])))} digits, which "
                f"overflows float32 (±{FLOAT32_MAX:.7g}); send numbers within that range",
            )
        finite = all(math.isfinite(v) for v in values)
        wide = np.array(values, dtype=np.float64) if finite else np.empty(0)
    if not finite:
        raise UpdateRejected(
            Rejection.INVALID, index, f"{field} holds NaN or infinity; send finite numbers"
        )
    with np.errstate(over="ignore"):
        vector = wide.astype(np.float32)
    if not np.isfinite(vector).all():
        raise UpdateRejected(
            Rejection.INVALID,
            index,
            f"{field} holds a value outside float32's range (±{FLOAT32_MAX:.7g})",
        )
    return vector


def _label(index: int, label: Any, graph: DecodingGraph) -> int:
    if label is None:
        return -1
    names = graph.class_names
    if isinstance(label, str) and names and label in names:
        return names.index(label)
    if (
        isinstance(label, int)
        and not isinstance(label, bool)
        and 0 <= label < max(graph.num_classes, 1)
    ):
        return label
    raise UpdateRejected(
        Rejection.INVALID, index, f"label {shown(label)} is not a class of this graph"
    )


def shown(value: Any) -> str:
    """``repr`` of a client's value for an error message, cut short: a 400-digit ID is quoted
    by its ends, not in full."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:18]}...{text[-18:]} ({len(text)} characters)"
