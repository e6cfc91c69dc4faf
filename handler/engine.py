"""Node classification, the batch core's main task: requests resolved to internal nodes in one
lookup per batch, one ego-graph for the batch's seeds, one forward pass; plus the node lookup and
feature gathering that the other node-level tasks share (handler.ego)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from graph_assets import GraphStore
from graph_assets.overlay import GraphOverlay
from handler.array_ops import readonly_tensor
from handler.batch_core import Batch, BatchEngine, Group, Response, parsed_or_error, timed
from handler.class_answer import class_answer
from handler.errors import ApiError, InternalError, NodeNotFound
from handler.kserve_v2 import v2_response
from handler.live_graph import LiveGraph
from handler.node_requests import NodeId, NodeRequest, parse_node_request, show
from handler.sampler import SampledSubgraph, sampler_for
from handler.settings import ServingSettings

logger = logging.getLogger(__name__)

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_MAX_LISTED_MISSING = 20


def gather_rows(
    overlay: GraphOverlay | None,
    features: torch.Tensor,
    in_degree: torch.Tensor,
    nodes: torch.Tensor,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Feature rows and in-degrees of global ``nodes`` on ``device``: from the live overlay once
    updates exist, else straight from the memory-mapped base arrays."""
    if overlay is not None:
        rows_np = nodes.cpu().numpy()
        x = torch.from_numpy(overlay.feature_rows(rows_np))
        degree = torch.from_numpy(overlay.in_degree(rows_np))
    else:
        rows = nodes.to(features.device)
        # index_select, not features[rows]: advanced indexing is ~4x slower on a memory map.
        x = torch.index_select(features, 0, rows)
        degree = torch.index_select(in_degree, 0, rows)
    return x.to(device, non_blocking=True), degree.to(device, non_blocking=True)


def find_nodes(graph: GraphStore | GraphOverlay, node_ids: Sequence[NodeId]) -> np.ndarray:
    """Internal indices of ``node_ids``, -1 for an ID the graph lacks (an int outside int64
    cannot be an ID, so it is reported missing rather than overflowing)."""
    in_range = [not isinstance(node, int) or _INT64_MIN <= node <= _INT64_MAX for node in node_ids]
    nodes = np.full(len(node_ids), -1, dtype=np.int64)
    if all(in_range):
        nodes[:] = graph.lookup(node_ids)
    elif any(in_range):
        nodes[np.array(in_range)] = graph.lookup(
            [node for node, ok in zip(node_ids, in_range, strict=True) if ok]
        )
    return nodes


def missing_nodes(node_ids: Sequence[NodeId], nodes: np.ndarray) -> NodeNotFound | None:
    """The 404 for the IDs ``find_nodes`` did not find, listing the first few; None if none."""
    if nodes.size == 0 or nodes.min() >= 0:
        return None
    missing = [node for node, index in zip(node_ids, nodes, strict=True) if index < 0]
    listed = ", ".join(show(node) for node in missing[:_MAX_LISTED_MISSING])
    more = len(missing) - _MAX_LISTED_MISSING
    suffix = f" and {more} more" if more > 0 else ""
    return NodeNotFound(f"node(s) not in the graph: {listed}{suffix}")


def _resolved(request: NodeRequest, nodes: np.ndarray) -> ResolvedRequest | NodeNotFound:
    return missing_nodes(request.node_ids, nodes) or ResolvedRequest(request=request, nodes=nodes)


def lookup_nodes(graph: GraphStore | GraphOverlay, node_ids: Sequence[NodeId]) -> np.ndarray:
    """Internal indices of ``node_ids``; NodeNotFound lists the IDs the graph lacks."""
    nodes = find_nodes(graph, node_ids)
    error = missing_nodes(node_ids, nodes)
    if error is not None:
        raise error
    return nodes


@dataclass(frozen=True)
class ResolvedRequest:
    """A valid request with its IDs mapped to internal node indices (same order)."""

    request: NodeRequest
    nodes: np.ndarray


class NodeClassificationEngine(BatchEngine[ResolvedRequest]):
    """Answers node classification requests from k-hop ego-graphs of a memory-mapped graph: the
    batch core's node task (one ego-graph for the batch's seeds, one forward pass)."""

    def __init__(
        self,
        store: GraphStore,
        model: torch.nn.Module,
        settings: ServingSettings,
        device: torch.device,
        model_version: str,
        model_name: str = "gnn",
        live: LiveGraph | None = None,
    ) -> None:
        self.store = store
        self.live = live
        self.model_name = model_name
        # One engine per worker process: it owns the process's intra-op thread count.
        if settings.torch_threads > 0:
            torch.set_num_threads(settings.torch_threads)
        self.model = model.to(device).eval()
        self.settings = settings
        self.device = device
        self.model_version = model_version
        self.features = readonly_tensor(store.features)
        self.in_degree = readonly_tensor(store.in_degree)
        overlay = live.overlay if live is not None else None
        self.sampler = sampler_for(store, settings, device, overlay)

    def handle(self, items: Sequence[Any]) -> list[Response]:
        """``prepare``, ``run`` and ``respond`` in one call (tests, benchmarks), on one graph
        version: the live graph is held still from lookup to ``graph_version`` (as
        ``GNNHandler.handle`` does for a TorchServe batch)."""
        if self.live is None:
            return super().handle(items)
        with self.live.reading():
            return super().handle(items)

    def refresh(self) -> None:
        if self.live is not None:
            # Updates acknowledged by any worker are visible from here on; usually the follower
            # thread has applied them already and this is one fstat.
            self.live.sync()

    def parse(self, item: Any) -> ResolvedRequest:
        """One request alone: parsed, then its IDs looked up (the batch's lookup failed)."""
        request = parse_node_request(item, self.settings.max_ids_per_request)
        try:
            nodes = find_nodes(self._current_graph(), request.node_ids)
        except Exception:
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
            graph = self._current_graph()
            found = find_nodes(graph, [node for r in requests for node in r.node_ids])
        except Exception:
            logger.exception("node lookup failed for the batch; looking up request by request")
            return [self._parse(item) for item in items]
        ends = np.cumsum([len(request.node_ids) for request in requests])
        per_request = iter(np.split(found, ends[:-1]))
        return [
            _resolved(request, next(per_request)) if isinstance(request, NodeRequest) else request
            for request in parsed
        ]

    def make_group(
        self, positions: list[int], outcomes: list[ResolvedRequest | ApiError]
    ) -> tuple[torch.Tensor, SampledSubgraph]:
        """``(seeds, ego-graph)`` of the union of the requests' nodes."""
        nodes = np.concatenate([_valid(outcomes[i]).nodes for i in positions])
        seeds = torch.from_numpy(np.unique(nodes))
        # Inference mode: no autograd bookkeeping on the sampler's many small tensor ops.
        with torch.inference_mode():
            subgraph = self.sampler.sample(seeds)
        return seeds, subgraph

    def run_group(self, group: Group, batch: Batch[ResolvedRequest]) -> None:
        times = batch.times
        seeds, sub = group.payload
        stop = timed(times, "gather")
        with torch.inference_mode():
            x, degree = self._gather(sub.node)
        stop()
        stop = timed(times, "forward")
        with torch.inference_mode():
            logits = self.model(x, sub.edge_index, degree=degree, level_sizes=sub.level_sizes)[
                : sub.num_seeds
            ]
            probabilities = torch.softmax(logits.float(), dim=-1).cpu()
        stop()
        times.seed_nodes += int(seeds.numel())
        times.sampled_nodes += sub.num_nodes
        times.sampled_edges += sub.num_edges
        # Seeds are sorted and unique (np.unique), so each request's rows are a binary search;
        # one numpy copy instead of a tensor indexing per request.
        table, sorted_seeds = probabilities.numpy(), seeds.numpy()
        for position in group.positions:
            nodes = _valid(batch.outcomes[position]).nodes
            batch.results[position] = table[np.searchsorted(sorted_seeds, nodes)]

    def body(self, request: ResolvedRequest, result: Any) -> dict[str, Any]:
        inner = request.request
        if inner.protocol == "v2":
            return v2_response(
                inner.request_id,
                self.model_name,
                self.model_version,
                list(inner.node_ids),
                result.tolist(),
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
        return parse_node_request(item, self.settings.max_ids_per_request)

    def _current_graph(self) -> GraphStore | GraphOverlay:
        """The overlay once updates exist (it knows new and removed nodes), else the base."""
        if self.live is not None and not self.live.overlay.is_empty:
            return self.live.overlay
        return self.store

    def _gather(self, nodes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Feature rows and full-graph in-degrees of the subgraph's nodes, on the device."""
        graph = self._current_graph()
        overlay = graph if isinstance(graph, GraphOverlay) else None
        return gather_rows(overlay, self.features, self.in_degree, nodes, self.device)

    def _prediction(self, node_id: NodeId, probabilities: list[float]) -> dict[str, Any]:
        answer: dict[str, Any] = {
            "node_id": node_id,
            **class_answer(probabilities, self.store.class_names),
            "model_version": self.model_version,
        }
        if self.live is not None:
            answer["graph_version"] = self.live.version
        return answer


def _valid(outcome: ResolvedRequest | ApiError) -> ResolvedRequest:
    assert isinstance(outcome, ResolvedRequest)
    return outcome
