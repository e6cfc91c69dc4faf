"""Which engine answers which request: one router per archive, picked by the archive's task.

- ``node``: ``NodeClassificationEngine``; bodies with ``return_embedding`` or ``new_node`` go
  to ``NodeExtrasEngine``; explanations (``{"node_id": a}``) to ``ExplainEngine``.
- ``link``: ``LinkEngine``; explanations (``{"src": a, "dst": b}``) to ``ExplainEngine``.
- ``graph``: ``GraphEngine``; explanations (``{"graph": ...}``) to ``ExplainEngine``.

A TorchServe batch may mix requests for several engines (and explanation requests with
predictions: TorchServe batches both from one queue and marks each explanation request with an
``explain`` header). The router splits the batch, runs each engine on its share, and puts the
answers back in request order, one per request. An engine that fails as a whole answers 500
for its own requests only.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

import torch

from graph_assets import GraphStore
from handler.batch_core import DeviceFailure, Response, StageTimes
from handler.ego import EgoGraphs
from handler.engine import NodeClassificationEngine
from handler.errors import ApiError, InternalError
from handler.explain import ExplainEngine
from handler.graph_engine import GraphEngine
from handler.link_engine import LinkEngine
from handler.node_extras import NodeExtrasEngine
from handler.node_requests import body_of, decode_body
from handler.settings import ServingSettings
from handler.task_requests import is_node_extra
from model.config import ModelConfig
from model.graph_level import CLASSES_FILE
from model.link_assets import LINK_DIR, open_link_assets

logger = logging.getLogger(__name__)

PREDICT, EXTRAS, EXPLAIN = "predict", "extras", "explain"


class TaskEngine(Protocol):
    """prepare -> run -> respond, as ``NodeClassificationEngine`` and ``ego.BatchEngine`` do."""

    def prepare(self, items: Sequence[Any]) -> Any: ...

    def run(self, batch: Any) -> Any: ...

    def respond(self, result: Any) -> list[Response]: ...


@dataclass
class _Part:
    """The share of a batch that one engine answers."""

    route: str
    positions: list[int]
    prepared: Any = None
    result: Any = None
    error: ApiError | None = None


@dataclass
class RoutedBatch:
    """A batch split across engines; ``times`` adds up their stage times."""

    size: int
    parts: list[_Part] = field(default_factory=list)

    @property
    def times(self) -> StageTimes:
        total = StageTimes(batch_size=self.size)
        for part in self.parts:
            times = getattr(part.prepared, "times", None)
            if times is None:
                continue
            for item in fields(StageTimes):
                if item.name != "batch_size":
                    setattr(total, item.name, getattr(total, item.name) + getattr(times, item.name))
        return total


@dataclass
class RoutedResult:
    """What ``run`` hands ``respond`` (``batch`` as the handler's metrics expect)."""

    batch: RoutedBatch


Chooser = Callable[[Any, bool], str]


class Router:
    """Dispatches each request of a batch to an engine by a route name (module docstring)."""

    def __init__(self, engines: dict[str, TaskEngine], choose: Chooser) -> None:
        self.engines = engines
        self.choose = choose

    def prepare(self, items: Sequence[Any], explain: Sequence[bool] | None = None) -> RoutedBatch:
        flags = list(explain) if explain is not None else [False] * len(items)
        routed: dict[str, list[tuple[int, Any]]] = {}
        for position, (item, flag) in enumerate(zip(items, flags, strict=True)):
            try:
                body = decode_body(body_of(item))
                item = {"body": body}  # decoded once, for the engine too
            except ApiError:
                body = None  # the engine words the error
            routed.setdefault(self.choose(body, flag), []).append((position, item))
        batch = RoutedBatch(size=len(items))
        for route, entries in routed.items():
            part = _Part(route, [position for position, _ in entries])
            try:
                part.prepared = self.engines[route].prepare([item for _, item in entries])
            except DeviceFailure:
                raise
            except Exception:
                logger.exception("the %s engine failed to prepare its requests", route)
                part.error = InternalError("the request could not be prepared; see the server log")
            batch.parts.append(part)
        return batch

    def run(self, batch: RoutedBatch) -> RoutedResult:
        for part in batch.parts:
            if part.error is not None:
                continue
            try:
                part.result = self.engines[part.route].run(part.prepared)
            except DeviceFailure:
                raise
            except Exception:
                logger.exception("the %s engine failed on its requests", part.route)
                part.error = InternalError("the computation failed; the error is in the server log")
        return RoutedResult(batch=batch)

    def respond(self, result: RoutedResult) -> list[Response]:
        batch = result.batch
        answers: list[Response | None] = [None] * batch.size
        for part in batch.parts:
            responses = None
            if part.error is None:
                try:
                    responses = self.engines[part.route].respond(part.result)
                except Exception:
                    logger.exception("the %s engine failed to format its answers", part.route)
            if responses is None or len(responses) != len(part.positions):
                error = part.error or InternalError("no answer was formatted; see the server log")
                responses = [Response(error.status, error.body()) for _ in part.positions]
            for position, response in zip(part.positions, responses, strict=True):
                answers[position] = response
        missing = [i for i, answer in enumerate(answers) if answer is None]
        if missing:
            raise AssertionError(f"the batch has {batch.size} requests but {missing} got no answer")
        return [answer for answer in answers if answer is not None]

    def handle(self, items: Sequence[Any], explain: Sequence[bool] | None = None) -> list[Response]:
        """``prepare``, ``run`` and ``respond`` in one call (tests, benchmarks)."""
        return self.respond(self.run(self.prepare(items, explain)))


def check_task(config: ModelConfig, settings: ServingSettings) -> None:
    """The weights and the serving settings must be for the same task."""
    if config.task.value != settings.task:
        raise ValueError(
            f"archive is inconsistent: model_config.json is for task {config.task.value!r}, the "
            f"model-config YAML (gnn: task) says {settings.task!r}; rebuild the archive"
        )


def apply_threads(settings: ServingSettings) -> None:
    """The worker's intra-op threads, as the node engine sets them for node archives."""
    if settings.torch_threads > 0:
        torch.set_num_threads(settings.torch_threads)


def node_router(engine: NodeClassificationEngine, model_version: str) -> Router:
    """Node archives: predictions, embeddings and cold-start nodes, explanations."""
    ego = EgoGraphs.of_engine(engine)

    def choose(body: Any, explain: bool) -> str:
        if explain:
            return EXPLAIN
        return EXTRAS if is_node_extra(body) else PREDICT

    engines: dict[str, TaskEngine] = {
        PREDICT: engine,
        EXTRAS: NodeExtrasEngine(ego, model_version),
        EXPLAIN: ExplainEngine("node", model_version, ego=ego),
    }
    return Router(engines, choose)


def _predict_or_explain(body: Any, explain: bool) -> str:
    return EXPLAIN if explain else PREDICT


def link_router(
    store: GraphStore,
    model: torch.nn.Module,
    config: ModelConfig,
    settings: ServingSettings,
    device: torch.device,
    model_dir: Path,
    model_version: str,
) -> tuple[LinkEngine, Router]:
    """Link archives: checks the graph, the model and the candidate embeddings fit together."""
    problems = []
    if config.in_dim != store.feature_dim:
        problems.append(
            f"the model expects {config.in_dim} features (model_config.json in_dim), the graph "
            f"has {store.feature_dim}"
        )
    if len(settings.fanouts) != config.num_layers:
        problems.append(
            f"the model has {config.num_layers} layers but fanouts {list(settings.fanouts)} "
            f"name {len(settings.fanouts)} hops; give one fanout per layer"
        )
    if problems:
        raise ValueError("archive is inconsistent: " + "; ".join(problems))
    assets = open_link_assets(model_dir / LINK_DIR, store, settings.verify_checksum)
    if assets.embeddings.shape[1] != config.out_dim:
        raise ValueError(
            f"{LINK_DIR}/embeddings.npy is {assets.embeddings.shape[1]} wide, the model's "
            f"embeddings are {config.out_dim} (model_config.json out_dim); rebuild the archive"
        )
    apply_threads(settings)
    ego = EgoGraphs.create(store, model, settings, device)
    engine = LinkEngine(ego, assets, model_version)
    engines: dict[str, TaskEngine] = {
        PREDICT: engine,
        EXPLAIN: ExplainEngine("link", model_version, ego=ego),
    }
    return engine, Router(engines, _predict_or_explain)


def graph_router(
    model: torch.nn.Module,
    settings: ServingSettings,
    device: torch.device,
    model_dir: Path,
    model_version: str,
) -> tuple[GraphEngine, Router]:
    """Graph archives: no stored graph; class names from ``classes.json``."""
    classes = model_dir / CLASSES_FILE
    class_names = json.loads(classes.read_text())["class_names"] if classes.is_file() else None
    apply_threads(settings)
    engine = GraphEngine(model, class_names, settings, device, model_version)
    engines: dict[str, TaskEngine] = {
        PREDICT: engine,
        EXPLAIN: ExplainEngine("graph", model_version, graphs=engine),
    }
    return engine, Router(engines, _predict_or_explain)


def describe(engine: NodeClassificationEngine | LinkEngine | GraphEngine) -> dict[str, Any]:
    """The management API's ``customized=true`` description of any archive."""
    settings = engine.settings
    described: dict[str, Any] = {
        "task": settings.task,
        "model_version": engine.model_version,
        "device": str(engine.device),
    }
    store: GraphStore | None = getattr(engine, "store", None)
    if store is not None:
        described["fanouts"] = list(settings.fanouts)
        described["graph"] = {
            "nodes": store.num_nodes,
            "edges": store.num_edges,
            "feature_dim": store.feature_dim,
            "num_classes": store.num_classes,
            "class_names": store.class_names,
            "checksum": store.checksum,
        }
    if isinstance(engine, (LinkEngine, GraphEngine)):
        described[settings.task] = engine.describe()
    live = getattr(engine, "live", None)
    if live is not None:
        described["updates"] = live.describe()
    described["explanations"] = {
        "method": "IntegratedGradients",
        "steps": settings.explain_steps,
        "time_budget_ms": settings.explain_time_budget_ms,
    }
    return described
