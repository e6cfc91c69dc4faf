"""Request bodies of the link, graph, embedding and cold-start requests, validated into dataclasses.

Each ``parse_*`` takes one raw TorchServe request and returns a frozen dataclass or raises an
ApiError (400 for a malformed body, 413 for one over the configured limits), checked before
anything else is done with the request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
)

from handler.errors import BadRequest, TooLarge
from handler.node_requests import NodeId, body_of, decode_body, show

Direction = Literal["in", "out", "both"]
M = TypeVar("M", bound="_Strict")
IdField = StrictInt | StrictStr
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_Number = StrictInt | StrictFloat


@dataclass(frozen=True)
class EmbeddingRequest:
    """``{"node_id": a, "return_embedding": true}`` or ``{"node_ids": [...], ...}``."""

    node_ids: tuple[NodeId, ...]
    single: bool
    return_embedding: bool


@dataclass(frozen=True, eq=False)
class NewNodeRequest:
    """``{"new_node": {"x": [...], "neighbors": [...], "direction": "both"}}``: a node that is
    not in the graph, scored as if it were added with these edges (the graph is unchanged).

    Attributes:
        x: ``[F]`` float32 features, finite.
        neighbors: existing node IDs it links to, deduplicated in first-seen order.
        direction: ``both`` (default) adds ``neighbor -> new`` and ``new -> neighbor`` for each
            neighbour, ``in`` only ``neighbor -> new``, ``out`` only ``new -> neighbor``.
        return_embedding: also return the node's embedding.
    """

    x: np.ndarray
    neighbors: tuple[NodeId, ...]
    direction: Direction
    return_embedding: bool


@dataclass(frozen=True)
class PairRequest:
    """``{"src": a, "dst": b}`` (``single``) or ``{"pairs": [[a, b], ...]}``."""

    pairs: tuple[tuple[NodeId, NodeId], ...]
    single: bool


@dataclass(frozen=True)
class TopKRequest:
    """``{"src": a, "top_k": k, "exclude_neighbors": true}``."""

    src: NodeId
    k: int
    exclude_neighbors: bool


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


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class _EmbeddingBody(_Strict):
    node_id: IdField | None = None
    node_ids: list[IdField] | None = None
    return_embedding: StrictBool = False


class _NewNode(_Strict):
    x: list[_Number]
    neighbors: list[IdField] = Field(default_factory=list)
    direction: Direction = "both"


class _NewNodeBody(_Strict):
    new_node: _NewNode
    return_embedding: StrictBool = False


class _LinkBody(_Strict):
    src: IdField | None = None
    dst: IdField | None = None
    pairs: list[Annotated[list[IdField], Field(min_length=2, max_length=2)]] | None = None
    top_k: StrictInt | None = None
    exclude_neighbors: StrictBool = True


class _Graph(_Strict):
    x: list[list[_Number]]
    edge_index: Annotated[list[list[StrictInt]], Field(min_length=2, max_length=2)]


class _GraphBody(_Strict):
    graph: _Graph
    return_embedding: StrictBool = False


def describe_errors(error: ValidationError) -> str:
    """One clause per offending field (the int/str alternatives of an ID folded together)."""
    parts: dict[str, str] = {}
    for detail in error.errors():
        loc = [str(p) for p in detail["loc"] if p not in ("int", "str", "float")]
        where = ".".join(loc) or "body"
        if detail["type"] == "extra_forbidden":
            parts[where] = f"{where}: unknown field"
        elif detail["type"] == "missing":
            parts[where] = f"{where}: missing"
        else:
            parts.setdefault(where, f"{where}: {detail['msg']}")
    return "; ".join(list(parts.values())[:5])


def request_body(item: Any, example: str) -> dict[str, Any]:
    """The JSON object of one TorchServe request, or BadRequest naming an ``example``."""
    body = decode_body(body_of(item))
    if not isinstance(body, dict):
        raise BadRequest(
            f"the body must be a JSON object like {example}; got {type(body).__name__}"
        )
    return body


def _validate(model: type[M], body: dict[str, Any], example: str) -> M:
    try:
        return model.model_validate(body)
    except ValidationError as error:
        raise BadRequest(
            f"invalid request: {describe_errors(error)}. Send e.g. {example}"
        ) from None


def _check_count(name: str, count: int, limit: int, setting: str) -> None:
    if count > limit:
        raise TooLarge(
            f"{name} has {count} entries; this archive accepts at most {limit} (split the "
            f"request, or raise {setting} in the model config)"
        )


def _beyond_float32(where: str) -> BadRequest:
    return BadRequest(f"{where} holds a NaN, an infinity or a value beyond float32's range")


def _features(values: list[Any], width: int, where: str) -> np.ndarray:
    """``values`` as finite float32, ``width`` wide."""
    try:
        x = np.asarray(values, dtype=np.float64)
    except OverflowError:  # an integer beyond float64's range: JSON integers are unbounded
        raise _beyond_float32(where) from None
    if x.shape[-1:] != (width,):
        raise BadRequest(
            f"{where} must hold {width} features per node (the graph's feature width); got "
            f"{x.shape[-1] if x.ndim else 0}"
        )
    if not (np.abs(x) <= _FLOAT32_MAX).all():  # NaN fails the comparison too
        raise _beyond_float32(where)
    return x.astype(np.float32)


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


EMBEDDING_EXAMPLE = '{"node_id": 42, "return_embedding": true}'
NEW_NODE_EXAMPLE = '{"new_node": {"x": [0.1, ...], "neighbors": [3, 7]}}'


def is_node_extra(body: Any) -> bool:
    """A node archive request this module handles (embeddings, cold start), by its keys."""
    return isinstance(body, dict) and ("return_embedding" in body or "new_node" in body)


def parse_node_extra(
    item: Any, feature_dim: int, max_ids: int
) -> EmbeddingRequest | NewNodeRequest:
    """An embedding request or a cold-start request of a node archive."""
    body = request_body(item, EMBEDDING_EXAMPLE)
    if "new_node" in body:
        new = body.get("new_node")
        if isinstance(new, dict) and isinstance(new.get("neighbors"), list):
            _check_count(
                "new_node.neighbors", len(new["neighbors"]), max_ids, "max_ids_per_request"
            )
        cold = _validate(_NewNodeBody, body, NEW_NODE_EXAMPLE)
        return NewNodeRequest(
            x=_features(cold.new_node.x, feature_dim, "new_node.x"),
            neighbors=tuple(dict.fromkeys(cold.new_node.neighbors)),
            direction=cold.new_node.direction,
            return_embedding=cold.return_embedding,
        )
    if isinstance(body.get("node_ids"), list):
        _check_count("node_ids", len(body["node_ids"]), max_ids, "max_ids_per_request")
    parsed = _validate(_EmbeddingBody, body, EMBEDDING_EXAMPLE)
    node_id, node_ids = parsed.node_id, parsed.node_ids
    if node_id is not None and node_ids is None:
        return EmbeddingRequest((node_id,), True, parsed.return_embedding)
    if node_id is None and node_ids is not None:
        if not node_ids:
            raise BadRequest("node_ids is empty; send at least one node ID")
        return EmbeddingRequest(tuple(node_ids), False, parsed.return_embedding)
    raise BadRequest(f"send exactly one of node_id and node_ids, e.g. {EMBEDDING_EXAMPLE}")


LINK_EXAMPLE = '{"src": 1, "dst": 2}, {"pairs": [[1, 2], [3, 4]]} or {"src": 1, "top_k": 10}'


def parse_link_request(item: Any, max_ids: int, max_top_k: int) -> PairRequest | TopKRequest:
    """One of the three link request forms; anything else is a 400."""
    body = request_body(item, LINK_EXAMPLE)
    if isinstance(body.get("pairs"), list):
        _check_count("pairs", len(body["pairs"]), max_ids, "max_ids_per_request")
    parsed = _validate(_LinkBody, body, LINK_EXAMPLE)
    if "exclude_neighbors" in body and parsed.top_k is None:
        raise BadRequest('exclude_neighbors goes with top_k: send {"src": 1, "top_k": 10}')
    src, dst, pairs, top_k = parsed.src, parsed.dst, parsed.pairs, parsed.top_k
    if src is not None and dst is not None and pairs is None and top_k is None:
        return PairRequest(pairs=((src, dst),), single=True)
    if pairs is not None and src is None and dst is None and top_k is None:
        if not pairs:
            raise BadRequest("pairs is empty; send at least one [src, dst] pair")
        return PairRequest(pairs=tuple((a, b) for a, b in pairs), single=False)
    if src is not None and top_k is not None and dst is None and pairs is None:
        if top_k < 1:
            raise BadRequest(f"top_k must be a positive integer; got {show(top_k)}")
        if top_k > max_top_k:
            raise TooLarge(
                f"top_k is {show(top_k)}; this archive returns at most {max_top_k} (raise "
                "max_top_k in the model config)"
            )
        return TopKRequest(src, top_k, parsed.exclude_neighbors)
    raise BadRequest(f"send one of {LINK_EXAMPLE}; got the field(s) {sorted(body)}")


GRAPH_EXAMPLE = '{"graph": {"x": [[1.0, 0.5], [0.2, 0.1]], "edge_index": [[0, 1], [1, 0]]}}'


def parse_graph_request(
    item: Any, feature_dim: int, max_nodes: int, max_edges: int
) -> GraphRequest:
    """An inline graph, checked against the model's feature width and the archive's limits."""
    body = request_body(item, GRAPH_EXAMPLE)
    graph = body.get("graph")
    if isinstance(graph, dict):
        if isinstance(graph.get("x"), list):
            _check_count("graph.x (nodes)", len(graph["x"]), max_nodes, "max_graph_nodes")
        edges = graph.get("edge_index")
        if isinstance(edges, list) and edges and isinstance(edges[0], list):
            _check_count("graph.edge_index (edges)", len(edges[0]), max_edges, "max_graph_edges")
    parsed = _validate(_GraphBody, body, GRAPH_EXAMPLE)
    rows = parsed.graph.x
    if not rows:
        raise BadRequest("graph.x is empty; a graph needs at least one node")
    if len({len(row) for row in rows}) != 1:
        raise BadRequest("graph.x must be a matrix: every node needs the same number of features")
    x = _features(rows, feature_dim, "graph.x")
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


def clean_edges(edge_index: np.ndarray, num_nodes: int) -> np.ndarray:
    """Without self-loops and duplicates, sorted by (dst, src), as the dataset builder does."""
    src, dst = edge_index
    keep = src != dst
    keys = np.unique(dst[keep] * num_nodes + src[keep])
    return np.stack([keys % num_nodes, keys // num_nodes]).astype(np.int64)
