"""Node archive requests: predictions (JSON or KServe v2), embeddings and cold-start nodes, each
validated into a frozen dataclass or refused with an ApiError before anything else runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import Field, StrictBool

from graph_assets.schema import GraphSchema
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
TYPED_NEW_NODE_EXAMPLE = '{"user__pays__merchant": [1001, 1002]}'
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
    """``{"new_node": {"x": [...], "neighbors": ..., "direction": "both"}}``: a node that is
    not in the graph, scored as if it were added with these edges (the graph is unchanged).

    Attributes:
        node_type: the new node's type: the type the archive answers for.
        x: ``[F]`` float32 features, finite, as wide as ``node_type``'s.
        neighbors: by relation (``src__relation__dst``, one end being ``node_type``), the
            existing nodes of the other end it links to, deduplicated in first-seen order. The
            list form of a graph of one relation is that relation's entry.
        direction: which of the edges each listed neighbour brings are added: ``in`` those
            into the new node, ``out`` those out of it, ``both`` (default) all of them
            (``handler.tasks.node.cold_start`` says which edges a relation brings).
        return_embedding: also return the node's embedding.
        edge_attr: by relation, ``[len(neighbors[relation]), D]`` float32 features of the
            edges each neighbour brings (row ``i``: ``neighbors[relation][i]``'s, in either
            direction); relations the request sent none for are absent.
    """

    node_type: str
    x: np.ndarray
    neighbors: dict[str, tuple[NodeId, ...]]
    direction: Direction
    return_embedding: bool
    edge_attr: dict[str, np.ndarray]

    @property
    def num_neighbors(self) -> int:
        """Distinct neighbours over every relation."""
        return sum(len(ids) for ids in self.neighbors.values())


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
    node_type: str | None = None
    x: list[Number]
    neighbors: list[IdField] | dict[str, list[IdField]] = Field(default_factory=list)
    direction: Direction = "both"
    edge_attr: list[list[Number]] | dict[str, list[list[Number]]] | None = None


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


def is_node_extra(body: Any) -> bool:
    """An embedding or cold-start request (not a prediction), by its keys."""
    return isinstance(body, dict) and ("return_embedding" in body or "new_node" in body)


def parse_node_extra(
    item: Any, schema: GraphSchema, max_ids: int
) -> EmbeddingRequest | NewNodeRequest:
    """An embedding request or a cold-start request of a node archive of a graph of
    ``schema`` (a new node's feature width, relations and edge feature widths are its)."""
    body = as_request(item).json_object(EMBEDDING_EXAMPLE)
    if "new_node" in body:
        return _new_node(body, schema, max_ids)
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


def _new_node(body: dict[str, Any], schema: GraphSchema, max_ids: int) -> NewNodeRequest:
    """``body``'s ``new_node`` checked against the graph (:class:`NewNodeRequest`)."""
    new = body.get("new_node")
    for field in ("neighbors", "edge_attr"):
        value = new.get(field) if isinstance(new, dict) else None
        lists = value.values() if isinstance(value, dict) else [value]
        count = sum(len(entry) for entry in lists if isinstance(entry, list))
        check_count(f"new_node.{field}", count, max_ids, "max_ids_per_request")
    cold = validate(_NewNodeBody, body, NEW_NODE_EXAMPLE)
    spec = cold.new_node
    node_type = _new_node_type(spec.node_type, schema)
    only = schema.relations[0].name
    if isinstance(spec.neighbors, dict):
        listed = spec.neighbors
    elif len(schema.relations) == 1 or not spec.neighbors:
        listed = {only: spec.neighbors} if len(schema.relations) == 1 else {}
    else:
        raise BadRequest(
            "new_node.neighbors: this graph has several relations; send an object of ID lists "
            f"by relation, e.g. {TYPED_NEW_NODE_EXAMPLE} ({_relations_of(schema, node_type)})"
        )
    for name in listed:
        _check_relation(name, schema, node_type)
    neighbors = {name: tuple(dict.fromkeys(ids)) for name, ids in listed.items()}
    edge_attr: dict[str, np.ndarray] = {}
    if spec.edge_attr is not None:
        if isinstance(spec.edge_attr, dict) != isinstance(spec.neighbors, dict):
            raise BadRequest(
                "new_node.edge_attr takes the form of new_node.neighbors: a list of rows for "
                "a list of neighbours, an object of row lists by relation for an object"
            )
        given = spec.edge_attr if isinstance(spec.edge_attr, dict) else {only: spec.edge_attr}
        for name, rows in given.items():
            edge_attr[name] = _edge_rows(name, rows, listed, neighbors, schema)
    return NewNodeRequest(
        node_type=node_type,
        x=float32_features(spec.x, schema.node_type(node_type).feature_dim, "new_node.x"),
        neighbors=neighbors,
        direction=spec.direction,
        return_embedding=cold.return_embedding,
        edge_attr=edge_attr,
    )


def _new_node_type(node_type: str | None, schema: GraphSchema) -> str:
    """The new node's type: the target type, which the archive answers for, and which has
    features to tell a new node apart by."""
    target = schema.target_type
    if node_type is not None and node_type != target.name:
        raise BadRequest(
            f"new_node.node_type {show(node_type)}: this archive answers for {target.name!r} "
            f"nodes, so a new node is one of them (the graph's node types are "
            f"{', '.join(schema.node_type_names)}); send {target.name!r} or leave it out"
        )
    if target.feature_dim == 0:
        raise BadRequest(
            f"new_node: {target.name} nodes have no features, so a model tells them apart by "
            "their stored index (an embedding per node): a new one cannot be scored"
        )
    return target.name


def _relations_of(schema: GraphSchema, node_type: str) -> str:
    names = [r.name for r in schema.relations if node_type in (r.edge_type.src, r.edge_type.dst)]
    return f"the relations of {node_type} nodes: {', '.join(names) or 'none'}"


def _check_relation(name: str, schema: GraphSchema, node_type: str) -> None:
    """BadRequest unless ``name`` is a relation with ``node_type`` at one end at least."""
    if name not in schema.edge_type_names:
        problem = "is not a relation of this graph"
    else:
        edge_type = schema.relations[schema.relation_index(name)].edge_type
        if node_type in (edge_type.src, edge_type.dst):
            return
        problem = f"has no {node_type} nodes at either end"
    raise BadRequest(
        f"new_node.neighbors: {show(name)} {problem}; {_relations_of(schema, node_type)}"
    )


def _edge_rows(
    name: str,
    rows: list[list[Any]],
    listed: dict[str, list[NodeId]],
    neighbors: dict[str, tuple[NodeId, ...]],
    schema: GraphSchema,
) -> np.ndarray:
    """``new_node.edge_attr``'s rows of relation ``name`` as float32 ``[neighbours, D]``: one
    row per neighbour listed once, each as wide as the relation's edge features."""
    one = len(schema.relations) == 1
    where = "new_node.edge_attr" if one else f"new_node.edge_attr.{name}"
    of = "new_node.neighbors" if one else f"new_node.neighbors.{name}"
    if name not in neighbors:
        raise BadRequest(f"{where}: {of} is not sent; send the rows of the neighbours it lists")
    width = schema.relations[schema.relation_index(name)].edge_feature_dim
    if width == 0:
        owner = "this graph has" if one else f"{name} has"
        raise BadRequest(f"{where}: {owner} no edge features; leave it out")
    count = len(neighbors[name])
    if count != len(listed[name]):
        repeated = next(n for n in neighbors[name] if listed[name].count(n) > 1)
        raise BadRequest(
            f"{of} lists {show(repeated)} more than once; with edge_attr list each neighbour "
            "once, its row being the features of its edges"
        )
    if len(rows) != count:
        raise BadRequest(f"{where} must hold one row per entry of {of} ({count}); got {len(rows)}")
    for position, row in enumerate(rows):
        if len(row) != width:
            raise BadRequest(
                f"{where}[{position}] must hold {width} features per edge (the "
                f"{'graph' if one else 'relation'}'s edge feature width); got {len(row)}"
            )
    if not rows:
        return np.empty((0, width), dtype=np.float32)
    return float32_features(rows, width, where)
