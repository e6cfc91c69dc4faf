""":class:`EgoGraphs`: the stored graph as the link, embedding, cold-start and explanation tasks
see it (ID lookup, the deterministic sampler, feature and degree gathering). Node archives reuse
their node engine's sampler and live graph, so an embedding, cold-start or explanation request
sees exactly the graph (live updates included) and the ego-graph a prediction request sees."""

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
from handler.engine import (
    NodeClassificationEngine,
    gather_rows,
    lookup_nodes,
)
from handler.live_graph import LiveGraph
from handler.node_requests import NodeId
from handler.sampler import NeighbourSampler, SampledSubgraph, sampler_for
from handler.settings import ServingSettings

logger = logging.getLogger(__name__)


def plain_module(model: torch.nn.Module) -> torch.nn.Module:
    """The module itself when it was wrapped by ``torch.compile`` (hooks and autograd paths
    such as embeddings and explanations run on the eager module)."""
    original = getattr(model, "_orig_mod", None)
    return original if isinstance(original, torch.nn.Module) else model


@dataclass
class EgoGraphs:
    """A stored graph (plus its live updates, if any), its sampler and the model that reads the
    sampled ego-graphs."""

    store: GraphStore
    model: torch.nn.Module
    sampler: NeighbourSampler
    features: torch.Tensor
    in_degree: torch.Tensor
    device: torch.device
    settings: ServingSettings
    live: LiveGraph | None = None

    @classmethod
    def create(
        cls,
        store: GraphStore,
        model: torch.nn.Module,
        settings: ServingSettings,
        device: torch.device,
    ) -> EgoGraphs:
        """The same sampler a node engine builds (same seed, graph key and limits)."""
        return cls(
            store=store,
            model=model.to(device).eval(),
            sampler=sampler_for(store, settings, device),
            features=readonly_tensor(store.features),
            in_degree=readonly_tensor(store.in_degree),
            device=device,
            settings=settings,
        )

    @classmethod
    def of_engine(cls, engine: NodeClassificationEngine) -> EgoGraphs:
        """Shares a node engine's graph, sampler and model (one copy, identical samples)."""
        return cls(
            store=engine.store,
            model=engine.model,
            sampler=engine.sampler,
            features=engine.features,
            in_degree=engine.in_degree,
            device=engine.device,
            settings=engine.settings,
            live=engine.live,
        )

    def sync(self) -> None:
        """Reads the live updates other workers appended (as the node engine does per batch)."""
        if self.live is not None:
            self.live.sync()

    def _overlay(self) -> GraphOverlay | None:
        """The live overlay once it holds updates, else None (the base store is current)."""
        if self.live is not None and not self.live.overlay.is_empty:
            return self.live.overlay
        return None

    def lookup(self, node_ids: Sequence[NodeId]) -> np.ndarray:
        """Internal indices of ``node_ids``; NodeNotFound lists the IDs the graph lacks."""
        return lookup_nodes(self._overlay() or self.store, node_ids)

    def sample(self, nodes: np.ndarray) -> tuple[torch.Tensor, SampledSubgraph]:
        """``(seeds, ego-graph)``: the unique ``nodes`` in ascending order are its seed rows."""
        seeds = torch.from_numpy(np.unique(nodes))
        return seeds, self.sampler.sample(seeds)

    def gather(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Features and full-graph in-degrees of global node indices ``rows``, on the device."""
        return gather_rows(self._overlay(), self.features, self.in_degree, rows, self.device)

    def external_ids(self, nodes: np.ndarray) -> list[Any]:
        """External IDs of internal indices (nodes added by live updates included)."""
        overlay = self._overlay()
        if overlay is not None:
            return [overlay.external_id(int(node)) for node in nodes]
        return self.store.external_ids(nodes)


def seed_rows(seeds: torch.Tensor, nodes: np.ndarray) -> list[int]:
    """Row of each of ``nodes`` among the sorted unique ``seeds``."""
    return np.searchsorted(seeds.numpy(), nodes).tolist()
