"""Graph archive requests: one inline graph per request (JSON, or KServe v2 tensors ``x`` and
``edge_index``), checked against the model's feature widths and the archive's size limits.

The graph is served as sent: self-loops and parallel edges are kept, in the client's order, so
``edge_attr`` row ``k`` stays the features of edge ``k``. Edge features are JSON-only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, StrictBool, StrictInt

from handler.protocol.body import as_request, show
from handler.protocol.errors import BadRequest
from handler.protocol.kserve_v2 import (
    FLOAT_TYPES,
    INT_TYPES,
    Wanted,
    is_v2_body,
    raw_length,
    read_inputs,
)
from handler.protocol.validation import Number, Strict, check_count, float32_features, validate

GRAPH_EXAMPLE = '{"graph": {"x": [[1.0, 0.5], [0.2, 0.1]], "edge_index": [[0, 1], [1, 0]]}}'
V2_GRAPH_EXAMPLE = (
    '{"inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [1.0, 0.5, 0.2, '
    '0.1]}, {"name": "edge_index", "shape": [2, 2], "datatype": "INT64", "data": [0, 1, 1, 0]}]}'
)
_JSON_NAMES = ("graph.x", "graph.edge_index")
_EDGE_ATTR_EXAMPLE = (
    '{"graph": {"x": [[1.0, 0.5], [0.2, 0.1]], "edge_index": [[0, 1], [1, 0]], '
    '"edge_attr": [[0.3], [0.3]]}}'
)
_V2_NAMES = ("the x tensor", "the edge_index tensor")


@dataclass(frozen=True, eq=False)
class GraphRequest:
    """``{"graph": {"x": [[...], ...], "edge_index": [[src...], [dst...]]}}``.

    Attributes:
        x: ``[n, F]`` float32, finite.
        edge_index: ``[2, e]`` int64 in ``[0, n)``, as sent (self-loops and parallel edges
            kept).
        edge_attr: ``[e, D]`` float32, finite, row ``k`` for edge ``k``; None when the model
            reads no edge features (``D`` = 0).
        return_embedding: also return the pooled graph embedding.
        protocol: ``json``, or ``v2`` (tensors ``x`` and ``edge_index``; answered in kind).
        request_id: the v2 request's ``id``, echoed in its response.
    """

    x: np.ndarray
    edge_index: np.ndarray
    return_embedding: bool
    edge_attr: np.ndarray | None = None
    protocol: Literal["json", "v2"] = "json"
    request_id: str | None = None


class _Graph(Strict):
    x: list[list[Number]]
    edge_index: Annotated[list[list[StrictInt]], Field(min_length=2, max_length=2)]
    edge_attr: list[list[Number]] | None = None


class _GraphBody(Strict):
    graph: _Graph
    return_embedding: StrictBool = False


def parse_graph_request(
    item: Any, feature_dim: int, max_nodes: int, max_edges: int, edge_dim: int = 0
) -> GraphRequest:
    """An inline graph, checked against the model's feature widths (``edge_dim``: the edge
    feature width it reads, 0 for none) and the archive's limits."""
    body = as_request(item).json_object(GRAPH_EXAMPLE)
    if is_v2_body(body):
        if edge_dim:
            raise BadRequest(
                f"this archive's model reads {edge_dim} edge features per edge, which a KServe "
                f"v2 request cannot carry; send JSON with graph.edge_attr, e.g. "
                f"{_EDGE_ATTR_EXAMPLE}"
            )
        return parse_v2_graph(body, feature_dim, max_nodes, max_edges)
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
    edge_index = _edge_index(src, dst, x.shape[0], _JSON_NAMES)
    return GraphRequest(
        x=x,
        edge_index=edge_index,
        return_embedding=parsed.return_embedding,
        edge_attr=_edge_attr(parsed.graph.edge_attr, len(src), edge_dim),
    )


def _edge_attr(rows: list[list[float]] | None, edges: int, edge_dim: int) -> np.ndarray | None:
    """``graph.edge_attr`` as ``[edges, edge_dim]`` float32: required where the model reads
    edge features, refused where it reads none."""
    if not edge_dim:
        if rows is not None:
            raise BadRequest(
                "graph.edge_attr: this archive's model reads no edge features; leave "
                f"graph.edge_attr out, e.g. {GRAPH_EXAMPLE}"
            )
        return None
    shape = f"[{edges}, {edge_dim}] (one row of {edge_dim} edge features per edge of edge_index)"
    if rows is None:
        raise BadRequest(
            f"graph.edge_attr is required: this archive's model reads edge features; send "
            f"{shape}, e.g. {_EDGE_ATTR_EXAMPLE}"
        )
    if len(rows) != edges:
        raise BadRequest(f"graph.edge_attr must have shape {shape}; got {len(rows)} rows")
    wrong = next((k for k, row in enumerate(rows) if len(row) != edge_dim), None)
    if wrong is not None:
        raise BadRequest(
            f"graph.edge_attr must have shape {shape}; row {wrong} holds {len(rows[wrong])} values"
        )
    if not rows:
        return np.zeros((0, edge_dim), dtype=np.float32)
    return float32_features(rows, edge_dim, "graph.edge_attr")


def parse_v2_graph(
    body: dict[str, Any], feature_dim: int, max_nodes: int, max_edges: int
) -> GraphRequest:
    """A v2 request's graph: ``x`` (FP32 or FP64, shape ``[n, F]``) and ``edge_index``
    (INT64 or INT32, shape ``[2, e]``: the sources, then the destinations), with the checks
    of the JSON body."""
    nodes_sent = raw_length(body, "x") // max(feature_dim, 1)
    check_count("the x tensor (nodes)", nodes_sent, max_nodes, "max_graph_nodes")
    edges_sent = raw_length(body, "edge_index") // 2
    check_count("the edge_index tensor (edges)", edges_sent, max_edges, "max_graph_edges")
    wanted = [Wanted(("x",), FLOAT_TYPES), Wanted(("edge_index",), INT_TYPES, may_be_empty=True)]
    tensors, request_id = read_inputs(body, wanted, V2_GRAPH_EXAMPLE)
    x_tensor, edges = tensors["x"], tensors["edge_index"]
    if len(x_tensor.shape) != 2 or x_tensor.shape[1] != feature_dim:
        raise BadRequest(
            f"the x tensor must have shape [n, {feature_dim}]: one row of {feature_dim} "
            f"features (the model's width) per node; got shape {list(x_tensor.shape)}"
        )
    if len(edges.shape) != 2 or edges.shape[0] != 2:
        raise BadRequest(
            "the edge_index tensor must have shape [2, e]: the e sources, then the e "
            f"destinations; got shape {list(edges.shape)}"
        )
    nodes, count = x_tensor.shape[0], edges.shape[1]
    rows = [x_tensor.values[i * feature_dim : (i + 1) * feature_dim] for i in range(nodes)]
    x = float32_features(rows, feature_dim, "the x tensor")
    edge_index = _edge_index(edges.values[:count], edges.values[count:], nodes, _V2_NAMES)
    return GraphRequest(
        x=x,
        edge_index=edge_index,
        return_embedding=False,
        protocol="v2",
        request_id=request_id,
    )


def _edge_index(
    src: list[int], dst: list[int], num_nodes: int, names: tuple[str, str]
) -> np.ndarray:
    """``[2, e]`` int64 node numbers, each in ``[0, num_nodes)``; ``names``: what the client
    calls the features and the edges, for the message."""
    try:
        edge_index = np.array([src, dst], dtype=np.int64).reshape(2, -1)
    except OverflowError:  # beyond int64: JSON integers are unbounded
        edge_index = None
    if edge_index is None or (
        edge_index.size and (edge_index.min() < 0 or edge_index.max() >= num_nodes)
    ):
        numbers = src + dst
        raise BadRequest(
            f"{names[1]} holds node numbers outside [0, {num_nodes - 1}] (the rows of "
            f"{names[0]}): min {show(min(numbers))}, max {show(max(numbers))}"
        )
    return edge_index
