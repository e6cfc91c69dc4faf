"""The node classification pipeline of one batch, free of TorchServe so it can be tested alone.

``prepare`` parses every request on its own and samples ONE ego-graph for the union of the
batch's seeds; ``run`` does the forward pass; ``respond`` makes exactly one response per request.
A batch whose union ego-graph is over the limits, or whose forward pass fails unexpectedly, is
served request by request, so one request never fails its neighbours. A CUDA error that leaves
the device unusable ends the worker instead (:class:`DeviceFailure`), so TorchServe restarts it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from graph_assets import GraphStore
from graph_assets.overlay import GraphOverlay
from handler.array_ops import readonly_tensor
from handler.class_answer import class_answer
from handler.error_table import api_error, internal_error, is_out_of_memory
from handler.errors import ApiError, InternalError, NodeNotFound
from handler.kserve_v2 import v2_response
from handler.live_graph import LiveGraph
from handler.node_requests import NodeId, NodeRequest, parse_node_request, show
from handler.sampler import SampledSubgraph, SubgraphTooLarge, sampler_for
from handler.settings import ServingSettings

logger = logging.getLogger(__name__)

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_MAX_LISTED_MISSING = 20


class DeviceFailure(SystemExit):
    """The accelerator is unusable: this worker process must end so TorchServe starts a new one.

    A CUDA error other than out-of-memory (an illegal address, a device-side assert, a launch
    failure) is sticky: it poisons the CUDA context, and every later kernel in the process fails
    too. Answering 500 forever is worse than losing the requests in flight, so the engine ends
    the process. It is a ``SystemExit`` because TorchServe catches ``Exception`` around the
    handler and would keep the broken worker alive; this passes through, the worker exits with
    status 1, and TorchServe fails the batch in flight and restarts the worker.
    """

    def __init__(self, error: BaseException) -> None:
        super().__init__(1)
        self.error = error


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


def raise_if_fatal(error: Exception, device: torch.device) -> None:
    """Ends the worker (``DeviceFailure``) on an unrecoverable device error; else returns."""
    if is_fatal_device_error(error):
        logger.critical(
            "unrecoverable device error on %s (%s); ending this worker so that TorchServe "
            "starts a fresh one",
            device,
            error,
        )
        raise DeviceFailure(error) from error


def is_fatal_device_error(error: BaseException) -> bool:
    """True for a CUDA error that leaves the device unusable (not an out-of-memory)."""
    if is_out_of_memory(error):
        return False
    accelerator = getattr(torch, "AcceleratorError", None)
    if accelerator is not None and isinstance(error, accelerator):
        return True
    return isinstance(error, RuntimeError) and "CUDA error" in str(error)


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


@dataclass
class Group:
    """Requests answered from one sampled subgraph (the whole batch, or one request)."""

    positions: list[int]
    seeds: torch.Tensor
    subgraph: SampledSubgraph


@dataclass
class StageTimes:
    """Seconds spent per stage of one batch, and its sizes (reported as metrics)."""

    batch_size: int = 0
    seed_nodes: int = 0
    sampled_nodes: int = 0
    sampled_edges: int = 0
    parse: float = 0.0
    sample: float = 0.0
    gather: float = 0.0
    forward: float = 0.0
    format: float = 0.0


@dataclass
class PreparedBatch:
    """What ``prepare`` hands ``run``: per-request outcomes so far and the groups to run."""

    outcomes: list[ResolvedRequest | ApiError]
    groups: list[Group]
    times: StageTimes


@dataclass
class BatchResult:
    """What ``run`` hands ``respond``: class probabilities per request position."""

    batch: PreparedBatch
    probabilities: dict[int, np.ndarray] = field(default_factory=dict)


@dataclass(frozen=True)
class Response:
    """One request's answer: HTTP status and JSON body."""

    status: int
    body: dict[str, Any]


class NodeClassificationEngine:
    """Answers node classification requests from k-hop ego-graphs of a memory-mapped graph."""

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

    def prepare(self, items: Sequence[Any]) -> PreparedBatch:
        """Parses each request separately, then samples one subgraph for the batch's seeds."""
        times = StageTimes(batch_size=len(items))
        start = time.perf_counter()
        if self.live is not None:
            # Updates acknowledged by any worker are visible from here on; usually the follower
            # thread has applied them already and this is one fstat.
            self.live.sync()
        outcomes = self._resolve_all(items)
        times.parse = time.perf_counter() - start
        start = time.perf_counter()
        valid = [i for i, outcome in enumerate(outcomes) if isinstance(outcome, ResolvedRequest)]
        groups: list[Group] = []
        if valid:
            try:
                groups = [self._sample_group(outcomes, valid)]
            except SubgraphTooLarge:
                groups = self._sample_one_by_one(outcomes, valid)
            except Exception as error:
                self._raise_if_fatal(error)
                logger.exception("batch sampling failed; sampling its requests one by one")
                groups = self._sample_one_by_one(outcomes, valid)
        times.sample = time.perf_counter() - start
        times.seed_nodes = sum(int(g.seeds.numel()) for g in groups)
        times.sampled_nodes = sum(g.subgraph.num_nodes for g in groups)
        times.sampled_edges = sum(g.subgraph.num_edges for g in groups)
        return PreparedBatch(outcomes=outcomes, groups=groups, times=times)

    def run(self, batch: PreparedBatch) -> BatchResult:
        """Runs the model once per group; a failing group is retried request by request."""
        result = BatchResult(batch=batch)
        for group in batch.groups:
            if len(group.positions) == 1:
                self._run_isolated(group, result)
                continue
            try:
                self._run_group(group, result)
            except Exception as error:
                self._raise_if_fatal(error)
                self._release_device_memory()
                logger.exception("batch forward failed; retrying its requests one by one")
                for retry in self._sample_one_by_one(batch.outcomes, group.positions):
                    self._run_isolated(retry, result)
        return result

    def respond(self, result: BatchResult) -> list[Response]:
        """Exactly one response per request, in request order."""
        start = time.perf_counter()
        batch = result.batch
        responses = [
            self._format(position, outcome, result)
            for position, outcome in enumerate(batch.outcomes)
        ]
        batch.times.format = time.perf_counter() - start
        if len(responses) != len(batch.outcomes):
            raise AssertionError(
                f"the batch has {len(batch.outcomes)} requests but {len(responses)} responses"
            )
        return responses

    def handle(self, items: Sequence[Any]) -> list[Response]:
        """``prepare``, ``run`` and ``respond`` in one call (tests, benchmarks), on one graph
        version: the live graph is held still from lookup to ``graph_version`` (as
        ``GNNHandler.handle`` does for a TorchServe batch)."""
        if self.live is None:
            return self.respond(self.run(self.prepare(items)))
        with self.live.reading():
            return self.respond(self.run(self.prepare(items)))

    def _resolve_all(self, items: Sequence[Any]) -> list[ResolvedRequest | ApiError]:
        """Parses each request alone, then looks up the IDs of all valid ones in one call
        (a lookup per request cost a busy worker ~8% of its time)."""
        parsed = [self._parse(item) for item in items]
        requests = [request for request in parsed if isinstance(request, NodeRequest)]
        try:
            graph = self._current_graph()
            found = find_nodes(graph, [node for r in requests for node in r.node_ids])
        except Exception:
            logger.exception("node lookup failed for the batch; looking up request by request")
            return [self._resolve(r) if isinstance(r, NodeRequest) else r for r in parsed]
        ends = np.cumsum([len(request.node_ids) for request in requests])
        per_request = iter(np.split(found, ends[:-1]))
        return [
            _resolved(request, next(per_request)) if isinstance(request, NodeRequest) else request
            for request in parsed
        ]

    def _parse(self, item: Any) -> NodeRequest | ApiError:
        try:
            return parse_node_request(item, self.settings.max_ids_per_request)
        except ApiError as error:
            return error
        except Exception:
            logger.exception("unexpected error while parsing a request")
            return InternalError("the request could not be parsed; the error is in the server log")

    def _resolve(self, request: NodeRequest) -> ResolvedRequest | ApiError:
        try:
            return _resolved(request, find_nodes(self._current_graph(), request.node_ids))
        except Exception:
            logger.exception("node lookup failed for a request")
            return InternalError("the node lookup failed; the error is in the server log")

    def _sample_group(self, outcomes: list[Any], positions: list[int]) -> Group:
        nodes = np.concatenate([outcomes[i].nodes for i in positions])
        seeds = torch.from_numpy(np.unique(nodes))
        # Inference mode: no autograd bookkeeping on the sampler's many small tensor ops.
        with torch.inference_mode():
            subgraph = self.sampler.sample(seeds)
        return Group(positions=positions, seeds=seeds, subgraph=subgraph)

    def _sample_one_by_one(self, outcomes: list[Any], positions: list[int]) -> list[Group]:
        groups = []
        for position in positions:
            try:
                groups.append(self._sample_group(outcomes, [position]))
            except SubgraphTooLarge as error:
                outcomes[position] = api_error(error) or internal_error(error, "sampling")
            except Exception as error:
                self._raise_if_fatal(error)
                logger.exception("request %d: sampling failed", position)
                outcomes[position] = internal_error(error, "sampling")
        return groups

    def _run_isolated(self, group: Group, result: BatchResult) -> None:
        try:
            self._run_group(group, result)
        except Exception as error:
            self._raise_if_fatal(error)
            self._release_device_memory()
            position = group.positions[0]
            logger.exception("request %d: forward pass failed", position)
            result.batch.outcomes[position] = internal_error(error, "model")

    def _raise_if_fatal(self, error: Exception) -> None:
        raise_if_fatal(error, self.device)

    def _release_device_memory(self) -> None:
        """After a failed forward, hand cached CUDA blocks back so the retries have room."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _run_group(self, group: Group, result: BatchResult) -> None:
        times = result.batch.times
        start = time.perf_counter()
        sub = group.subgraph
        with torch.inference_mode():
            x, degree = self._gather(sub.node)
        times.gather += time.perf_counter() - start
        start = time.perf_counter()
        with torch.inference_mode():
            logits = self.model(x, sub.edge_index, degree=degree, level_sizes=sub.level_sizes)[
                : sub.num_seeds
            ]
            probabilities = torch.softmax(logits.float(), dim=-1).cpu()
        times.forward += time.perf_counter() - start
        # Seeds are sorted and unique (np.unique), so each request's rows are a binary search;
        # one numpy copy instead of a tensor indexing per request.
        table = probabilities.numpy()
        seeds = group.seeds.numpy()
        for position in group.positions:
            resolved = result.batch.outcomes[position]
            assert isinstance(resolved, ResolvedRequest)
            result.probabilities[position] = table[np.searchsorted(seeds, resolved.nodes)]

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

    def _format(
        self, position: int, outcome: ResolvedRequest | ApiError, result: BatchResult
    ) -> Response:
        if isinstance(outcome, ApiError):
            logger.info("request %d: %s %s", position, outcome.status, outcome.type_name)
            return Response(status=outcome.status, body=outcome.body())
        probabilities = result.probabilities.get(position)
        if probabilities is None:
            error = InternalError("no prediction was computed for this request")
            logger.error("request %d: %s", position, error.message)
            return Response(status=error.status, body=error.body())
        request = outcome.request
        if request.protocol == "v2":
            return Response(
                status=200,
                body=v2_response(
                    request.request_id,
                    self.model_name,
                    self.model_version,
                    list(request.node_ids),
                    probabilities.tolist(),
                ),
            )
        predictions = [
            self._prediction(node_id, row)
            for node_id, row in zip(outcome.request.node_ids, probabilities.tolist(), strict=True)
        ]
        if outcome.request.single:
            return Response(status=200, body=predictions[0])
        body: dict[str, Any] = {"predictions": predictions, "model_version": self.model_version}
        if self.live is not None:
            body["graph_version"] = self.live.version
        return Response(status=200, body=body)

    def _prediction(self, node_id: NodeId, probabilities: list[float]) -> dict[str, Any]:
        answer: dict[str, Any] = {
            "node_id": node_id,
            **class_answer(probabilities, self.store.class_names),
            "model_version": self.model_version,
        }
        if self.live is not None:
            answer["graph_version"] = self.live.version
        return answer
