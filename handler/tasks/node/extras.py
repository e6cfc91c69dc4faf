"""Embeddings and cold-start nodes for node classification archives.

``{"node_id": a, "return_embedding": true}`` (or ``node_ids``) is answered like a prediction,
from the same ego-graph (the node engine's sampler), plus the node's embedding
(``model.embedding``). ``{"new_node": {"x": [...], "neighbors": ...}}`` scores a node that is
not in the graph as the full-graph forward would on a copy of the graph with that node and its
edges added; the stored graph is never changed. Which edges a neighbour brings, and how the
new node's ego-graph is sampled on the augmented graph (exact with fanout ``-1`` at every hop,
GCN's degree changes included), is ``handler.tasks.node.cold_start``'s; the answer is then the
model's forward on that ego-graph read through the augmented graph's view, the one path of a
graph of one type and of several (``tests/unit/handler/test_node_extras.py`` and
``test_typed_cold_start.py`` check it for every architecture, recipe and direction).

Edge features: the request's ``edge_attr`` rows give the features of the new node's edges (each
edge a neighbour brings carries its row); every other edge of the ego-graph carries its stored
row, read by the edge ID the sampler reports. A model that reads edge features needs
``edge_attr`` for each relation with edge features that lists neighbours.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from graph_assets.errors import SubgraphTooLarge
from graph_assets.graph_view import GraphView
from graph_assets.remote import RemoteCounters
from handler.graph.ego import EgoGraphs, on_device, seed_rows
from handler.graph.typed_ego import typed_answer
from handler.pipeline.batch import Batch, BatchEngine, Group, StageTimes, timed
from handler.protocol.class_answer import node_answer
from handler.protocol.error_table import api_error
from handler.protocol.errors import ApiError, BadRequest
from handler.sampling.sampler import ALL_NEIGHBOURS, NeighbourSampler, SampledSubgraph
from handler.tasks.node.cold_start import (
    ColdStartView,
    NewEdges,
    new_edges,
    one_hop_samplers,
    sample_with_new_node,
)
from handler.tasks.node.new_node_rows import new_node_ego, new_node_rows
from handler.tasks.node.requests import EmbeddingRequest, NewNodeRequest, parse_node_extra
from model.served import answer_rows, serving_needs
from model.served.contract import served
from model.user_model import EdgeInput


@dataclass(frozen=True)
class Resolved:
    """A parsed request with its existing node IDs mapped to internal indices: the requested
    nodes, or a new node's edges."""

    request: EmbeddingRequest | NewNodeRequest
    nodes: np.ndarray
    edges: NewEdges | None = None


@dataclass(frozen=True)
class ColdStart:
    """A new node's ego-graph and the augmented graph it was sampled on."""

    view: ColdStartView
    sub: SampledSubgraph


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
        self.samplers = one_hop_samplers(
            cold_start_sampler(ego), serving_needs(ego.model).boundary_degrees
        )
        self.output = serving_needs(ego.model).output

    def refresh(self) -> None:
        self.ego.sync()

    def read_counters(self) -> RemoteCounters | None:
        return self.ego.read_counters()

    def parse(self, item: Any) -> Resolved:
        settings, schema = self.ego.settings, self.ego.store.schema
        request = parse_node_extra(item, schema, settings.max_ids_per_request)
        if request.return_embedding and not served(self.ego.model).has_embedding:
            raise BadRequest(
                "return_embedding: this archive's model names no embedding; build it "
                "with --embedding-method SUBMODULE (the submodule whose input is a "
                "node's embedding)"
            )
        if isinstance(request, EmbeddingRequest):
            self.ego.check_node_type(request.node_type)
            return Resolved(request, self.ego.lookup(list(request.node_ids)))
        if serving_needs(self.ego.model).edge_input is not EdgeInput.NONE:
            for name, ids in request.neighbors.items():
                relation = schema.relations[schema.relation_index(name)]
                if ids and relation.edge_feature_dim and name not in request.edge_attr:
                    where = "" if len(schema.relations) == 1 else f".{name}"
                    raise BadRequest(
                        f"this archive's model reads edge features: send new_node.edge_attr"
                        f"{where}, one row of {relation.edge_feature_dim} numbers "
                        f"({', '.join(relation.edge_feature_names)}) per entry of "
                        f"new_node.neighbors{where}"
                    )
        edges = new_edges(request, schema, self.ego.lookup)
        return Resolved(request, edges.node, edges)

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
        if self.ego.precomputed is not None and self.ego.store.schema.is_homogeneous:
            return StoredRows(np.unique(first.nodes))  # exact for every model (new_node_rows)
        request, edges = first.request, first.edges
        assert isinstance(request, NewNodeRequest) and edges is not None
        node_type = self.ego.store.schema.type_index(request.node_type)
        view = ColdStartView(self.ego.view(), node_type, request.x, edges)
        settings = self.ego.settings
        sub = sample_with_new_node(
            self.samplers,
            view,
            max_nodes=settings.max_subgraph_nodes,
            max_edges=settings.max_subgraph_edges,
            boundary=serving_needs(self.ego.model).boundary_degrees,
        )
        return ColdStart(view, on_device(sub, self.ego.device))

    def run_group(self, group: Group, batch: Batch[Resolved]) -> None:
        if isinstance(group.payload, StoredRows):
            try:
                self._from_stored_rows(group, batch)
            except SubgraphTooLarge as error:  # a whole in-neighbourhood over the limits: 413
                too_large = api_error(error)
                assert too_large is not None
                raise too_large from None
            return
        seeds: torch.Tensor | None = None
        if isinstance(group.payload, ColdStart):
            view: GraphView = group.payload.view
            sub = group.payload.sub
        else:
            (seeds, sub), view = group.payload, self.ego.view()
        times = batch.times
        times.sampled_nodes += sub.num_nodes
        times.sampled_edges += sub.num_edges
        times.seed_nodes += sub.num_seeds
        probabilities, embedding = self._answer(sub, view, times)
        for position in group.positions:
            rows = (
                [0]
                if seeds is None
                else seed_rows(seeds, _resolved(batch.outcomes[position]).nodes)
            )
            batch.results[position] = (probabilities[rows], embedding[rows])

    def _answer(
        self, sub: SampledSubgraph, view: GraphView, times: StageTimes
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The seeds' answer rows and embeddings: the model's forward on ``sub``, its nodes
        and edges read through ``view`` (split by type for a typed model)."""
        model = served(self.ego.model)
        if model.typed:
            stop = timed(times, "forward")
            with torch.inference_mode():
                # Scoring needs the forward alone; a model without an embedding answers none.
                rows, vectors = typed_answer(
                    self.ego.store, view, model, sub, self.device, embedding=model.has_embedding
                )
                probabilities = answer_rows(rows, self.output).cpu()
                embedding = (
                    vectors.float().cpu() if vectors is not None else torch.empty(len(rows), 0)
                )
            stop()
            return probabilities, embedding
        stop = timed(times, "gather")
        x, degree = self.ego.gather(sub.node, view)
        edge_attr = self.ego.edge_features(sub.edge, view)
        stop()
        stop = timed(times, "forward")
        edge_index = sub.edge_index.to(self.device)
        with torch.inference_mode():
            hidden = None
            if model.has_embedding:
                logits, hidden = model.forward_with_embedding(x, edge_index, degree, edge_attr)
            if hidden is None:  # scoring (a cold-start node) needs the forward alone
                logits = model(x, edge_index, degree=degree, edge_attr=edge_attr)
                hidden = torch.empty(logits.size(0), 0)
            probabilities = answer_rows(logits[: sub.num_seeds], self.output).cpu()
            embedding = hidden[: sub.num_seeds].float().cpu()
        stop()
        return probabilities, embedding

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
        request, edges = resolved.request, resolved.edges
        if isinstance(request, NewNodeRequest):
            assert edges is not None
            senders, receivers = edges.senders, edges.receivers
            given = _given_edge_rows(request, edges)
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
            return {"new_node": {"neighbors": inner.num_neighbors}, **answer}
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


def _given_edge_rows(request: NewNodeRequest, edges: NewEdges) -> np.ndarray | None:
    """A graph of one relation's new edges' rows, one per sorted unique neighbour (the order
    ``new_node_rows`` numbers them in: a neighbour's edges carry one row), or None when the
    request sent none."""
    if not request.edge_attr:
        return None
    _, first = np.unique(edges.node, return_index=True)
    return np.stack([edges.rows[i] for i in first.tolist()]) if len(first) else None


def _resolved(outcome: Resolved | ApiError) -> Resolved:
    assert isinstance(outcome, Resolved)
    return outcome


def _request(outcome: Resolved | ApiError) -> EmbeddingRequest | NewNodeRequest:
    return _resolved(outcome).request


def cold_start_sampler(ego: EgoGraphs) -> NeighbourSampler:
    """The sampler a new node's ego-graph is drawn with: the archive's, or on a precomputed
    archive of a graph of several node types, one taking every in-edge of every relation at
    every hop. Its stored rows are outputs (``model.precompute``), so the new node's answer is
    the model's forward on its whole in-neighbourhood in the augmented graph: exact, as the
    rows an update reaches are recomputed."""
    sampler = ego.sampler
    if ego.precomputed is None or sampler.relations is None:
        return sampler
    hops = [ALL_NEIGHBOURS] * sampler.num_hops
    every = tuple(tuple(hops) for _ in sampler.relations.fanouts)
    return sampler.with_fanouts(hops, dataclasses.replace(sampler.relations, fanouts=every))
