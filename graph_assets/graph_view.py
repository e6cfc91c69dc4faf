"""The reads serving makes of a graph, the same whether it holds the stored graph or the stored
graph plus live updates: :class:`GraphStore` and :class:`GraphOverlay` both satisfy it, so no
caller asks which one it holds (the role PyG's FeatureStore and GraphStore play for its
loaders)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np


class GraphView(Protocol):
    """Node IDs, feature rows and in-degrees of one graph version."""

    @property
    def num_nodes(self) -> int:
        """Size of the internal index space."""
        ...

    def lookup(self, ids: Sequence[int | str]) -> np.ndarray:
        """Internal indices (int64) of external ``ids``; -1 for an ID the graph lacks."""
        ...

    def feature_rows(self, nodes: np.ndarray) -> np.ndarray:
        """float32 ``[len(nodes), F]`` feature rows of internal ``nodes`` (a copy)."""
        ...

    def degree_rows(self, nodes: np.ndarray) -> np.ndarray:
        """int64 ``[len(nodes)]`` full-graph in-degrees of internal ``nodes``."""
        ...

    def external_ids(self, nodes: np.ndarray) -> list[int | str]:
        """External IDs of internal ``nodes`` (ints or strs, as the input had them)."""
        ...
