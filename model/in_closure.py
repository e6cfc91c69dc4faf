"""A node's whole k-hop in-neighbourhood as a plain graph, and any local model's exact rows on it.

For a model whose answer for a node depends on its ``k``-hop in-neighbourhood alone (the models
the build verifies), the rows of some seed nodes equal the whole graph's forward when the model
runs on the subgraph that holds every in-edge of every node within ``k - 1`` hops of them: each
message a seed's answer reads is there, with its features. A model that normalises a message by
its source's degree (GCNConv, SGConv, APPNP, ...) also reads the degrees of the nodes ``k`` hops
up; holding their in-edges too (``edge_hops = k + 1``) makes those the graph's, and no answer a
seed reads depends on the sources those edges bring. Each node is one row (no copies per hop),
so the model's own forward runs on it as on the whole graph.

Precomputed archives of a model that is not a stack of by-rows layers store every node's output
computed this way (model.precompute), and recompute the outputs an update reaches the same way
(handler.graph.precomputed): one rule for both. The graph is read through an
:data:`InEdgeReader`, so the stored graph, the live one and a graph with a cold-start node
added are read alike. On a graph of several node types the in-edges are those of every
relation, and :func:`typed_closure_forward` runs the heterogeneous model on the closure split
by type (``model.typed_rows``, the rule a typed ego-graph is answered with).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from graph_assets.errors import SubgraphTooLarge
from graph_assets.graph_view import GraphView
from graph_assets.schema import GraphSchema
from graph_assets.stored.store import GraphStore
from model.embedding import forward_with_embedding
from model.served import serving_needs, tell_largest_degree
from model.served.contract import ServedModel
from model.typed_rows import typed_rows
from model.user_model import EdgeInput

UNLIMITED = 1 << 62
_MOST_SEEDS = 1 << 18  # seeds per part of closure_chunks


@dataclass(frozen=True)
class InEdgeLists:
    """Every in-edge of some nodes: edge ``k`` is ``src[k] -> dst[k]`` (global indices) with
    the graph's edge ID ``edge_ids[k]`` (its features are read by it)."""

    src: np.ndarray
    dst: np.ndarray
    edge_ids: np.ndarray


# The in-edges of the given (unique) nodes on one graph version.
InEdgeReader = Callable[[np.ndarray], InEdgeLists]


def store_in_edges(store: GraphStore) -> InEdgeReader:
    """The stored graph's in-edges, read from its CSC arrays (an edge's ID is its position)."""
    indptr, indices = np.asarray(store.indptr), np.asarray(store.indices)

    def read(nodes: np.ndarray) -> InEdgeLists:
        starts = indptr[nodes].astype(np.int64)
        counts = indptr[nodes + 1].astype(np.int64) - starts
        ends = np.cumsum(counts)
        total = int(ends[-1]) if len(ends) else 0
        positions = np.repeat(starts - (ends - counts), counts) + np.arange(total)
        return InEdgeLists(
            src=indices[positions].astype(np.int64),
            dst=np.repeat(nodes.astype(np.int64), counts),
            edge_ids=positions,
        )

    return read


@dataclass(frozen=True)
class Closure:
    """The in-neighbourhood of some seeds as one graph.

    Attributes:
        nodes: global index of each row; rows ``0..seeds-1`` are the seeds, in the order given.
        edge_index: ``[2, E]`` local rows, message direction.
        edge_ids: ``[E]`` each edge's ID (for its features).
        seeds: how many leading rows are seeds.
    """

    nodes: np.ndarray
    edge_index: Tensor
    edge_ids: np.ndarray
    seeds: int

    @property
    def num_edges(self) -> int:
        return int(self.edge_index.shape[1])


def edge_hops(model: torch.nn.Module, hops: int) -> int:
    """Levels of in-edges a ``hops``-hop model's exact rows need: one more for a model that
    reads its sources' degrees (module docstring)."""
    return hops + 1 if serving_needs(model).boundary_degrees else hops


def in_closure(
    read: InEdgeReader,
    seeds: np.ndarray,
    edge_hops: int,
    max_nodes: int = UNLIMITED,
    max_edges: int = UNLIMITED,
) -> Closure:
    """Every in-edge of every node within ``edge_hops - 1`` hops of ``seeds`` (unique), and the
    nodes they come from; :class:`SubgraphTooLarge` as soon as it would exceed a limit."""
    seeds = np.asarray(seeds, dtype=np.int64)
    levels, parts = [seeds], []
    reached = np.sort(seeds)
    frontier = reached
    nodes, edges = len(seeds), 0
    for _ in range(edge_hops):
        if frontier.size == 0:
            break
        found = read(frontier)
        parts.append(found)
        edges += len(found.src)
        frontier = np.setdiff1d(np.unique(found.src), reached, assume_unique=True)
        nodes += len(frontier)
        if nodes > max_nodes or edges > max_edges:
            raise SubgraphTooLarge(nodes, edges, max_nodes, max_edges)
        reached = np.union1d(reached, frontier)
        levels.append(frontier)
    order = np.concatenate(levels)
    by_node = np.argsort(order, kind="stable")
    ordered = order[by_node]

    def local(global_nodes: np.ndarray) -> np.ndarray:
        return by_node[np.searchsorted(ordered, global_nodes)]

    empty = np.empty(0, dtype=np.int64)
    src = np.concatenate([p.src for p in parts]) if parts else empty
    dst = np.concatenate([p.dst for p in parts]) if parts else empty
    ids = np.concatenate([p.edge_ids for p in parts]) if parts else empty
    edge_index = torch.from_numpy(np.stack((local(src), local(dst))).astype(np.int64))
    return Closure(nodes=order, edge_index=edge_index, edge_ids=ids, seeds=len(seeds))


def closure_chunks(
    read: InEdgeReader, nodes: np.ndarray, edge_hops: int, max_edges: int
) -> Iterator[Closure]:
    """``nodes`` (unique) in consecutive parts, each with its :func:`in_closure`, of at most
    ``max_edges`` edges unless one node's alone is larger: a part over the budget is halved
    and tried again, one under a quarter of it doubles the next (memory stays bounded by the
    budget, not by the graph)."""
    start, size = 0, 256
    while start < len(nodes):
        part = nodes[start : start + size]
        try:
            closure = in_closure(
                read, part, edge_hops, max_edges=max_edges if len(part) > 1 else UNLIMITED
            )
        except SubgraphTooLarge:
            size = max(1, len(part) // 2)
            continue
        yield closure
        start += len(part)
        if closure.num_edges < max_edges // 4:
            size = min(2 * size, _MOST_SEEDS)


@dataclass(frozen=True)
class OutDegrees:
    """The full-graph out-degrees a closure's forward reads where the model's ChebConv does
    (``model.chebconv``; a closure holds in-edges, not every out-edge): ``rows`` of the
    closure's nodes and the graph's ``largest``."""

    rows: Callable[[np.ndarray], np.ndarray]
    largest: Callable[[], int]

    @classmethod
    def of(cls, view: GraphView) -> OutDegrees:
        """A graph version's own."""
        return cls(view.out_degree_rows, view.largest_out_degree)


def closure_forward(
    model: torch.nn.Module,
    closure: Closure,
    x: np.ndarray,
    edge_attr: np.ndarray | None,
    with_embedding: bool = False,
    degrees: OutDegrees | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """``(rows, embeddings or None)`` of the seeds: the model's own forward on ``closure``,
    ``x`` the rows' features and ``edge_attr`` the edges' (None for a model that reads none);
    ``degrees``: the graph's, for a model that reads its out-degrees (:class:`OutDegrees`)."""
    device = next(model.parameters()).device
    features = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(device)
    edge_index = closure.edge_index.to(device)
    needs = serving_needs(model)
    attr = None
    if edge_attr is not None and needs.edge_input is not EdgeInput.NONE:
        attr = torch.from_numpy(np.ascontiguousarray(edge_attr, dtype=np.float32)).to(device)
    degree = None
    if needs.out_degrees:
        if degrees is None:
            raise ValueError(f"{type(model).__name__} reads the graph's out-degrees: pass them")
        degree = torch.from_numpy(degrees.rows(closure.nodes)).to(device)
        tell_largest_degree(model, degrees.largest)
    with torch.inference_mode():
        if with_embedding:
            out, embedding = forward_with_embedding(model, features, edge_index, degree, attr)
            vectors = embedding[: closure.seeds].float().cpu().numpy()
        else:
            out, vectors = model(features, edge_index, degree=degree, edge_attr=attr), None
        return out[: closure.seeds].float().cpu().numpy(), vectors


def typed_closure_forward(
    model: ServedModel,
    closure: Closure,
    schema: GraphSchema,
    view: GraphView,
    with_embedding: bool = False,
) -> tuple[np.ndarray, np.ndarray | None]:
    """``(rows, embeddings or None)`` of the seeds (nodes of the model's target type): the
    heterogeneous model's own forward on ``closure``, each type's features and each
    relation's edge features read through ``view`` (the graph version the closure was read
    from)."""
    device = next(model.parameters()).device
    with torch.inference_mode():
        out, embedding = typed_rows(
            schema,
            view,
            model,
            closure.nodes,
            closure.edge_index,
            closure.edge_ids,
            closure.seeds,
            device,
            with_embedding,
        )
        vectors = None if embedding is None else embedding.float().cpu().numpy()
        return out.float().cpu().numpy(), vectors
