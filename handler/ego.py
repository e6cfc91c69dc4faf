"""What the link, embedding, cold-start, graph and explanation engines share.

- :class:`EgoGraphs`: the stored graph as a model sees it (ID lookup, the deterministic sampler,
  feature and degree gathering). Node archives reuse their node engine's sampler and live graph,
  so an embedding, cold-start or explanation request sees exactly the graph (live updates
  included) and the ego-graph a prediction request sees.
- :class:`BatchEngine`: the batch pipeline of ``handler.engine`` (parse each request alone,
  group the valid ones, run each group once, one response per request) with its fault rules: a
  group over the subgraph limits or whose run fails is split into single requests, so only
  the request that causes a failure gets its error; a fatal device error ends the worker.
  Subclasses supply parsing, grouping, the computation and the response body.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np
import torch

from graph_assets import GraphStore
from graph_assets.overlay import GraphOverlay
from handler.array_ops import readonly_tensor
from handler.engine import (
    NodeClassificationEngine,
    Response,
    StageTimes,
    gather_rows,
    lookup_nodes,
    raise_if_fatal,
)
from handler.error_table import api_error, internal_error
from handler.errors import ApiError, InternalError
from handler.live_graph import LiveGraph
from handler.node_requests import NodeId
from handler.sampler import NeighbourSampler, SampledSubgraph, SubgraphTooLarge, sampler_for
from handler.settings import ServingSettings

logger = logging.getLogger(__name__)


R = TypeVar("R")


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


@dataclass
class Group:
    """Requests computed together, and what was prepared for them (an ego-graph, a batch)."""

    positions: list[int]
    payload: Any


@dataclass
class Batch(Generic[R]):
    """One TorchServe batch in flight: per-request outcome, groups, results, stage times."""

    outcomes: list[R | ApiError]
    groups: list[Group] = field(default_factory=list)
    results: dict[int, Any] = field(default_factory=dict)
    times: StageTimes = field(default_factory=StageTimes)

    @property
    def batch(self) -> Batch[R]:
        """Itself: ``run`` hands back the batch it was given, as the node engine's result
        (which refers to its batch as ``.batch``)."""
        return self


class BatchEngine(ABC, Generic[R]):
    """prepare -> run -> respond over parsed requests of type ``R`` (see the module docstring)."""

    device: torch.device

    def refresh(self) -> None:
        """Runs before each batch is parsed (node archives: read the live updates)."""

    @abstractmethod
    def parse(self, item: Any) -> R:
        """One raw TorchServe request -> a validated request; raises ApiError."""

    def plan(self, positions: list[int], outcomes: list[R | ApiError]) -> list[list[int]]:
        """How the valid requests are grouped; by default all in one group."""
        return [positions]

    @abstractmethod
    def make_group(self, positions: list[int], outcomes: list[R | ApiError]) -> Any:
        """Prepares a group (samples its ego-graph); may raise SubgraphTooLarge or ApiError."""

    @abstractmethod
    def run_group(self, group: Group, batch: Batch[R]) -> None:
        """Computes the group; stores each request's result in ``batch.results[position]``."""

    @abstractmethod
    def body(self, request: R, result: Any) -> dict[str, Any]:
        """The JSON body of a successful request."""

    def prepare(self, items: Sequence[Any]) -> Batch[R]:
        batch: Batch[R] = Batch(outcomes=[], times=StageTimes(batch_size=len(items)))
        start = time.perf_counter()
        self.refresh()
        batch.outcomes = [self._parse(item) for item in items]
        batch.times.parse = time.perf_counter() - start
        start = time.perf_counter()
        valid = [i for i, o in enumerate(batch.outcomes) if not isinstance(o, ApiError)]
        for positions in self.plan(valid, batch.outcomes) if valid else []:
            batch.groups += self._make_groups(positions, batch.outcomes)
        batch.times.sample = time.perf_counter() - start
        return batch

    def run(self, batch: Batch[R]) -> Batch[R]:
        for group in batch.groups:
            self._run(group, batch)
        return batch

    def respond(self, batch: Batch[R]) -> list[Response]:
        start = time.perf_counter()
        responses = [self._respond(i, outcome, batch) for i, outcome in enumerate(batch.outcomes)]
        batch.times.format = time.perf_counter() - start
        return responses

    def handle(self, items: Sequence[Any]) -> list[Response]:
        """``prepare``, ``run`` and ``respond`` in one call (tests, benchmarks)."""
        return self.respond(self.run(self.prepare(items)))

    def _parse(self, item: Any) -> R | ApiError:
        try:
            return self.parse(item)
        except ApiError as error:
            return error
        except Exception:
            logger.exception("unexpected error while parsing a request")
            return InternalError("the request could not be parsed; the error is in the server log")

    def _make_groups(self, positions: list[int], outcomes: list[R | ApiError]) -> list[Group]:
        if len(positions) > 1:
            try:
                return [Group(positions, self.make_group(positions, outcomes))]
            except (SubgraphTooLarge, ApiError):
                pass  # some request alone is too large or refused: find it, with no traceback
            except Exception as error:
                self._raise_if_fatal(error)
                logger.exception("preparing a group failed; preparing its requests one by one")
        groups = []
        for position in positions:
            try:
                groups.append(Group([position], self.make_group([position], outcomes)))
            except SubgraphTooLarge as error:
                outcomes[position] = api_error(error) or internal_error(error, "sampling")
            except ApiError as error:
                outcomes[position] = error
            except Exception as error:
                self._raise_if_fatal(error)
                logger.exception("request %d: preparing it failed", position)
                outcomes[position] = internal_error(error, "sampling")
        return groups

    def _run(self, group: Group, batch: Batch[R]) -> None:
        try:
            self.run_group(group, batch)
            return
        except ApiError as error:
            if len(group.positions) == 1:
                batch.outcomes[group.positions[0]] = error
                return
        except Exception as error:
            self._raise_if_fatal(error)
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            if len(group.positions) == 1:
                logger.exception("request %d: the computation failed", group.positions[0])
                batch.outcomes[group.positions[0]] = internal_error(error, "model")
                return
            logger.exception("a batched computation failed; retrying its requests one by one")
        for retry in self._make_groups_one_by_one(group.positions, batch.outcomes):
            self._run(retry, batch)

    def _make_groups_one_by_one(
        self, positions: list[int], outcomes: list[R | ApiError]
    ) -> list[Group]:
        groups = []
        for position in positions:
            groups += self._make_groups([position], outcomes)
        return groups

    def _raise_if_fatal(self, error: Exception) -> None:
        raise_if_fatal(error, self.device)

    def _respond(self, position: int, outcome: R | ApiError, batch: Batch[R]) -> Response:
        if isinstance(outcome, ApiError):
            logger.info("request %d: %s %s", position, outcome.status, outcome.type_name)
            return Response(status=outcome.status, body=outcome.body())
        if position not in batch.results:
            error = InternalError("no answer was computed for this request")
            logger.error("request %d: %s", position, error.message)
            return Response(status=error.status, body=error.body())
        return Response(status=200, body=self.body(outcome, batch.results[position]))


def timed(times: StageTimes, stage: str) -> Callable[[], None]:
    """Starts a clock; calling the result adds the elapsed seconds to ``times.<stage>``."""
    start = time.perf_counter()

    def stop() -> None:
        setattr(times, stage, getattr(times, stage) + time.perf_counter() - start)

    return stop
