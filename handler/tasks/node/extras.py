"""Embeddings and cold-start nodes for node classification archives.

``{"node_id": a, "return_embedding": true}`` (or ``node_ids``) is answered like a prediction,
from the same ego-graph (the node engine's sampler), plus the node's embedding
(``model.embedding``). ``{"new_node": {"x": [...], "neighbors": [...]}}`` scores a node that is
not in the graph as the full-graph forward would on a copy of the graph with that node and its
edges added; the stored graph is never changed.

Cold start, exactly: call the new node ``v``. ``direction`` ``in`` adds ``u -> v``, ``out`` adds
``v -> u`` and ``both`` (default) adds both, for every listed neighbour ``u``. The ego-graph is
then sampled on that augmented graph: ``v``'s in-neighbours are its senders (all of them, not
sampled), every existing node ``u`` that receives from ``v`` gets ``v`` as an extra in-neighbour
(its stored in-neighbours are sampled as usual), and ``v`` may reappear at deeper hops. GCN's
normalisation uses the augmented in-degrees: ``deg(v)`` = number of senders, and each receiver's
stored in-degree + 1. With fanout ``-1`` at every hop the answer equals the full-graph forward
on the augmented graph (``tests/unit/handler/test_node_extras.py`` checks it for every
architecture and direction).

Edge features: the request's ``edge_attr`` row ``i`` gives the features of the new node's edges
with ``neighbors[i]`` (both of them with ``both``); every other edge of the ego-graph carries its
stored row, read by the edge ID the sampler reports. A model that reads edge features needs
``edge_attr`` whenever the node has neighbours.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from graph_assets.errors import SubgraphTooLarge
from handler.core.arrays import TorchOps
from handler.core.batch import Batch, BatchEngine, Group, timed
from handler.core.ego import EgoGraphs, plain_module, seed_rows
from handler.core.sampler import (
    ALL_NEIGHBOURS,
    NeighbourSampler,
    SampledSubgraph,
    self_loops_in_place,
)
from handler.core.typed_ego import typed_answer
from handler.protocol.class_answer import node_answer
from handler.protocol.error_table import api_error
from handler.protocol.errors import ApiError, BadRequest
from handler.tasks.node.new_node_rows import NEW_NODE, new_node_ego, new_node_rows
from handler.tasks.node.requests import EmbeddingRequest, NewNodeRequest, parse_node_extra
from model.embedding import forward_with_embedding
from model.served import answer_rows, serving_needs
from model.served_hetero import HeteroNodeModel
from model.user_model import EdgeInput

BOUNDARY = -2  # the zero-feature row a boundary hop's edges come from (``gather`` zeros it)


@dataclass(frozen=True)
class Resolved:
    """A parsed request with its existing node IDs mapped to internal indices."""

    request: EmbeddingRequest | NewNodeRequest
    nodes: np.ndarray


@dataclass(frozen=True)
class ColdStartSubgraph:
    """The ego-graph of a new node on the augmented graph.

    Attributes:
        node: global index of each row, ``NEW_NODE`` for the new node's rows, ``BOUNDARY``
            for a boundary row; row 0 is the new node as the seed.
        edge_index: ``[2, E]`` local rows, message direction.
        senders: existing nodes with an edge to the new node (its in-degree is their number).
        receivers: existing nodes with an edge from the new node (their in-degree grows by 1).
        edge: ``[E]`` the graph's edge ID of each stored edge, ``-1`` for the new node's own.
        new_edge: ``[E]`` for each of the new node's edges, the position of its other end in
            ``senders`` or ``receivers`` (both sorted; when both are given they list the same
            nodes); ``-1`` for a stored edge.
    """

    node: torch.Tensor
    edge_index: torch.Tensor
    senders: torch.Tensor
    receivers: torch.Tensor
    edge: torch.Tensor
    new_edge: torch.Tensor

    @property
    def num_nodes(self) -> int:
        return int(self.node.numel())

    @property
    def num_edges(self) -> int:
        return int(self.edge_index.shape[1])


def one_hop_samplers(ego: EgoGraphs) -> list[NeighbourSampler]:
    """One single-hop sampler per configured fanout, on the node engine's arrays, then one
    taking every in-edge when the model needs the deepest hop's degrees (its boundary)."""
    fanouts = list(ego.settings.fanouts)
    if serving_needs(ego.model).boundary_degrees:
        fanouts.append(ALL_NEIGHBOURS)
    return [ego.sampler.with_fanouts([fanout]) for fanout in fanouts]


def sample_with_new_node(
    samplers: list[NeighbourSampler],
    senders: torch.Tensor,
    receivers: torch.Tensor,
    max_nodes: int,
    max_edges: int,
    boundary: bool = False,
) -> ColdStartSubgraph:
    """Samples the new node's ego-graph (module docstring); ``senders`` send to it,
    ``receivers`` receive from it (global indices, unique, ascending). With ``boundary`` the
    last sampler's hop (every in-edge) comes from one zero-feature row, ``BOUNDARY``, as the
    node sampler's boundary does: the deepest hop's rows get their augmented in-degrees."""
    device = samplers[0].indptr.device
    senders, receivers = senders.to(device), receivers.to(device)
    levels = [torch.tensor([NEW_NODE], device=device)]
    src_parts, dst_parts, edge_parts, new_edge_parts = [], [], [], []
    offset, total_nodes, total_edges = 0, 1, 0
    for hop, sampler in enumerate(samplers):
        frontier = levels[-1]
        hop_rows, hop_neighbours, edges, new_edges = _hop_with_new_node(
            sampler, frontier, senders, receivers
        )
        edge_parts.append(edges)
        new_edge_parts.append(new_edges)
        next_offset = offset + int(frontier.numel())
        if boundary and hop == len(samplers) - 1:
            next_level = torch.tensor([BOUNDARY], device=device)
            sources = torch.full_like(hop_rows, next_offset)
        else:
            next_level, inverse = torch.unique(hop_neighbours, return_inverse=True)
            sources = next_offset + inverse
        src_parts.append(
            self_loops_in_place(
                frontier, hop_rows, hop_neighbours, offset, sources, TorchOps(device)
            )
        )
        dst_parts.append(offset + hop_rows)
        total_nodes += int(next_level.numel())
        total_edges += int(hop_neighbours.numel())
        if total_nodes > max_nodes or total_edges > max_edges:
            raise SubgraphTooLarge(total_nodes, total_edges, max_nodes, max_edges)
        levels.append(next_level)
        offset = next_offset
    return ColdStartSubgraph(
        node=torch.cat(levels),
        edge_index=torch.stack([torch.cat(src_parts), torch.cat(dst_parts)]),
        senders=senders,
        receivers=receivers,
        edge=torch.cat(edge_parts),
        new_edge=torch.cat(new_edge_parts),
    )


def _hop_with_new_node(
    sampler: NeighbourSampler,
    frontier: torch.Tensor,
    senders: torch.Tensor,
    receivers: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One hop on the augmented graph: for each in-edge of ``frontier``, its frontier row, its
    source node, its stored edge ID (``-1`` for the new node's) and its position in ``senders``
    or ``receivers`` (``-1`` for a stored edge)."""
    device = frontier.device
    is_new = frontier == NEW_NODE
    existing = torch.nonzero(~is_new).flatten()
    empty = torch.empty(0, dtype=torch.int64, device=device)
    rows, neighbours, edges, new_edges = [empty], [empty], [empty], [empty]
    if existing.numel():
        sub = sampler.sample(frontier[existing])
        rows.append(existing[sub.edge_index[1]])
        neighbours.append(sub.node[sub.edge_index[0]])
        edges.append(sub.edge.to(device))
        new_edges.append(torch.full_like(rows[-1], -1))
        receiving = existing[torch.isin(frontier[existing], receivers)]
        rows.append(receiving)
        neighbours.append(torch.full_like(receiving, NEW_NODE))
        edges.append(torch.full_like(receiving, -1))
        new_edges.append(torch.searchsorted(receivers, frontier[receiving]))
    for row in torch.nonzero(is_new).flatten().tolist():
        rows.append(torch.full_like(senders, row))
        neighbours.append(senders)
        edges.append(torch.full_like(senders, -1))
        new_edges.append(torch.arange(senders.numel(), device=device))
    return torch.cat(rows), torch.cat(neighbours), torch.cat(edges), torch.cat(new_edges)


@dataclass(frozen=True)
class StoredRows:
    """A group answered from a precomputed archive's rows: the known nodes (sorted, unique),
    or a new node's neighbours."""

    nodes: np.ndarray


class NodeExtrasEngine(BatchEngine[Resolved]):
    """Answers embedding and cold-start requests of a node classification archive."""

    def __init__(self, ego: EgoGraphs, model_version: str) -> None:
        self.ego = ego
        self.device = ego.device
        self.model_version = model_version
        self.samplers = one_hop_samplers(ego)
        self.output = serving_needs(ego.model).output

    def refresh(self) -> None:
        self.ego.sync()

    def parse(self, item: Any) -> Resolved:
        settings, store = self.ego.settings, self.ego.store
        request = parse_node_extra(
            item,
            store.feature_dim,
            settings.max_ids_per_request,
            store.edge_feature_dim if store.schema.is_homogeneous else 0,
        )
        if isinstance(request, EmbeddingRequest):
            self.ego.check_node_type(request.node_type)
            model = plain_module(self.ego.model)
            typed = isinstance(model, HeteroNodeModel)
            if request.return_embedding and typed and not model.has_embedding:
                raise BadRequest(
                    "return_embedding: this archive's model names no embedding; build it "
                    "with --embedding-method SUBMODULE (the submodule whose input is a "
                    "node's embedding)"
                )
            return Resolved(request, self.ego.lookup(list(request.node_ids)))
        if not store.schema.is_homogeneous:
            raise BadRequest(
                "new_node is not available yet on a graph of several node types or relations"
            )
        reads_edges = serving_needs(self.ego.model).edge_input is not EdgeInput.NONE
        if reads_edges and request.neighbors and request.edge_attr is None:
            names = ", ".join(store.edge_feature_names)
            raise BadRequest(
                "this archive's model reads edge features: send new_node.edge_attr, one row of "
                f"{store.edge_feature_dim} numbers ({names}) per entry of new_node.neighbors"
            )
        return Resolved(request, self.ego.lookup(list(request.neighbors)))

    def plan(self, positions: list[int], outcomes: list[Resolved | ApiError]) -> list[list[int]]:
        """Embedding requests share one ego-graph; each new node gets its own."""
        known = [p for p in positions if isinstance(_request(outcomes[p]), EmbeddingRequest)]
        new = [[p] for p in positions if p not in known]
        return ([known] if known else []) + new

    def make_group(self, positions: list[int], outcomes: list[Resolved | ApiError]) -> Any:
        first = outcomes[positions[0]]
        assert isinstance(first, Resolved)
        if isinstance(first.request, EmbeddingRequest):
            nodes = np.concatenate([_resolved(outcomes[p]).nodes for p in positions])
            if self.ego.precomputed is not None:
                return StoredRows(np.unique(nodes))
            return self.ego.sample(nodes)
        request, neighbours = first.request, torch.from_numpy(np.unique(first.nodes))
        if self.ego.precomputed is not None:  # exact for every model (new_node_rows)
            return StoredRows(neighbours.numpy())
        none = neighbours[:0]
        settings = self.ego.settings
        return sample_with_new_node(
            self.samplers,
            senders=neighbours if request.direction in ("in", "both") else none,
            receivers=neighbours if request.direction in ("out", "both") else none,
            max_nodes=settings.max_subgraph_nodes,
            max_edges=settings.max_subgraph_edges,
            boundary=serving_needs(self.ego.model).boundary_degrees,
        )

    def run_group(self, group: Group, batch: Batch[Resolved]) -> None:
        if isinstance(group.payload, StoredRows):
            try:
                self._from_stored_rows(group, batch)
            except SubgraphTooLarge as error:  # a whole in-neighbourhood over the limits: 413
                too_large = api_error(error)
                assert too_large is not None
                raise too_large from None
            return
        times, model = batch.times, plain_module(self.ego.model)
        stop = timed(times, "gather")
        if isinstance(group.payload, ColdStartSubgraph):
            sub = group.payload
            resolved = _resolved(batch.outcomes[group.positions[0]])
            request = resolved.request
            assert isinstance(request, NewNodeRequest)
            existing = sub.node != NEW_NODE
            stored_rows, stored_degree = self.ego.gather(sub.node[existing])
            on_device = existing.to(self.device)
            x = torch.from_numpy(request.x).to(self.device).repeat(sub.num_nodes, 1)
            x[on_device] = stored_rows
            # Augmented in-degrees: the new node's is its number of senders; a receiver's grows
            # by one (GCN's normalisation of its edges changes with it).
            degree = torch.full((sub.num_nodes,), float(sub.senders.numel()), device=self.device)
            grown = torch.isin(sub.node[existing], sub.receivers).to(self.device)
            degree[on_device] = stored_degree.to(degree.dtype) + grown.to(degree.dtype)
            edge_attr = self._cold_start_edge_features(
                sub, _given_edge_rows(request, resolved.nodes)
            )
            edge_index, num_seeds = sub.edge_index, 1
        else:
            seeds, sub = group.payload
            if isinstance(model, HeteroNodeModel):
                stop()
                self._typed_embeddings(model, seeds, sub, group, batch)
                return
            x, degree = self.ego.gather(sub.node)
            edge_attr = self.ego.edge_features(sub.edge)
            edge_index, num_seeds = sub.edge_index, sub.num_seeds
        stop()
        times.sampled_nodes += sub.num_nodes
        times.sampled_edges += sub.num_edges
        times.seed_nodes += num_seeds
        stop = timed(times, "forward")
        with torch.inference_mode():
            logits, embedding = forward_with_embedding(
                model, x, edge_index.to(self.device), degree, edge_attr
            )
            probabilities = answer_rows(logits[:num_seeds], self.output).cpu()
            embedding = embedding[:num_seeds].float().cpu()
        stop()
        for position in group.positions:
            rows = (
                [0]
                if isinstance(group.payload, ColdStartSubgraph)
                else seed_rows(seeds, _resolved(batch.outcomes[position]).nodes)
            )
            batch.results[position] = (probabilities[rows], embedding[rows])

    def _typed_embeddings(
        self,
        model: HeteroNodeModel,
        seeds: torch.Tensor,
        sub: SampledSubgraph,
        group: Group,
        batch: Batch[Resolved],
    ) -> None:
        """Embedding requests on a graph of several node types: the model's typed forward."""
        times = batch.times
        times.sampled_nodes += sub.num_nodes
        times.sampled_edges += sub.num_edges
        times.seed_nodes += sub.num_seeds
        stop = timed(times, "forward")
        with torch.inference_mode():
            view = self.ego.view()
            rows, embedding = typed_answer(
                self.ego.store, view, model, sub, self.device, embedding=True
            )
            assert embedding is not None
            probabilities = answer_rows(rows, self.output).cpu()
            vectors = embedding.float().cpu()
        stop()
        for position in group.positions:
            at = seed_rows(seeds, _resolved(batch.outcomes[position]).nodes)
            batch.results[position] = (probabilities[at], vectors[at])

    def _cold_start_edge_features(
        self, sub: ColdStartSubgraph, given: np.ndarray | None
    ) -> torch.Tensor | None:
        """The ego-graph's edge features when the model reads them, else None: the request's
        rows (``given``, one per sorted neighbour) on the new node's edges, stored rows by
        edge ID on the others."""
        stored = sub.edge >= 0
        rows = self.ego.edge_features(sub.edge[stored])
        if rows is None:
            return None
        edge_attr = torch.zeros(
            (sub.num_edges, rows.shape[1]), dtype=torch.float32, device=self.device
        )
        edge_attr[stored.to(self.device)] = rows
        new = sub.new_edge >= 0
        if given is not None and bool(new.any()):
            picked = torch.from_numpy(given)[sub.new_edge[new].cpu()]
            edge_attr[new.to(self.device)] = picked.to(self.device)
        return edge_attr

    def _from_stored_rows(self, group: Group, batch: Batch[Resolved]) -> None:
        """A precomputed archive: known nodes' output and embedding rows as stored (per-layer
        rows), or from their whole in-neighbourhoods (stored outputs, an embedding method); a
        new node from the stored rows of its upstream cone, or from its whole in-neighbourhood
        (``new_node_rows``)."""
        rows = self.ego.precomputed
        assert rows is not None
        nodes, layers = group.payload.nodes, rows.num_layers
        from_rows = rows.plan.stored_embedding
        most_nodes = self.ego.settings.max_subgraph_nodes
        most_edges = self.ego.settings.max_subgraph_edges
        stop = timed(batch.times, "gather")
        resolved = _resolved(batch.outcomes[group.positions[0]])
        request = resolved.request
        if isinstance(request, NewNodeRequest):
            none = nodes[:0]
            senders = nodes if request.direction in ("in", "both") else none
            receivers = nodes if request.direction in ("out", "both") else none
            given = _given_edge_rows(request, resolved.nodes)
            if from_rows:
                output, embedding = new_node_rows(rows, request.x, senders, receivers, given)
            else:
                output, embedding = new_node_ego(
                    rows, request.x, senders, receivers, given, most_nodes, most_edges
                )
        elif from_rows:
            output, embedding = rows.rows(layers, nodes), rows.rows(layers - 1, nodes)
        else:
            output, computed = rows.ego_forward(
                nodes, with_embedding=True, max_nodes=most_nodes, max_edges=most_edges
            )
            assert computed is not None
            embedding = computed
        stop()
        probabilities = answer_rows(torch.from_numpy(output), self.output)
        vectors = torch.from_numpy(np.ascontiguousarray(embedding))
        for position in group.positions:
            if isinstance(request, NewNodeRequest):
                at: list[int] = [0]
            else:
                at = np.searchsorted(nodes, _resolved(batch.outcomes[position]).nodes).tolist()
            batch.results[position] = (probabilities[at], vectors[at])

    def body(self, request: Resolved, result: Any) -> dict[str, Any]:
        probabilities, embedding = result
        inner = request.request
        with_embedding = inner.return_embedding
        if isinstance(inner, NewNodeRequest):
            answer = self._prediction(probabilities[0].tolist(), embedding[0], with_embedding)
            return {"new_node": {"neighbors": len(inner.neighbors)}, **answer}
        predictions = [
            {"node_id": node_id, **self._prediction(row.tolist(), vector, with_embedding)}
            for node_id, row, vector in zip(inner.node_ids, probabilities, embedding, strict=True)
        ]
        if inner.single:
            return predictions[0]
        body: dict[str, Any] = {"predictions": predictions, "model_version": self.model_version}
        if self.ego.live is not None:
            body["graph_version"] = self.ego.live.version
        return body

    def _prediction(
        self, probabilities: list[float], embedding: torch.Tensor, with_embedding: bool
    ) -> dict[str, Any]:
        answer = node_answer(probabilities, self.output, self.ego.store.class_names)
        if not self.ego.store.schema.is_homogeneous:
            answer = {"node_type": self.ego.served_node_type, **answer}
        if with_embedding:
            answer["embedding"] = embedding.tolist()
        answer["model_version"] = self.model_version
        if self.ego.live is not None:  # every prediction of a live graph says which version
            answer["graph_version"] = self.ego.live.version
        return answer


def _given_edge_rows(request: NewNodeRequest, nodes: np.ndarray) -> np.ndarray | None:
    """The request's ``edge_attr`` rows in the order of its sorted unique neighbours (the
    ``senders``/``receivers`` order), or None when it sent none."""
    if request.edge_attr is None:
        return None
    _, first = np.unique(nodes, return_index=True)
    return request.edge_attr[first]


def _resolved(outcome: Resolved | ApiError) -> Resolved:
    assert isinstance(outcome, Resolved)
    return outcome


def _request(outcome: Resolved | ApiError) -> EmbeddingRequest | NewNodeRequest:
    return _resolved(outcome).request
