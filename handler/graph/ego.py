""":class:`EgoGraphs`: the graph as every task that samples ego-graphs sees it (node
classification, embeddings, cold start, link prediction, explanations): ID lookup, the one
deterministic sampler, feature and degree gathering, and the live updates where the archive takes
them. Each worker builds one and every engine of its task shares it, so an embedding, cold-start or
explanation request sees exactly the graph version and the ego-graph a prediction sees."""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from graph_assets.graph_view import GraphView
from graph_assets.remote import RemoteCounters, RemoteStore
from handler.gpu.device_features import (
    DeviceFeatures,
    TypedDeviceFeatures,
    device_features_for,
    gather_features,
)
from handler.gpu.padding import PaddedSubgraph, pad_subgraph
from handler.graph.graph_source import ServedGraph
from handler.graph.precomputed import DRAIN_ROWS, PrecomputedRows
from handler.live.live_graph import LiveGraph
from handler.protocol.body import NodeId, show
from handler.protocol.errors import BadRequest, NotFound
from handler.sampling.sampler import NeighbourSampler, SampledSubgraph, sampler_for
from handler.settings import ServingSettings
from model.device import to_serving_device
from model.precompute import Precomputed
from model.served import EdgeInput, serving_needs, tell_largest_degree
from model.served.contract import served

logger = logging.getLogger(__name__)

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_MAX_LISTED_MISSING = 20


@dataclass
class EgoGraphs:
    """A stored graph (plus its live updates, if any), its sampler and the model that reads the
    sampled ego-graphs."""

    store: ServedGraph
    model: torch.nn.Module
    sampler: NeighbourSampler
    device: torch.device
    settings: ServingSettings
    live: LiveGraph | None = None
    # A precomputed archive's stored layer rows: answers read them instead of sampling.
    precomputed: PrecomputedRows | None = None
    # A GPU worker's stored features in GPU memory (handler.gpu.device_features), per type
    # on a graph of several (the typed gather reads them: model.typed_rows).
    device_features: DeviceFeatures | TypedDeviceFeatures | None = None

    @classmethod
    def create(
        cls,
        store: ServedGraph,
        model: torch.nn.Module,
        settings: ServingSettings,
        device: torch.device,
        live: LiveGraph | None = None,
        precomputed: Precomputed | None = None,
    ) -> EgoGraphs:
        """The graph of one worker: the model on its device, the archive's sampler, and the
        precomputed rows kept up to date with the live graph."""
        overlay = live.overlay if live is not None else None
        model = to_serving_device(model, device)
        rows = None
        if precomputed is not None:
            rows = PrecomputedRows(precomputed, model, store, overlay)
            if live is not None:  # the follower recomputes marked rows between batches
                live.background.append(functools.partial(rows.drain, DRAIN_ROWS))
        return cls(
            store=store,
            model=model,
            sampler=sampler_for(
                store, settings, device, overlay, boundary=serving_needs(model).boundary_degrees
            ),
            device=device,
            settings=settings,
            live=live,
            precomputed=rows,
            device_features=device_features_for(
                store, device, settings.gpu_feature_fraction, lambda: _free_bytes(device)
            ),
        )

    @property
    def served_node_type(self) -> str:
        """The node type the model answers for: a heterogeneous model's target, else the
        graph's one type."""
        return served(self.model).target or self.store.schema.target

    def check_node_type(self, node_type: str | None) -> None:
        """BadRequest unless ``node_type`` is None or the type this archive answers for."""
        if node_type is None:  # every request of a one-type client: nothing to look up
            return
        served = self.served_node_type
        if node_type != served:
            types = ", ".join(self.store.schema.node_type_names)
            raise BadRequest(
                f"node_type {node_type!r}: this archive answers for {served!r} nodes (the "
                f"graph's node types are {types}); send node_type {served!r} or leave it out"
            )

    def sync(self) -> None:
        """Applies the live updates other workers appended (usually the follower thread has
        already applied them and this is one fstat)."""
        if self.live is not None:
            self.live.sync()

    def view(self) -> GraphView:
        """The current graph version: the live overlay once it holds updates (it knows new and
        removed nodes), else the stored graph (the fast path)."""
        if self.live is not None and not self.live.overlay.is_empty:
            return self.live.overlay
        return self.store

    def find(self, node_ids: Sequence[NodeId], node_type: str | None = None) -> np.ndarray:
        """Internal indices of ``node_ids`` (IDs of ``node_type``; default: the graph's
        target type), -1 for an ID the graph lacks (an int outside int64 cannot be an ID, so
        it is reported missing rather than overflowing)."""
        look = functools.partial(self.view().lookup, node_type=node_type)
        in_range = [not isinstance(n, int) or _INT64_MIN <= n <= _INT64_MAX for n in node_ids]
        nodes = np.full(len(node_ids), -1, dtype=np.int64)
        if all(in_range):
            nodes[:] = look(node_ids)
        elif any(in_range):
            nodes[np.array(in_range)] = look(
                [node for node, ok in zip(node_ids, in_range, strict=True) if ok]
            )
        return nodes

    def lookup(self, node_ids: Sequence[NodeId], node_type: str | None = None) -> np.ndarray:
        """Internal indices of ``node_ids`` (of ``node_type``, as :meth:`find`); NotFound
        lists the IDs the graph lacks (naming ``node_type`` when given)."""
        nodes = self.find(node_ids, node_type)
        error = missing_nodes(node_ids, nodes, node_type)
        if error is not None:
            raise error
        return nodes

    def sample(self, nodes: np.ndarray) -> tuple[torch.Tensor, SampledSubgraph]:
        """``(seeds, ego-graph)``: the unique ``nodes`` in ascending order are its seed rows.
        Under inference mode: no autograd bookkeeping on the sampler's many small tensor ops (an
        explanation clones the structure it differentiates through)."""
        seeds, sub = self._sampled(nodes)
        return seeds, on_device(sub, self.device)

    def sample_padded(self, nodes: np.ndarray) -> tuple[torch.Tensor, PaddedSubgraph]:
        """As :meth:`sample`, with the ego-graph padded to bucket sizes on the host
        (handler.gpu.padding) for a forward captured per bucket, which copies it into its
        own device buffers."""
        seeds, sub = self._sampled(nodes)
        return seeds, pad_subgraph(sub)

    def _sampled(self, nodes: np.ndarray) -> tuple[torch.Tensor, SampledSubgraph]:
        seeds = torch.from_numpy(np.unique(nodes))
        with torch.inference_mode():
            sub = self.sampler.sample(seeds)
        self._prefetch(sub)
        return seeds, sub

    def _prefetch(self, sub: SampledSubgraph) -> None:
        """On a graph in Redis, what gathering ``sub``'s inputs reads (features and degrees of
        its rows, features of its edges when the model reads them) in one round, so that a
        batch costs its hops' rounds and this one (live updates change no base row, so the
        base's rows are fetched under an overlay too). Without a cache (``remote_cache_mb`` 0)
        it would only read everything twice."""
        store = self.store
        if not isinstance(store, RemoteStore) or not store.cache.capacity_bytes:
            return
        nodes = sub.node.cpu().numpy()
        edges = np.empty(0, dtype=np.int64)
        # A typed model gets every relation's edge features (model.typed_rows).
        typed = not store.schema.is_homogeneous
        if typed or serving_needs(self.model).edge_input is not EdgeInput.NONE:
            edges = sub.edge.cpu().numpy()
        stored = (nodes >= 0) & (nodes < store.num_nodes)
        store.prefetch(nodes[stored], edges[(edges >= 0) & (edges < store.num_edges)])

    def gather(
        self, rows: torch.Tensor, view: GraphView | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Features and full-graph degrees of global node indices ``rows`` in ``view``
        (default: the current graph version), on the device; a boundary row (``-1``) gets
        zeros. The degrees are in-degrees, or out-degrees for a model whose ChebConv reads
        them (``model.chebconv``), which is then told ``view``'s largest out-degree."""
        current = self.view()
        view, nodes = current if view is None else view, rows.cpu().numpy()
        boundary = nodes < 0
        any_boundary = bool(boundary.any())
        present = np.where(boundary, 0, nodes) if any_boundary else nodes
        if serving_needs(self.model).out_degrees:
            degrees = view.out_degree_rows(present)
            tell_largest_degree(self.model, view.largest_out_degree)
        else:
            degrees = view.degree_rows(present)
        if any_boundary:
            degrees[boundary] = 0
        degree = torch.from_numpy(degrees).to(self.device, non_blocking=True)
        if isinstance(self.device_features, DeviceFeatures) and view is current:
            return gather_features(self.device_features, view, nodes, self.device), degree
        features = view.feature_rows(present)
        if any_boundary:
            features[boundary] = 0
        return torch.from_numpy(features).to(self.device, non_blocking=True), degree

    def edge_features(
        self, edges: torch.Tensor, view: GraphView | None = None
    ) -> torch.Tensor | None:
        """Edge features of the sampled edges (by edge ID in ``view``, default the current
        graph version) when the model reads them, else None."""
        if serving_needs(self.model).edge_input is EdgeInput.NONE:
            return None
        rows = (self.view() if view is None else view).edge_feature_rows(edges.cpu().numpy())
        return torch.from_numpy(rows).to(self.device, non_blocking=True)

    def external_ids(self, nodes: np.ndarray) -> list[Any]:
        """External IDs of internal indices (nodes added by live updates included)."""
        return self.view().external_ids(nodes)

    def read_counters(self) -> RemoteCounters | None:
        """What reading the graph from Redis cost so far; None for a mapped graph."""
        store = self.store
        return store.counters if isinstance(store, RemoteStore) else None


class OnEgoGraphs:
    """An engine that serves from an :class:`EgoGraphs`: the graph, model and settings it
    reads (and ``describe`` reports) are the ego-graphs'."""

    ego: EgoGraphs

    @property
    def store(self) -> ServedGraph:
        return self.ego.store

    @property
    def model(self) -> torch.nn.Module:
        return self.ego.model

    @property
    def settings(self) -> ServingSettings:
        return self.ego.settings

    @property
    def live(self) -> LiveGraph | None:
        return self.ego.live

    def read_counters(self) -> RemoteCounters | None:
        """BatchEngine's hook: the graph's read costs (EgoGraphs.read_counters)."""
        return self.ego.read_counters()


def _free_bytes(device: torch.device) -> int:
    """Free memory of a CUDA ``device`` now (what the features may take a share of)."""
    return int(torch.cuda.mem_get_info(device)[0])


def on_device(sub: SampledSubgraph, device: torch.device) -> SampledSubgraph:
    """``sub`` with its tensors on ``device``: a GPU worker samples on the CPU
    (``settings.sampling_device``) and computes on the GPU."""
    if sub.node.device == device:
        return sub
    return dataclasses.replace(
        sub,
        node=sub.node.to(device, non_blocking=True),
        edge_index=sub.edge_index.to(device, non_blocking=True),
        edge=sub.edge.to(device, non_blocking=True),
    )


def missing_nodes(
    node_ids: Sequence[NodeId], nodes: np.ndarray, node_type: str | None = None
) -> NotFound | None:
    """The 404 for the IDs ``find`` did not find, listing the first few (and the type they
    were looked up in, when named); None if none."""
    if nodes.size == 0 or nodes.min() >= 0:
        return None
    missing = [node for node, index in zip(node_ids, nodes, strict=True) if index < 0]
    listed = ", ".join(show(node) for node in missing[:_MAX_LISTED_MISSING])
    more = len(missing) - _MAX_LISTED_MISSING
    suffix = f" and {more} more" if more > 0 else ""
    kind = "node(s)" if node_type is None else f"{node_type} node(s)"
    return NotFound(f"{kind} not in the graph: {listed}{suffix}")


def seed_rows(seeds: torch.Tensor, nodes: np.ndarray) -> list[int]:
    """Row of each of ``nodes`` among the sorted unique ``seeds``."""
    return np.searchsorted(seeds.numpy(), nodes).tolist()
