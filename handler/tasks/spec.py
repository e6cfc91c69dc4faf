"""What a task declares, and what a worker starts it from: the handler looks the archive's task
up in ``handler.tasks.registry`` instead of branching on it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from handler.graph.graph_source import ServedGraph
from handler.graph.precomputed import PrecomputedRows
from handler.live.live_graph import LiveGraph, UpdatePolicy, open_live_graph
from handler.pipeline.router import Router
from handler.settings import ServingSettings
from model.config import ModelConfig
from model.precompute import Precomputed
from model.user_model import UserModelConfig


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
    config: ModelConfig | UserModelConfig
    store: ServedGraph | None
    precomputed: Precomputed | None = None  # built with --precompute

    def stored_graph(self) -> ServedGraph:
        if self.store is None:
            raise RuntimeError("this task serves a stored graph, but none was opened")
        return self.store


@dataclass
class StartedTask:
    """A task ready to serve: the router over its engines, what ``describe`` says about it, and
    the live graph and update policy where the task takes updates."""

    archive: Archive
    engine: Any  # the task's prediction engine
    router: Router
    details: Callable[[], dict[str, Any]] | None = None  # the task's own describe fields
    store: ServedGraph | None = None
    live: LiveGraph | None = None
    update_policy: UpdatePolicy = field(default_factory=lambda: UpdatePolicy(None, 0))
    precomputed: PrecomputedRows | None = None  # answers read stored rows (--precompute)

    def summary(self) -> str:
        """What the worker's "ready" log line says about the graph it serves."""
        if self.store is None:
            return "graphs come with each request"
        store = self.store
        return (
            f"{store.num_nodes} nodes, {store.num_edges} edges, graph {store.checksum[:12]}, "
            f"fanouts {list(self.archive.settings.fanouts)}"
        )


@dataclass(frozen=True)
class TaskSpec:
    """One task: whether its archive carries a stored graph, and how its engines start."""

    stored_graph: bool
    start: Callable[[Archive, Loaded], StartedTask]


def check_fits(
    config: ModelConfig | UserModelConfig,
    store: ServedGraph,
    settings: ServingSettings,
    classes: bool,
) -> None:
    """Refuses weights, graph and fanouts that do not fit together, naming each mismatch
    (``classes``: the model's outputs are the graph's classes)."""
    problems = []
    feature_dim = store.schema.target_type.feature_dim
    if config.in_dim != feature_dim:
        problems.append(
            f"the model expects {config.in_dim} features (model_config.json in_dim), the graph "
            f"has {feature_dim} (graph/meta.json feature_dim)"
        )
    if classes and config.out_dim != store.num_classes:
        problems.append(
            f"the model predicts {config.out_dim} classes (model_config.json out_dim), the graph "
            f"has {store.num_classes} (graph/meta.json num_classes); build with --output raw "
            "for outputs that are not the graph's classes"
        )
    if len(settings.fanouts) != config.num_layers:
        problems.append(
            f"the model has {config.num_layers} layers but fanouts {list(settings.fanouts)} "
            f"name {len(settings.fanouts)} hops; give one fanout per layer"
        )
    if problems:
        raise ValueError("archive is inconsistent: " + "; ".join(problems))


def open_updates(
    store: ServedGraph, settings: ServingSettings
) -> tuple[LiveGraph | None, UpdatePolicy]:
    """The archive's live graph and update policy. The overlay reads its base through the
    graph view, so an archive takes updates over a graph in Redis too (a link archive only
    with precomputed rows, which the link task checks)."""
    return open_live_graph(store, settings)
