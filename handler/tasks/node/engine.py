"""Node classification, the batch core's main task: requests resolved to internal nodes in one
lookup per batch, one ego-graph for the batch's seeds, one forward pass."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from graph_assets.graph_view import GraphView
from handler.gpu.captured_forward import CapturedForward
from handler.gpu.device_features import TypedDeviceFeatures
from handler.gpu.padding import PaddedSubgraph
from handler.graph.ego import EgoGraphs, OnEgoGraphs, missing_nodes
from handler.graph.graph_source import ServedGraph
from handler.graph.typed_ego import captured_typed_answer, pad_typed, typed_answer
from handler.live.live_graph import LiveGraph
from handler.pipeline.batch import (
    Batch,
    BatchEngine,
    Group,
    Response,
    apply_threads,
    logged_answer,
    parsed_or_error,
    timed,
)
from handler.protocol.class_answer import node_answer
from handler.protocol.error_table import batch_error
from handler.protocol.errors import ApiError, InternalError, NotFound
from handler.protocol.kserve_v2 import v2_response
from handler.sampling.sampler import NeighbourSampler, SampledSubgraph
from handler.settings import ServingSettings
from handler.tasks.node.requests import NodeId, NodeRequest, parse_node_request
from model.precompute import Precomputed
from model.served import answer_rows, serving_needs
from model.served.contract import served

logger = logging.getLogger(__name__)


def _resolved(request: NodeRequest, nodes: np.ndarray) -> ResolvedRequest | NotFound:
    return missing_nodes(request.node_ids, nodes) or ResolvedRequest(request=request, nodes=nodes)


@dataclass(frozen=True)
class ResolvedRequest:
    """A valid request with its IDs mapped to internal node indices (same order)."""

    request: NodeRequest
    nodes: np.ndarray


class NodeClassificationEngine(OnEgoGraphs, BatchEngine[ResolvedRequest]):
    """Answers node classification requests from k-hop ego-graphs of a memory-mapped graph: the
    batch core's node task (one ego-graph for the batch's seeds, one forward pass)."""

    def __init__(
        self,
        ego: EgoGraphs,
        model_version: str,
        model_name: str = "gnn",
    ) -> None:
        self.ego = ego
        self.device = ego.device
        self.model_name = model_name
        self.model_version = model_version
        self.output = serving_needs(ego.model).output
        # A GPU worker's forward, captured per padded bucket (a typed model's per type and
        # relation: handler.graph.typed_ego).
        self.captured: CapturedForward | None = None
        if self.device.type == "cuda" and ego.settings.cuda_graphs:
            self.captured = CapturedForward(ego.model, self.device)
        self._typed_model = served(ego.model).typed
        # Each type has its own IDs: on a graph of several, answers say which (set once).
        typed = not ego.store.schema.is_homogeneous
        self._answer_type = {"node_type": ego.served_node_type} if typed else {}

    @classmethod
    def create(
        cls,
        store: ServedGraph,
        model: torch.nn.Module,
        settings: ServingSettings,
        device: torch.device,
        model_version: str,
        live: LiveGraph | None = None,
        model_name: str = "gnn",
        precomputed: Precomputed | None = None,
    ) -> NodeClassificationEngine:
        """The engine of one worker (the node task starts it so): the worker's threads set,
        the graph and sampler built over the stored graph and its live updates."""
        apply_threads(settings)
        ego = EgoGraphs.create(store, model, settings, device, live, precomputed)
        return cls(ego, model_version, model_name=model_name)

    @property
    def sampler(self) -> NeighbourSampler:
        return self.ego.sampler

    def handle(self, items: Sequence[Any]) -> list[Response]:
        """``prepare``, ``run`` and ``respond`` in one call (tests, benchmarks), on one graph
        version: the live graph is held still from lookup to ``graph_version`` (as
        ``GNNHandler.handle`` does for a TorchServe batch)."""
        if self.live is None:
            return super().handle(items)
        with self.live.reading():
            return super().handle(items)

    def refresh(self) -> None:
        # Updates acknowledged by any worker are visible from here on.
        self.ego.sync()

    def parse(self, item: Any) -> ResolvedRequest:
        """One request alone: parsed, then its IDs looked up (the batch's lookup failed)."""
        request = self._parse_request(item)
        try:
            nodes = self.ego.find(request.node_ids)
        except Exception as error:
            if batch_error(error) is not None:
                raise  # the whole batch's answer (the router's)
            answer = logged_answer(error, "a node lookup")
            if answer is not None:  # its IDs' entries in Redis lost or corrupt
                raise answer from None
            logger.exception("node lookup failed for a request")
            raise InternalError("the node lookup failed; the error is in the server log") from None
        resolved = _resolved(request, nodes)
        if isinstance(resolved, ApiError):
            raise resolved
        return resolved

    def parse_batch(self, items: Sequence[Any]) -> list[ResolvedRequest | ApiError]:
        """Parses each request alone, then looks up the IDs of all valid ones in one call
        (a lookup per request cost a busy worker ~8% of its time)."""
        parsed = [parsed_or_error(self._parse_request, item) for item in items]
        requests = [request for request in parsed if isinstance(request, NodeRequest)]
        try:
            found = self.ego.find([node for r in requests for node in r.node_ids])
        except Exception as error:
            if batch_error(error) is not None:
                raise  # the whole batch's answer (the router's), not one lookup per request
            logger.exception("node lookup failed for the batch; looking up request by request")
            return [self._parse(item) for item in items]
        all_found = found.size == 0 or int(found.min()) >= 0  # then no request needs a 404
        outcomes: list[ResolvedRequest | ApiError] = []
        start = 0
        for request in parsed:
            if not isinstance(request, NodeRequest):
                outcomes.append(request)
                continue
            nodes = found[start : start + len(request.node_ids)]
            start += len(request.node_ids)
            outcomes.append(
                ResolvedRequest(request, nodes) if all_found else _resolved(request, nodes)
            )
        return outcomes

    def make_group(
        self, positions: list[int], outcomes: list[ResolvedRequest | ApiError]
    ) -> tuple[torch.Tensor, SampledSubgraph | PaddedSubgraph | None]:
        """``(seeds, ego-graph)`` of the union of the requests' nodes, padded to a bucket for
        a captured forward; a precomputed archive samples nothing (``None``): its answers are
        stored rows."""
        nodes = np.concatenate([_valid(outcomes[i]).nodes for i in positions])
        if self.ego.precomputed is not None:
            return torch.from_numpy(np.unique(nodes)), None
        if self.captured is not None and not self._typed_model:  # typed: padded in run_group
            return self.ego.sample_padded(nodes)
        return self.ego.sample(nodes)

    def run_group(self, group: Group, batch: Batch[ResolvedRequest]) -> None:
        times = batch.times
        seeds, sub = group.payload
        if sub is None:
            probabilities = self._stored_probabilities(seeds, batch)
        else:
            probabilities = self._sampled_probabilities(sub, batch)
        times.seed_nodes += int(seeds.numel())
        # Seeds are sorted and unique (np.unique), so the requests' rows are one binary search
        # and one numpy copy for the group, then a slice per request.
        requested = [_valid(batch.outcomes[position]).nodes for position in group.positions]
        rows = probabilities.numpy()[np.searchsorted(seeds.numpy(), np.concatenate(requested))]
        start = 0
        for position, nodes in zip(group.positions, requested, strict=True):
            batch.results[position] = rows[start : start + len(nodes)]
            start += len(nodes)

    def _stored_probabilities(
        self, seeds: torch.Tensor, batch: Batch[ResolvedRequest]
    ) -> torch.Tensor:
        """The output layer's stored rows of ``seeds``, as probabilities."""
        precomputed = self.ego.precomputed
        assert precomputed is not None
        stop = timed(batch.times, "gather")
        logits = torch.from_numpy(precomputed.rows(precomputed.num_layers, seeds.numpy()))
        stop()
        stop = timed(batch.times, "forward")
        probabilities = answer_rows(logits, self.output)
        stop()
        return probabilities

    def _sampled_probabilities(
        self, sampled: SampledSubgraph | PaddedSubgraph, batch: Batch[ResolvedRequest]
    ) -> torch.Tensor:
        """One forward pass over the seeds' ego-graph; a padded one is replayed from its
        bucket's CUDA graph."""
        sub = sampled.sub if isinstance(sampled, PaddedSubgraph) else sampled
        times = batch.times
        times.sampled_nodes += sub.num_nodes
        times.sampled_edges += sub.num_edges
        model = served(self.model)
        if model.typed:  # per-type features, per-relation edges
            stop = timed(times, "forward")
            with torch.inference_mode():
                view = self.ego.view()
                features = self.ego.device_features
                typed = features if isinstance(features, TypedDeviceFeatures) else None
                if self.captured is None:
                    rows, _ = typed_answer(self.store, view, model, sub, self.device, False, typed)
                else:
                    rows = self._captured_typed(view, model.target, sub, typed)
                probabilities = answer_rows(rows, self.output).cpu()
            stop()
            return probabilities
        stop = timed(times, "gather")
        with torch.inference_mode():
            x, degree = self.ego.gather(sub.node)
            edge_attr = self.ego.edge_features(sub.edge)
        stop()
        stop = timed(times, "forward")
        with torch.inference_mode():
            if isinstance(sampled, PaddedSubgraph):
                assert self.captured is not None
                rows = self.captured(sampled, x, degree, edge_attr)
            else:
                edges = {} if edge_attr is None else {"edge_attr": edge_attr}
                rows = self.model(
                    x, sub.edge_index, degree=degree, level_sizes=sub.level_sizes, **edges
                )[: sub.num_seeds]
            probabilities = answer_rows(rows, self.output).cpu()
        stop()
        return probabilities

    def _captured_typed(
        self,
        view: GraphView,
        target: str,
        sub: SampledSubgraph,
        features: TypedDeviceFeatures | None,
    ) -> torch.Tensor:
        """A typed model's rows from its captured forward: ``sub`` padded per type and
        relation."""
        assert self.captured is not None
        padded = pad_typed(self.store, view, sub)
        return captured_typed_answer(
            self.store, view, self.captured, target, padded, self.device, features
        )

    def body(self, request: ResolvedRequest, result: Any) -> dict[str, Any]:
        inner = request.request
        if inner.protocol == "v2":
            return v2_response(
                inner.request_id,
                self.model_name,
                self.model_version,
                list(inner.node_ids),
                result.tolist(),
                self._answer_type.get("node_type"),
            )
        predictions = [
            self._prediction(node_id, row)
            for node_id, row in zip(inner.node_ids, result.tolist(), strict=True)
        ]
        if inner.single:
            return predictions[0]
        body: dict[str, Any] = {"predictions": predictions, "model_version": self.model_version}
        if self.live is not None:
            body["graph_version"] = self.live.version
        return body

    def _parse_request(self, item: Any) -> NodeRequest:
        request = parse_node_request(item, self.settings.max_ids_per_request)
        self.ego.check_node_type(request.node_type)
        return request

    def _prediction(self, node_id: NodeId, row: list[float]) -> dict[str, Any]:
        answer: dict[str, Any] = {"node_id": node_id, **self._answer_type}
        answer.update(node_answer(row, self.output, self.store.class_names))
        answer["model_version"] = self.model_version
        if self.live is not None:
            answer["graph_version"] = self.live.version
        return answer


def _valid(outcome: ResolvedRequest | ApiError) -> ResolvedRequest:
    assert isinstance(outcome, ResolvedRequest)
    return outcome
