"""The validated graph tables that input readers produce and the store writer consumes: one type
(:class:`RawGraph`) or several (:class:`TypedGraph`), a one-type graph being the one-type case
(:func:`as_typed`). Readers (``graph_assets.input``) import this and the store
(``graph_assets.stored``); the writer imports this alone, so the store never depends on how a
graph was read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from graph_assets.schema import DEFAULT_NODE_TYPE, DEFAULT_RELATION, EdgeType

# How a graph's external IDs are stored: int64, or UTF-8 bytes when any ID is not an integer.
IdKind = Literal["int", "str"]

# RawGraph's default edge_features, which __post_init__ replaces by the [E, 0] array of its E.
_NO_EDGE_FEATURES = np.empty((0, 0), dtype=np.float32)


@dataclass(frozen=True, eq=False)
class RawGraph:
    """A validated input graph in nodes-file order, before `write_store` renumbers it.

    Attributes:
        ids: ``[N]`` external IDs: int64, or UTF-8 bytes ``S<k>`` when any ID is not an
            integer in canonical form (see `read_graph_dir`).
        src: ``[E]`` int64 position in ``ids`` of each edge's source, in edges-file order; with
            ``undirected`` the reverse edges follow, in the same order.
        dst: ``[E]`` int64 position in ``ids`` of each edge's destination.
        features: ``[N, F]`` float32, all finite.
        labels: ``[N]`` int64 class index, -1 for an unlabelled node.
        class_names: ``class_names[k]`` names class ``k`` when labels were names (sorted, so
            the numbering does not depend on row order); None when labels were integers.
        feature_names: the ``F`` feature column names in file order.
        edge_features: ``[E, D]`` float32, all finite, row ``k`` for edge ``k`` (a reverse
            edge has its edge's row). ``D`` may be 0; the default is no edge features.
        edge_feature_names: the ``D`` edge feature column names in file order.
        undirected: whether the reverse of every edge but a self-loop was added.
    """

    ids: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    features: np.ndarray
    labels: np.ndarray
    class_names: list[str] | None
    feature_names: list[str]
    edge_features: np.ndarray = field(default_factory=lambda: _NO_EDGE_FEATURES)
    edge_feature_names: list[str] = field(default_factory=list)
    undirected: bool = False

    def __post_init__(self) -> None:
        if self.edge_features is _NO_EDGE_FEATURES:  # the default: [E, 0] for this E
            object.__setattr__(self, "edge_features", np.empty((len(self.src), 0), np.float32))
        check_edge_features(
            "edge_features", self.edge_features, len(self.src), len(self.edge_feature_names)
        )

    @property
    def id_kind(self) -> IdKind:
        return "int" if self.ids.dtype.kind == "i" else "str"

    @property
    def num_classes(self) -> int:
        """Number of classes: named ones, or the largest class index + 1 (0 if unlabelled)."""
        if self.class_names is not None:
            return len(self.class_names)
        return int(self.labels.max()) + 1 if self.labels.size else 0


@dataclass(frozen=True, eq=False)
class RawNodes:
    """One node type's nodes in file order.

    Attributes:
        name: the type's name.
        ids: ``[N_t]`` external IDs, int64 or UTF-8 bytes ``S<k>``, unique within the type.
        features: ``[N_t, F_t]`` float32, all finite; ``F_t`` may be 0 (a featureless type).
        feature_names: the ``F_t`` feature column names.
    """

    name: str
    ids: np.ndarray
    features: np.ndarray
    feature_names: list[str]

    @property
    def feature_dim(self) -> int:
        return int(self.features.shape[1])


@dataclass(frozen=True, eq=False)
class RawRelation:
    """One relation's edges in file order (reverses, with ``undirected``, in their own
    relation).

    Attributes:
        edge_type: source type, relation, destination type.
        src: ``[E_r]`` int64 position of each source in its type's ``ids``.
        dst: ``[E_r]`` int64 position of each destination in its type's ``ids``.
        edge_features: ``[E_r, D_r]`` float32, all finite (``D_r`` may be 0).
        edge_feature_names: the ``D_r`` column names.
    """

    edge_type: EdgeType
    src: np.ndarray
    dst: np.ndarray
    edge_features: np.ndarray
    edge_feature_names: list[str]


@dataclass(frozen=True, eq=False)
class TypedGraph:
    """Node types, relations, and the target type's labels.

    Attributes:
        node_types: every node type (any order; the store puts the target first).
        relations: every relation, in the order the store keeps them.
        target: the type served and labelled.
        labels: ``[N_target]`` int64 class index in the target type's file order, -1 unlabelled.
        class_names: names of the classes when labels were names, else None.
        undirected: whether every relation's reverse was added.
    """

    node_types: tuple[RawNodes, ...]
    relations: tuple[RawRelation, ...]
    target: str
    labels: np.ndarray
    class_names: list[str] | None
    undirected: bool = False

    @property
    def num_classes(self) -> int:
        """Number of classes: named ones, or the largest class index + 1 (0 if unlabelled)."""
        if self.class_names is not None:
            return len(self.class_names)
        return int(self.labels.max()) + 1 if self.labels.size else 0


def check_edge_features(field: str, features: np.ndarray, edges: int, width: int) -> None:
    """ValueError unless ``features`` is float32 ``[edges, width]``: one row per edge, one
    column per edge feature name."""
    shape = (edges, width)
    if features.dtype != np.float32 or features.shape != shape:
        raise ValueError(
            f"{field} must be float32 {list(shape)} (one row per edge, one column per "
            f"edge_feature_names entry), got {features.dtype} {list(features.shape)}"
        )


def as_typed(raw: RawGraph) -> TypedGraph:
    """A one-type graph as the typed graph it is: type ``node``, relation ``node__to__node``."""
    nodes = RawNodes(DEFAULT_NODE_TYPE, raw.ids, raw.features, raw.feature_names)
    relation = RawRelation(
        EdgeType(DEFAULT_NODE_TYPE, DEFAULT_RELATION, DEFAULT_NODE_TYPE),
        raw.src,
        raw.dst,
        raw.edge_features,
        raw.edge_feature_names,
    )
    return TypedGraph(
        (nodes,), (relation,), DEFAULT_NODE_TYPE, raw.labels, raw.class_names, raw.undirected
    )
