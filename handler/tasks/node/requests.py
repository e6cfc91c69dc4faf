"""Node archive requests: predictions (JSON or KServe v2), embeddings and cold-start nodes, each
validated into a frozen dataclass or refused with an ApiError before anything else runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import Field, StrictBool

from handler.protocol.body import NodeId, as_request, show
from handler.protocol.errors import BadRequest
from handler.protocol.kserve_v2 import is_v2_body, parse_v2_node_ids, v2_parameter
from handler.protocol.validation import (
    IdField,
    Number,
    Strict,
    check_count,
    float32_features,
    validate,
)

Direction = Literal["in", "out", "both"]
NODE_EXAMPLE = '{"node_id": 42} or {"node_ids": [1, "acct_9"]}'
EMBEDDING_EXAMPLE = '{"node_id": 42, "return_embedding": true}'
NEW_NODE_EXAMPLE = '{"new_node": {"x": [0.1, ...], "neighbors": [3, 7]}}'
_ID_TYPES = (int, str)  # exactly these: bool is an int subclass but never a node ID


@dataclass(frozen=True)
class NodeRequest:
    """A node classification request.

    Attributes:
        node_ids: the requested IDs exactly as the client sent them (type preserved).
        single: True for ``{"node_id": x}`` (one object answered), False for ``{"node_ids": [..]}``.
        protocol: ``json`` (our contract) or ``v2`` (a KServe v2 body, answered in kind).
        request_id: the v2 request's ``id``, echoed in its response.
        node_type: the type of the requested nodes on a graph of several (None: the type the
            archive serves).
    """

    node_ids: tuple[NodeId, ...]
    single: bool
    protocol: Literal["json", "v2"] = "json"
    request_id: str | None = None
    node_type: str | None = None


@dataclass(frozen=True)
class EmbeddingRequest:
    """``{"node_id": a, "return_embedding": true}`` or ``{"node_ids": [...], ...}`` (with a
    ``node_type`` on a graph of several)."""

    node_ids: tuple[NodeId, ...]
    single: bool
    return_embedding: bool
    node_type: str | None = None


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
        edge_attr: ``[len(neighbors), D]`` float32 features of the edges to and from each
            neighbour (row ``i``: ``neighbors[i]``'s, in either direction), or None when the
            request sent none.
    """

    x: np.ndarray
    neighbors: tuple[NodeId, ...]
    direction: Direction
    return_embedding: bool
    edge_attr: np.ndarray | None = None


class _NodeBody(Strict):
    node_id: IdField | None = None
    node_ids: list[IdField] | None = None
    node_type: str | None = None


class _EmbeddingBody(Strict):
    node_id: IdField | None = None
    node_ids: list[IdField] | None = None
    return_embedding: StrictBool = False
    node_type: str | None = None


class _NewNode(Strict):
    x: list[Number]
    neighbors: list[IdField] = Field(default_factory=list)
    direction: Direction = "both"
    edge_attr: list[list[Number]] | None = None


class _NewNodeBody(Strict):
    new_node: _NewNode
    return_embedding: StrictBool = False


def _plain_request(body: dict[str, Any]) -> NodeRequest | None:
    """The common bodies, ``{"node_id": x}`` and ``{"node_ids": [...]}`` holding ints and strings
    only, accepted without the full validation (it cost ~20 us per request); anything else
    returns None and takes the validating path, which gives the same answer or the error."""
    if len(body) != 1:
        return None
    if type(body.get("node_id")) in _ID_TYPES:
        return NodeRequest(node_ids=(body["node_id"],), single=True)
    ids = body.get("node_ids")
    if type(ids) is list and len(ids) > 0 and all(type(x) in _ID_TYPES for x in ids):
        return NodeRequest(node_ids=tuple(ids), single=False)
    return None


def parse_node_request(item: Any, max_ids: int) -> NodeRequest:
    """Validates one request of a batch; a failure here never touches the others."""
    body = as_request(item).json_object('{"node_id": 42}')
    if is_v2_body(body):
        node_ids, request_id = parse_v2_node_ids(body, max_ids)
        node_type = v2_parameter(body, "node_type", "node_ids")
        return NodeRequest(tuple(node_ids), False, "v2", request_id, node_type)
    raw_ids = body.get("node_ids")
    if isinstance(raw_ids, list):
        check_count("node_ids", len(raw_ids), max_ids, "max_ids_per_request")
    plain = _plain_request(body)
    if plain is not None:
        return plain
    parsed = validate(_NodeBody, body, NODE_EXAMPLE, allowed=("node_id", "node_ids", "node_type"))
    if parsed.node_id is not None and parsed.node_ids is not None:
        raise BadRequest("send either node_id or node_ids, not both")
    if parsed.node_id is not None:
        return NodeRequest(node_ids=(parsed.node_id,), single=True, node_type=parsed.node_type)
    if parsed.node_ids is None:
        raise BadRequest('missing field: send {"node_id": 42} or {"node_ids": [1, 2]}')
    if not parsed.node_ids:
        raise BadRequest("node_ids is empty; send at least one node ID")
    return NodeRequest(node_ids=tuple(parsed.node_ids), single=False, node_type=parsed.node_type)


def _edge_rows(rows: list[list[Any]], count: int, width: int) -> np.ndarray:
    """``new_node.edge_attr`` as float32 ``[count, width]``: one row per neighbour, each as
    wide as the graph's edge features."""
    if width == 0:
        raise BadRequest("new_node.edge_attr: this graph has no edge features; leave it out")
    if len(rows) != count:
        raise BadRequest(
            f"new_node.edge_attr must hold one row per entry of new_node.neighbors ({count}); "
            f"got {len(rows)}"
        )
    for position, row in enumerate(rows):
        if len(row) != width:
            raise BadRequest(
                f"new_node.edge_attr[{position}] must hold {width} features per edge (the "
                f"graph's edge feature width); got {len(row)}"
            )
    if not rows:
        return np.empty((0, width), dtype=np.float32)
    return float32_features(rows, width, "new_node.edge_attr")


def is_node_extra(body: Any) -> bool:
    """An embedding or cold-start request (not a prediction), by its keys."""
    return isinstance(body, dict) and ("return_embedding" in body or "new_node" in body)


def parse_node_extra(
    item: Any, feature_dim: int, max_ids: int, edge_feature_dim: int = 0
) -> EmbeddingRequest | NewNodeRequest:
    """An embedding request or a cold-start request of a node archive (``edge_feature_dim``:
    the graph's, the width of each ``new_node.edge_attr`` row; default 0, no edge features)."""
    body = as_request(item).json_object(EMBEDDING_EXAMPLE)
    if "new_node" in body:
        new = body.get("new_node")
        for field in ("neighbors", "edge_attr"):
            if isinstance(new, dict) and isinstance(new.get(field), list):
                check_count(f"new_node.{field}", len(new[field]), max_ids, "max_ids_per_request")
        cold = validate(_NewNodeBody, body, NEW_NODE_EXAMPLE)
        neighbors = tuple(dict.fromkeys(cold.new_node.neighbors))
        edge_attr = None
        if cold.new_node.edge_attr is not None:
            if len(neighbors) != len(cold.new_node.neighbors):
                repeated = next(n for n in neighbors if cold.new_node.neighbors.count(n) > 1)
                raise BadRequest(
                    f"new_node.neighbors lists {show(repeated)} more than once; with edge_attr "
                    "list each neighbour once, its row being the features of its edges"
                )
            edge_attr = _edge_rows(cold.new_node.edge_attr, len(neighbors), edge_feature_dim)
        return NewNodeRequest(
            x=float32_features(cold.new_node.x, feature_dim, "new_node.x"),
            neighbors=neighbors,
            direction=cold.new_node.direction,
            return_embedding=cold.return_embedding,
            edge_attr=edge_attr,
        )
    if isinstance(body.get("node_ids"), list):
        check_count("node_ids", len(body["node_ids"]), max_ids, "max_ids_per_request")
    parsed = validate(_EmbeddingBody, body, EMBEDDING_EXAMPLE)
    node_id, node_ids = parsed.node_id, parsed.node_ids
    if node_id is not None and node_ids is None:
        return EmbeddingRequest((node_id,), True, parsed.return_embedding, parsed.node_type)
    if node_id is None and node_ids is not None:
        if not node_ids:
            raise BadRequest("node_ids is empty; send at least one node ID")
        return EmbeddingRequest(tuple(node_ids), False, parsed.return_embedding, parsed.node_type)
    raise BadRequest(f"send exactly one of node_id and node_ids, e.g. {EMBEDDING_EXAMPLE}")
