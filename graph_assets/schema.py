"""What a graph is made of: node types and edge types (PyG's ``(src, relation, dst)`` triples).

A homogeneous graph is the one-type case: one node type, one edge type. Every store, sampler
and view works in one *global* node index space in which each node type holds a contiguous
range (type ``t`` is ``[offset_t, offset_t + num_nodes_t)``, in schema order, as PyG's
``HeteroData.to_homogeneous`` lays them out), so code that does not care about types (the
sampler, the overlay, the update log, precomputed rows) handles a node as one integer, and code
that does asks the schema which type an index has.

Type and relation names are any text without ``__`` (the triple's separator, as in
``user__pays__merchant``) or ``/``, not empty, not ``.`` or ``..``, without leading or trailing
spaces: ``user name``, ``a.b`` and ``items`` are names (models key their modules by
``model.hetero_recipes.module_key``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

SEPARATOR = "__"
REVERSE_PREFIX = "rev_"  # PyG's ToUndirected names a relation's reverse rev_<relation>
# The names a graph given as one nodes file and one edges file gets.
DEFAULT_NODE_TYPE = "node"
DEFAULT_RELATION = "to"


def check_name(name: object, what: str) -> str:
    """``name`` if it can name a node type or relation, else ValueError saying why."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a {what} name must be non-empty text, got {name!r}")
    if SEPARATOR in name or "/" in name:
        raise ValueError(f"a {what} name may not contain '{SEPARATOR}' or '/', got {name!r}")
    if name in (".", ".."):
        raise ValueError(
            f"a {what} name may not be '.' or '..', which name folders (this one and its "
            f"parent), got {name!r}"
        )
    if name != name.strip() or not name.isprintable():
        raise ValueError(
            f"a {what} name may not start or end with spaces or hold control characters, "
            f"got {name!r}"
        )
    return name


@dataclass(frozen=True)
class EdgeType:
    """An edge type: edges from ``src`` nodes to ``dst`` nodes under ``relation``."""

    src: str
    relation: str
    dst: str

    def __post_init__(self) -> None:
        check_name(self.src, "node type")
        check_name(self.relation, "relation")
        check_name(self.dst, "node type")

    @property
    def name(self) -> str:
        """``src__relation__dst``, as requests, files and updates write it."""
        return SEPARATOR.join((self.src, self.relation, self.dst))

    @property
    def triple(self) -> tuple[str, str, str]:
        """PyG's edge-type key."""
        return (self.src, self.relation, self.dst)

    def reverse(self) -> EdgeType:
        """The reverse relation as PyG's ``ToUndirected`` names it (``rev_<relation>``)."""
        return EdgeType(self.dst, REVERSE_PREFIX + self.relation, self.src)

    @classmethod
    def parse(cls, name: str) -> EdgeType:
        """``"user__pays__merchant"`` -> ``EdgeType("user", "pays", "merchant")``; ValueError
        naming the expected form otherwise."""
        parts = name.split(SEPARATOR) if isinstance(name, str) else []
        if len(parts) != 3:
            raise ValueError(
                f"an edge type is written <src_type>{SEPARATOR}<relation>{SEPARATOR}<dst_type>, "
                f"e.g. user{SEPARATOR}pays{SEPARATOR}merchant; got {name!r}"
            )
        return cls(*parts)


@dataclass(frozen=True)
class NodeType:
    """One node type: its nodes, their feature columns and ID kind, and its global range."""

    name: str
    num_nodes: int
    offset: int
    feature_dim: int  # 0: a featureless type (models index such nodes by their position)
    id_kind: str  # "int" or "str": each type has its own IDs

    @property
    def stop(self) -> int:
        """One past the type's last global index."""
        return self.offset + self.num_nodes


@dataclass(frozen=True)
class Relation:
    """One edge type as stored: its edges and their feature columns."""

    edge_type: EdgeType
    num_edges: int
    edge_feature_names: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.edge_type.name

    @property
    def edge_feature_dim(self) -> int:
        return len(self.edge_feature_names)


@dataclass(frozen=True)
class GraphSchema:
    """The node types (in global index order) and relations of a graph, and the type served."""

    node_types: tuple[NodeType, ...]
    relations: tuple[Relation, ...]
    target: str

    def __post_init__(self) -> None:
        names = [t.name for t in self.node_types]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"node types must be at least one, without repeats, got {names}")
        offset = 0
        for node_type in self.node_types:
            if node_type.offset != offset or node_type.num_nodes < 0:
                raise ValueError(f"node type {node_type.name!r} does not start at {offset}")
            offset = node_type.stop
        edge_names = [r.name for r in self.relations]
        if len(set(edge_names)) != len(edge_names):
            raise ValueError(f"edge types must not repeat, got {edge_names}")
        for relation in self.relations:
            for end in (relation.edge_type.src, relation.edge_type.dst):
                if end not in names:
                    raise ValueError(
                        f"edge type {relation.name!r} names node type {end!r}, which the graph "
                        f"does not have (it has {', '.join(names)})"
                    )
        if self.target not in names:
            raise ValueError(f"the target node type {self.target!r} is not one of {names}")

    @property
    def num_nodes(self) -> int:
        return self.node_types[-1].stop

    @property
    def num_edges(self) -> int:
        return sum(r.num_edges for r in self.relations)

    @property
    def is_homogeneous(self) -> bool:
        return len(self.node_types) == 1 and len(self.relations) <= 1

    @property
    def node_type_names(self) -> list[str]:
        return [t.name for t in self.node_types]

    @property
    def edge_type_names(self) -> list[str]:
        return [r.name for r in self.relations]

    @property
    def target_type(self) -> NodeType:
        return self.node_type(self.target)

    def type_index(self, name: str) -> int:
        """Position of node type ``name``; KeyError naming the types otherwise."""
        for index, node_type in enumerate(self.node_types):
            if node_type.name == name:
                return index
        raise KeyError(f"no node type {name!r}: this graph has {', '.join(self.node_type_names)}")

    def node_type(self, name: str) -> NodeType:
        return self.node_types[self.type_index(name)]

    def relation_index(self, name: str) -> int:
        """Position of edge type ``name`` (``src__relation__dst``); KeyError naming them."""
        for index, relation in enumerate(self.relations):
            if relation.name == name:
                return index
        raise KeyError(f"no edge type {name!r}: this graph has {', '.join(self.edge_type_names)}")

    def relations_into(self, node_type: str) -> list[int]:
        """Indices of the relations whose destination is ``node_type``, in schema order (the
        order of each in-list's relation segments in the store)."""
        return [i for i, r in enumerate(self.relations) if r.edge_type.dst == node_type]

    def types_of(self, nodes: np.ndarray) -> np.ndarray:
        """Node type index of each global index in ``nodes``."""
        stops = np.array([t.stop for t in self.node_types], dtype=np.int64)
        return np.searchsorted(stops, np.asarray(nodes, dtype=np.int64), side="right")

    def to_meta(self) -> dict[str, Any]:
        """The schema as meta.json records it."""
        return {
            "node_types": [
                {
                    "name": t.name,
                    "num_nodes": t.num_nodes,
                    "feature_dim": t.feature_dim,
                    "id_kind": t.id_kind,
                }
                for t in self.node_types
            ],
            "edge_types": [
                {
                    "src": r.edge_type.src,
                    "relation": r.edge_type.relation,
                    "dst": r.edge_type.dst,
                    "num_edges": r.num_edges,
                    "edge_feature_names": list(r.edge_feature_names),
                }
                for r in self.relations
            ],
            "target_node_type": self.target,
        }

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> GraphSchema:
        """The schema meta.json records (ValueError, naming the field, when it is malformed)."""
        try:
            node_types, offset = [], 0
            for entry in meta["node_types"]:
                count = _count(entry["num_nodes"])
                node_types.append(
                    NodeType(
                        name=check_name(entry["name"], "node type"),
                        num_nodes=count,
                        offset=offset,
                        feature_dim=_count(entry["feature_dim"]),
                        id_kind=_id_kind(entry["id_kind"]),
                    )
                )
                offset += count
            relations = [
                Relation(
                    edge_type=EdgeType(entry["src"], entry["relation"], entry["dst"]),
                    num_edges=_count(entry["num_edges"]),
                    edge_feature_names=_names(entry["edge_feature_names"]),
                )
                for entry in meta["edge_types"]
            ]
            return cls(tuple(node_types), tuple(relations), meta["target_node_type"])
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"node_types/edge_types are malformed: {error}") from None

    @classmethod
    def homogeneous(
        cls,
        num_nodes: int,
        num_edges: int,
        feature_dim: int,
        edge_feature_names: Sequence[str],
        id_kind: str,
    ) -> GraphSchema:
        """The one-type schema of a graph given as one nodes file and one edges file."""
        node = NodeType(DEFAULT_NODE_TYPE, num_nodes, 0, feature_dim, id_kind)
        relation = Relation(
            EdgeType(DEFAULT_NODE_TYPE, DEFAULT_RELATION, DEFAULT_NODE_TYPE),
            num_edges,
            tuple(edge_feature_names),
        )
        return cls((node,), (relation,), DEFAULT_NODE_TYPE)


def _names(value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TypeError(f"expected a list of names, found {value!r}")
    if len(set(value)) != len(value):
        raise TypeError(f"names must be distinct, found {value!r}")
    return tuple(value)


def _count(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise TypeError(f"expected an integer >= 0, found {value!r}")
    return value


def _id_kind(value: object) -> str:
    if value not in ("int", "str"):
        raise TypeError(f"id_kind must be 'int' or 'str', found {value!r}")
    return str(value)
