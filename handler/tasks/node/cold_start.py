"""A cold-start node: the graph with one node added, as a view, and its ego-graph sampled on it.

Call the new node ``v`` (of the type the archive answers for) and a neighbour listed under
relation ``R`` ``u``. ``R`` brings its own edges between them (``v -> u`` when ``v`` is its
source, ``u -> v`` when ``v`` is its destination, both on a relation within one type) and, where
the graph has ``R``'s reverse (``rev_<relation>``, as ``--undirected`` and PyG's
``ToUndirected`` name it, with the same edge features), the reverse of each of those on it, as
the graph would hold them had ``v`` been there at build time. ``direction`` keeps those into
``v`` (``in``), out of it (``out``) or all (``both``). On a graph of one relation within one
type that is: ``in`` adds ``u -> v``, ``out`` ``v -> u``, ``both`` both. Every edge a neighbour
brings carries its ``edge_attr`` row.

:class:`ColdStartView` is the graph version plus ``v`` (the next global index, as an update
adding it would give it) and its edges (edge IDs ``-1 - k``), behind the one ``GraphView``
interface, so features, degrees, node types, relations and edge features of the augmented
graph are read as any graph's. :func:`sample_with_new_node` samples ``v``'s ego-graph on it one
hop at a time with the archive's fanouts: ``v``'s in-neighbours are all its senders, an existing
node that ``v`` sends to gets ``v`` as an extra in-neighbour (its stored ones are sampled as
usual), and ``v`` may reappear at deeper hops. With fanout ``-1`` at every hop the answer equals
the full-graph forward on the augmented graph, degree-normalising models included (their
boundary hop gives the deepest rows their augmented in-degrees).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from graph_assets.errors import SubgraphTooLarge
from graph_assets.graph_view import GraphView, InLists
from graph_assets.schema import GraphSchema
from handler.protocol.body import NodeId, show
from handler.protocol.errors import BadRequest
from handler.sampling.arrays import TorchOps
from handler.sampling.sampler import (
    ALL_NEIGHBOURS,
    NeighbourSampler,
    SampledSubgraph,
    self_loops_in_place,
)
from handler.tasks.node.requests import NewNodeRequest

# Internal indices of IDs of a node type (None: the type the archive answers for); NotFound
# for the missing ones (``EgoGraphs.lookup``).
Lookup = Callable[[Sequence[NodeId], str | None], np.ndarray]


@dataclass(frozen=True, eq=False)
class NewEdges:
    """The new node's edges; edge ``k`` has the ID ``-1 - k``.

    Attributes:
        node: ``[K]`` int64 global index of each edge's other end.
        relation: ``[K]`` int64 its relation.
        inward: ``[K]`` bool: ``node -> new`` (else ``new -> node``).
        rows: each edge's features (the request's row, zeros when it sent none).
    """

    node: np.ndarray
    relation: np.ndarray
    inward: np.ndarray
    rows: tuple[np.ndarray, ...]

    @property
    def senders(self) -> np.ndarray:
        """Sorted unique nodes with an edge into the new node."""
        return np.unique(self.node[self.inward])

    @property
    def receivers(self) -> np.ndarray:
        """Sorted unique nodes with an edge from the new node."""
        return np.unique(self.node[~self.inward])


def reverse_relation(schema: GraphSchema, relation: int) -> int | None:
    """The relation holding ``relation``'s reverse edges: the one named as its reverse (either
    way round) with the same edge features, else ``relation`` itself when it joins one type
    (``--undirected`` keeps such a relation's reverse edges in it), else None."""
    own = schema.relations[relation]
    mirror = own.edge_type.reverse()
    for index, other in enumerate(schema.relations):
        named = other.edge_type == mirror or other.edge_type.reverse() == own.edge_type
        if named and other.edge_feature_names == own.edge_feature_names:
            return index
    return relation if own.edge_type.src == own.edge_type.dst else None


def edges_brought(schema: GraphSchema, relation: int, node_type: str) -> list[tuple[int, bool]]:
    """``(relation, into the new node)`` of each edge a neighbour listed under ``relation``
    brings to a new node of ``node_type`` (module docstring), before ``direction``."""
    edge_type = schema.relations[relation].edge_type
    own = [(relation, True)] if edge_type.dst == node_type else []
    own += [(relation, False)] if edge_type.src == node_type else []
    reverse = reverse_relation(schema, relation)
    if reverse is None or reverse == relation:
        return own
    return own + [(reverse, not inward) for _, inward in own]


def new_edges(request: NewNodeRequest, schema: GraphSchema, lookup: Lookup) -> NewEdges:
    """The request's edges with their other ends looked up (404 for a missing one); 400 when
    a listed relation brings no edge in the request's direction, or two listed relations
    bring the same edge."""
    keep = {"in": (True,), "out": (False,), "both": (True, False)}[request.direction]
    nodes, relations, inward, rows = [], [], [], []
    seen: dict[tuple[int, bool, NodeId], str] = {}
    for name, ids in request.neighbors.items():
        relation = schema.relation_index(name)
        edge_type = schema.relations[relation].edge_type
        brought = [
            (r, i) for r, i in edges_brought(schema, relation, request.node_type) if i in keep
        ]
        if ids and not brought:
            end, works = (
                ("source", "out") if request.node_type == edge_type.src else ("destination", "in")
            )
            raise BadRequest(
                f"new_node.neighbors.{name}: with direction {request.direction!r} it brings no "
                f"edge: the new node is the relation's {end} and the graph holds no reverse of "
                f"it (rev_{edge_type.relation}); send direction {works!r} or 'both'"
            )
        for r, into in brought:
            for node_id in ids:
                first = seen.setdefault((r, into, node_id), name)
                if first != name:
                    raise BadRequest(
                        f"new_node.neighbors lists {show(node_id)} under {first} and under "
                        f"{name}, which bring the same edges (a relation brings its reverse's "
                        "too): list it under one of them"
                    )
        other = edge_type.src if edge_type.dst == request.node_type else edge_type.dst
        found = lookup(list(ids), None if schema.is_homogeneous else other)
        width = schema.relations[relation].edge_feature_dim
        given = request.edge_attr.get(name, np.zeros((len(ids), width), dtype=np.float32))
        for r, into in brought:
            nodes.append(found)
            relations.append(np.full(len(ids), r, dtype=np.int64))
            inward.append(np.full(len(ids), into))
            rows += list(given)
    return NewEdges(
        node=np.concatenate(nodes or [np.empty(0, np.int64)]).astype(np.int64),
        relation=np.concatenate(relations or [np.empty(0, np.int64)]),
        inward=np.concatenate(inward or [np.empty(0, bool)]).astype(bool),
        rows=tuple(rows),
    )


class ColdStartView:
    """``base`` (a graph version) with the new node ``new`` = ``base.num_nodes`` of type
    ``node_type`` (its index), features ``x``, and ``edges``: a ``GraphView`` of the augmented
    graph (module docstring)."""

    def __init__(self, base: GraphView, node_type: int, x: np.ndarray, edges: NewEdges) -> None:
        self.base = base
        self.new = base.num_nodes
        self.node_type = node_type
        self.x = x
        self.edges = edges
        self._receivers = np.sort(edges.node[~edges.inward])
        self._senders = np.sort(edges.node[edges.inward])

    @property
    def num_nodes(self) -> int:
        return self.base.num_nodes + 1

    @property
    def edge_feature_dim(self) -> int:
        return self.base.edge_feature_dim

    def lookup(self, ids: Sequence[int | str], node_type: str | None = None) -> np.ndarray:
        """The base's lookup: the new node has no ID."""
        return self.base.lookup(ids, node_type)

    def types_of(self, nodes: np.ndarray) -> np.ndarray:
        nodes = np.asarray(nodes, dtype=np.int64)
        return self._by_node(nodes, np.full(len(nodes), self.node_type), self.base.types_of)

    def in_lists(self, nodes: np.ndarray) -> InLists:
        """The augmented in-lists: a stored node's stored ones, then its edges from the new
        node; the new node's, its senders (edge IDs ``-1 - k``)."""
        nodes = np.asarray(nodes, dtype=np.int64)
        stored = nodes[nodes != self.new]
        base = self.base.in_lists(stored)
        senders = np.flatnonzero(self.edges.inward)
        receivers = np.flatnonzero(~self.edges.inward)
        parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        place = np.cumsum(nodes != self.new) - 1  # a stored node's list in ``base``
        for position, node in enumerate(nodes.tolist()):
            if node == self.new:
                k = senders
                parts.append((self.edges.node[k], -1 - k, self.edges.relation[k]))
                continue
            at = int(place[position])
            span = slice(int(base.indptr[at]), int(base.indptr[at + 1]))
            k = receivers[self.edges.node[receivers] == node]
            parts.append(
                (
                    np.concatenate([base.indices[span], np.full(len(k), self.new)]),
                    np.concatenate([base.edge_ids[span], -1 - k]),
                    np.concatenate([base.relations[span], self.edges.relation[k]]),
                )
            )
        counts = np.array([len(part[0]) for part in parts], dtype=np.int64)
        empty = np.empty(0, dtype=np.int64)
        return InLists(
            indptr=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
            indices=np.concatenate([p[0] for p in parts] or [empty]).astype(np.int64),
            edge_ids=np.concatenate([p[1] for p in parts] or [empty]).astype(np.int64),
            relations=np.concatenate([p[2] for p in parts] or [empty]).astype(np.int64),
        )

    def edge_relations(self, edge_ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(edge_ids, dtype=np.int64)
        new = ids < 0
        out = np.empty(len(ids), dtype=np.int64)
        out[new] = self.edges.relation[-1 - ids[new]]
        if not new.all():
            out[~new] = self.base.edge_relations(ids[~new])
        return out

    def feature_rows(self, nodes: np.ndarray) -> np.ndarray:
        nodes = np.asarray(nodes, dtype=np.int64)
        if not (nodes == self.new).any():
            return self.base.feature_rows(nodes)
        return self._by_node(nodes, np.tile(self.x, (len(nodes), 1)), self.base.feature_rows)

    def edge_feature_rows(self, edge_ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(edge_ids, dtype=np.int64)
        new = ids < 0
        if not new.any():
            return self.base.edge_feature_rows(ids)
        given = np.stack([self.edges.rows[k] for k in (-1 - ids[new]).tolist()])
        out = np.empty((len(ids), given.shape[1]), dtype=np.float32)
        out[new] = given
        if not new.all():
            out[~new] = self.base.edge_feature_rows(ids[~new])
        return out

    def degree_rows(self, nodes: np.ndarray) -> np.ndarray:
        """In-degrees on the augmented graph: the new node's senders, and a receiver's stored
        in-degree plus its edges from the new node."""
        nodes = np.asarray(nodes, dtype=np.int64)
        senders = np.full(len(nodes), int(self.edges.inward.sum()), dtype=np.int64)
        degree = self._by_node(nodes, senders, self.base.degree_rows)
        received = np.searchsorted(self._receivers, nodes, side="right") - np.searchsorted(
            self._receivers, nodes
        )
        return degree + received

    def out_degree_rows(self, nodes: np.ndarray) -> np.ndarray:
        """Out-degrees on the augmented graph: the new node's receivers, and a sender's
        stored out-degree plus its edges into the new node."""
        nodes = np.asarray(nodes, dtype=np.int64)
        receivers = np.full(len(nodes), len(self._receivers), dtype=np.int64)
        degree = self._by_node(nodes, receivers, self.base.out_degree_rows)
        sent = np.searchsorted(self._senders, nodes, side="right") - np.searchsorted(
            self._senders, nodes
        )
        return degree + sent

    def largest_out_degree(self) -> int:
        """The base's largest, or the new node's or one of its senders' when larger."""
        ends = np.unique(np.append(self._senders, self.new))
        return max(self.base.largest_out_degree(), int(self.out_degree_rows(ends).max()))

    def external_ids(self, nodes: np.ndarray) -> list[int | str]:
        """The base's IDs (the new node has none, and no answer names it)."""
        return self.base.external_ids(nodes)

    def _by_node(
        self, nodes: np.ndarray, new_values: np.ndarray, read: Callable[[np.ndarray], np.ndarray]
    ) -> np.ndarray:
        """``new_values`` on the new node's positions, ``read`` of the base on the others."""
        stored = nodes != self.new
        out = np.array(new_values)
        if stored.any():
            out[stored] = read(nodes[stored])
        return out


def one_hop_samplers(sampler: NeighbourSampler, boundary: bool) -> list[NeighbourSampler]:
    """A single-hop sampler per hop of ``sampler`` with that hop's fanout (each relation's own
    on a graph of several), then, with ``boundary``, one taking every in-edge (the deepest
    hop's degrees)."""
    hops = sampler.num_hops + int(boundary)

    def fanout(fanouts: Sequence[int], hop: int) -> int:
        return fanouts[hop] if hop < sampler.num_hops else ALL_NEIGHBOURS

    samplers = []
    for hop in range(hops):
        relations = sampler.relations
        if relations is not None:
            each = tuple((fanout(f, hop),) for f in relations.fanouts)
            relations = dataclasses.replace(relations, fanouts=each)
        samplers.append(sampler.with_fanouts([fanout(sampler.fanouts, hop)], relations))
    return samplers


def sample_with_new_node(
    samplers: list[NeighbourSampler],
    view: ColdStartView,
    max_nodes: int,
    max_edges: int,
    boundary: bool = False,
) -> SampledSubgraph:
    """The new node's ego-graph on ``view`` (module docstring), its one seed row first. With
    ``boundary`` the last sampler's hop (every in-edge) comes from one zero-feature row per
    source type (``handler.sampling.sampler.boundary_node``), as the node sampler's boundary
    does."""
    device = samplers[0].indptr.device if samplers else torch.device("cpu")
    edges = view.edges
    other = torch.from_numpy(edges.node).to(device)
    inward = torch.from_numpy(edges.inward).to(device)
    levels = [torch.tensor([view.new], device=device)]
    src_parts, dst_parts, edge_parts = [], [], []
    offset, total_nodes, total_edges = 0, 1, 0
    for hop, sampler in enumerate(samplers):
        frontier = levels[-1]
        rows, neighbours, edge_ids = _hop_with_new_node(sampler, frontier, view.new, other, inward)
        next_offset = offset + int(frontier.numel())
        if boundary and hop == len(samplers) - 1:
            types = torch.from_numpy(view.types_of(neighbours.cpu().numpy())).to(device)
            present, inverse = torch.unique(types, return_inverse=True)
            next_level, sources = -1 - present, next_offset + inverse
        else:
            next_level, inverse = torch.unique(neighbours, return_inverse=True)
            sources = next_offset + inverse
        src_parts.append(
            self_loops_in_place(frontier, rows, neighbours, offset, sources, TorchOps(device))
        )
        dst_parts.append(offset + rows)
        edge_parts.append(edge_ids)
        total_nodes += int(next_level.numel())
        total_edges += int(neighbours.numel())
        if total_nodes > max_nodes or total_edges > max_edges:
            raise SubgraphTooLarge(total_nodes, total_edges, max_nodes, max_edges)
        levels.append(next_level)
        offset = next_offset
    if not samplers:  # a model without message passing: the new node alone
        src_parts = dst_parts = edge_parts = [torch.empty(0, dtype=torch.int64, device=device)]
    return SampledSubgraph(
        node=torch.cat(levels),
        edge_index=torch.stack([torch.cat(src_parts), torch.cat(dst_parts)]),
        edge=torch.cat(edge_parts),
        num_seeds=1,
        level_sizes=tuple(int(level.numel()) for level in levels),
        boundary=boundary,
    )


def _hop_with_new_node(
    sampler: NeighbourSampler,
    frontier: torch.Tensor,
    new: int,
    other: torch.Tensor,
    inward: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One hop on the augmented graph: for each in-edge of ``frontier``, its frontier row, its
    source node and its edge ID (``-1 - k`` for the new node's edge ``k``, whose other end is
    ``other[k]``)."""
    device = frontier.device
    is_new = frontier == new
    existing = torch.nonzero(~is_new).flatten()
    empty = torch.empty(0, dtype=torch.int64, device=device)
    rows, neighbours, edge_ids = [empty], [empty], [empty]
    if existing.numel():
        sub = sampler.sample(frontier[existing])
        rows.append(existing[sub.edge_index[1]])
        neighbours.append(sub.node[sub.edge_index[0]])
        edge_ids.append(sub.edge.to(device))
        # The new node's edges into existing frontier nodes: each receiving row gets one per
        # edge, found among those edges sorted by their other end.
        outward = torch.nonzero(~inward).flatten()
        targets, order = torch.sort(other[outward])
        nodes = frontier[existing]
        first = torch.searchsorted(targets, nodes)
        counts = torch.searchsorted(targets, nodes, right=True) - first
        receiving = existing.repeat_interleave(counts)
        starts = (torch.cumsum(counts, 0) - counts).repeat_interleave(counts)
        at = first.repeat_interleave(counts) + torch.arange(receiving.numel(), device=device)
        k = outward[order[at - starts]]
        rows.append(receiving)
        neighbours.append(torch.full_like(receiving, new))
        edge_ids.append(-1 - k)
    senders = torch.nonzero(inward).flatten()
    for row in torch.nonzero(is_new).flatten().tolist():
        rows.append(torch.full_like(senders, row))
        neighbours.append(other[senders])
        edge_ids.append(-1 - senders)
    return torch.cat(rows), torch.cat(neighbours), torch.cat(edge_ids)
