"""The reads serving makes of a graph, the same whether it holds the stored graph or the stored
graph plus live updates: :class:`GraphStore` and :class:`GraphOverlay` both satisfy it, so no
caller asks which one it holds (the role PyG's FeatureStore and GraphStore play for its
loaders)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class InLists:
    """In-edge lists of some nodes as a small CSC: node ``i``'s sources are
    ``indices[indptr[i]:indptr[i+1]]`` (int64 global indices, grouped by relation as stored),
    with each edge's ID (its CSC position) in ``edge_ids`` and its relation in ``relations``."""

    indptr: np.ndarray
    indices: np.ndarray
    edge_ids: np.ndarray
    relations: np.ndarray


class GraphView(Protocol):
    """Node IDs, node and edge feature rows and in- and out-degrees of one graph version."""

    @property
    def num_nodes(self) -> int:
        """Size of the internal index space."""
        ...

    @property
    def edge_feature_dim(self) -> int:
        """Features per edge, ``D`` (0 when the graph has none)."""
        ...

    def lookup(self, ids: Sequence[int | str], node_type: str | None = None) -> np.ndarray:
        """Internal indices (int64) of external ``ids`` of ``node_type`` (default: the type
        the graph serves); -1 for an ID the graph lacks."""
        ...

    def types_of(self, nodes: np.ndarray) -> np.ndarray:
        """The node type index of each of the internal ``nodes`` (graph_assets.schema)."""
        ...

    def in_lists(self, nodes: np.ndarray) -> InLists:
        """The in-edge lists of internal ``nodes`` with their edge IDs and relations, in
        stored order: what a sampler reads of a graph it does not map (one read for a whole
        frontier, every relation at once)."""
        ...

    def edge_relations(self, edge_ids: np.ndarray) -> np.ndarray:
        """The relation index of each edge by ID."""
        ...

    def feature_rows(self, nodes: np.ndarray) -> np.ndarray:
        """float32 ``[len(nodes), F]`` feature rows of internal ``nodes``, all of one type (a
        copy)."""
        ...

    def edge_feature_rows(self, edge_ids: np.ndarray) -> np.ndarray:
        """float32 ``[len(edge_ids), D]`` features of edges by ID, all of one relation, an
        edge's ID being its position in the stored CSC arrays (a copy; ``[len, 0]`` when ``D``
        is 0)."""
        ...

    def degree_rows(self, nodes: np.ndarray) -> np.ndarray:
        """int64 ``[len(nodes)]`` full-graph in-degrees of internal ``nodes``."""
        ...

    def out_degree_rows(self, nodes: np.ndarray) -> np.ndarray:
        """int64 ``[len(nodes)]`` full-graph out-degrees of internal ``nodes``, self-loops not
        counted: what PyG's ``get_laplacian`` (ChebConv) normalises by."""
        ...

    def largest_out_degree(self) -> int:
        """The largest of every node's ``out_degree_rows`` (0 for a graph without edges): the
        scale of a ChebConv without normalisation and without ``lambda_max``."""
        ...

    def external_ids(self, nodes: np.ndarray) -> list[int | str]:
        """External IDs of internal ``nodes`` (ints or strs, as the input had them)."""
        ...
