"""A validated input graph of typed nodes and relations, before `write_store` renumbers it.

A graph given as one nodes file and one edges file (`RawGraph`) is the one-type case:
:func:`as_typed` names its type ``node`` and its relation ``node__to__node``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from graph_assets.reader import RawGraph
from graph_assets.schema import DEFAULT_NODE_TYPE, DEFAULT_RELATION, EdgeType


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
