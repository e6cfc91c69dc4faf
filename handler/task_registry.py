"""The tasks an archive can serve, and how a worker starts one: the handler looks the archive's
task up here instead of branching on it. A task declares whether it serves a stored graph and
how it builds its engines (``handler.tasks`` routes the requests among them)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from graph_assets import GraphStore
from handler.engine import NodeClassificationEngine
from handler.graph_engine import GraphEngine
from handler.link_engine import LinkEngine
from handler.live_graph import LiveGraph, UpdatePolicy, open_live_graph
from handler.settings import ServingSettings
from handler.tasks import Router, check_task, graph_router, link_router, node_router
from model.config import ModelConfig
from model.export import load_model

MainEngine = NodeClassificationEngine | LinkEngine | GraphEngine


@dataclass(frozen=True)
class Archive:
    """What a worker starts its task from: the unpacked archive and where it serves."""

    model_dir: Path
    settings: ServingSettings
    device: torch.device
    model_version: str
    model_name: str


@dataclass(frozen=True)
class Loaded:
    """The archive's model and, for tasks that serve one, its stored graph."""

    model: torch.nn.Module
    config: ModelConfig
    store: GraphStore | None


@dataclass
class StartedTask:
    """A task ready to serve: its main engine (``describe`` reads it), the router of every
    engine, and the live graph and update policy where the task takes updates."""

    engine: MainEngine
    router: Router
    store: GraphStore | None = None
    live: LiveGraph | None = None
    update_policy: UpdatePolicy = field(default_factory=lambda: UpdatePolicy(None, 0))

    def summary(self) -> str:
        """What the worker's "ready" log line says about the graph it serves."""
        if self.store is None:
            return "graphs come with each request"
        store = self.store
        return (
            f"{store.num_nodes} nodes, {store.num_edges} edges, graph {store.checksum[:12]}, "
            f"fanouts {list(self.engine.settings.fanouts)}"
        )


@dataclass(frozen=True)
class TaskSpec:
    """One task: whether its archive carries a stored graph, and how its engines start."""

    stored_graph: bool
    start: Callable[[Archive, Loaded], StartedTask]


def start_task(archive: Archive, open_graph: Callable[[], GraphStore]) -> StartedTask:
    """Loads the model (and the graph, if the task serves one) and starts the archive's task."""
    spec = TASKS[archive.settings.task]
    store = open_graph() if spec.stored_graph else None
    model, config = load_model(archive.model_dir, map_location=archive.device)
    check_task(config, archive.settings)
    return spec.start(archive, Loaded(model=model, config=config, store=store))


def _start_node(archive: Archive, loaded: Loaded) -> StartedTask:
    store, config, settings = _store(loaded), loaded.config, archive.settings
    check_compatible(config.in_dim, config.out_dim, config.num_layers, store, settings)
    live, policy = open_live_graph(store, settings)
    engine = NodeClassificationEngine(
        store,
        loaded.model,
        settings,
        archive.device,
        archive.model_version,
        model_name=archive.model_name,
        live=live,
    )
    router = node_router(engine, archive.model_version)
    return StartedTask(engine, router, store=store, live=live, update_policy=policy)


def _start_link(archive: Archive, loaded: Loaded) -> StartedTask:
    store = _store(loaded)
    engine, router = link_router(
        store,
        loaded.model,
        loaded.config,
        archive.settings,
        archive.device,
        archive.model_dir,
        archive.model_version,
    )
    return StartedTask(engine, router, store=store)


def _start_graph(archive: Archive, loaded: Loaded) -> StartedTask:
    engine, router = graph_router(
        loaded.model, archive.settings, archive.device, archive.model_dir, archive.model_version
    )
    return StartedTask(engine, router)


def _store(loaded: Loaded) -> GraphStore:
    if loaded.store is None:
        raise RuntimeError("this task serves a stored graph, but none was opened")
    return loaded.store


TASKS: dict[str, TaskSpec] = {
    "node": TaskSpec(stored_graph=True, start=_start_node),
    "link": TaskSpec(stored_graph=True, start=_start_link),
    "graph": TaskSpec(stored_graph=False, start=_start_graph),
}


def check_compatible(
    in_dim: int, out_dim: int, num_layers: int, store: GraphStore, settings: ServingSettings
) -> None:
    """Refuses weights, graph and fanouts that do not fit together, naming the mismatch."""
    problems = []
    if in_dim != store.feature_dim:
        problems.append(
            f"the model expects {in_dim} features (model_config.json in_dim), the graph has "
            f"{store.feature_dim} (graph/meta.json feature_dim)"
        )
    if out_dim != store.num_classes:
        problems.append(
            f"the model predicts {out_dim} classes (model_config.json out_dim), the graph has "
            f"{store.num_classes} (graph/meta.json num_classes)"
        )
    if len(settings.fanouts) != num_layers:
        problems.append(
            f"the model has {num_layers} layers but fanouts {list(settings.fanouts)} name "
            f"{len(settings.fanouts)} hops; give one fanout per layer"
        )
    if problems:
        raise ValueError("archive is inconsistent: " + "; ".join(problems))
