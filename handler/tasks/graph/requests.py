"""Graph archive requests: one inline graph per request, checked against the model's feature
width and the archive's size limits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np
from pydantic import Field, StrictBool, StrictInt

from handler.protocol.body import as_request, show
from handler.protocol.errors import BadRequest
from handler.protocol.validation import Number, Strict, check_count, float32_features, validate

GRAPH_EXAMPLE = '{"graph": {"x": [[1.0, 0.5], [0.2, 0.1]], "edge_index": [[0, 1], [1, 0]]}}'


@dataclass(frozen=True, eq=False)
class GraphRequest:
    """``{"graph": {"x": [[...], ...], "edge_index": [[src...], [dst...]]}}``.

    Attributes:
        x: ``[n, F]`` float32, finite.
        edge_index: ``[2, e]`` int64 in ``[0, n)``, self-loops and duplicates removed.
        return_embedding: also return the pooled graph embedding.
    """

    x: np.ndarray
    edge_index: np.ndarray
    return_embedding: bool


class _Graph(Strict):
    x: list[list[Number]]
    edge_index: Annotated[list[list[StrictInt]], Field(min_length=2, max_length=2)]


class _GraphBody(Strict):
    graph: _Graph
    return_embedding: StrictBool = False


def parse_graph_request(
    item: Any, feature_dim: int, max_nodes: int, max_edges: int
) -> GraphRequest:
    """An inline graph, checked against the model's feature width and the archive's limits."""
    body = as_request(item).json_object(GRAPH_EXAMPLE)
    graph = body.get("graph")
    if isinstance(graph, dict):
        if isinstance(graph.get("x"), list):
            check_count("graph.x (nodes)", len(graph["x"]), max_nodes, "max_graph_nodes")
        edges = graph.get("edge_index")
        if isinstance(edges, list) and edges and isinstance(edges[0], list):
            check_count("graph.edge_index (edges)", len(edges[0]), max_edges, "max_graph_edges")
    parsed = validate(_GraphBody, body, GRAPH_EXAMPLE)
    rows = parsed.graph.x
    if not rows:
        raise BadRequest("graph.x is empty; a graph needs at least one node")
    if len({len(row) for row in rows}) != 1:
        raise BadRequest("graph.x must be a matrix: every node needs the same number of features")
    x = float32_features(rows, feature_dim, "graph.x")
    src, dst = parsed.graph.edge_index
    if len(src) != len(dst):
        raise BadRequest(
            f"graph.edge_index must be two lists of equal length [[src...], [dst...]]; got "
            f"{len(src)} and {len(dst)}"
        )
    n = x.shape[0]
    edge_index = _edge_index(src, dst, n)
    return GraphRequest(
        x=x, edge_index=clean_edges(edge_index, n), return_embedding=parsed.return_embedding
    )


def _edge_index(src: list[int], dst: list[int], num_nodes: int) -> np.ndarray:
    """``[2, e]`` int64 node numbers, each in ``[0, num_nodes)``."""
    try:
        edge_index = np.array([src, dst], dtype=np.int64).reshape(2, -1)
    except OverflowError:  # beyond int64: JSON integers are unbounded
        edge_index = None
    if edge_index is None or (
        edge_index.size and (edge_index.min() < 0 or edge_index.max() >= num_nodes)
    ):
        numbers = src + dst
        raise BadRequest(
            f"graph.edge_index holds node numbers outside [0, {num_nodes - 1}] (the rows of "
            f"graph.x): min {show(min(numbers))}, max {show(max(numbers))}"
        )
    return edge_index


def clean_edges(edge_index: np.ndarray, num_nodes: int) -> np.ndarray:
    """Without self-loops and duplicates, sorted by (dst, src), as the dataset builder does."""
    src, dst = edge_index
    keep = src != dst
    keys = np.unique(dst[keep] * num_nodes + src[keep])
    return np.stack([keys % num_nodes, keys // num_nodes]).astype(np.int64)
