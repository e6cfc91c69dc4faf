"""``build_model``: the one place that knows which module each task trains and serves. It
imports the task modules; they import only the shared encoders (model.architectures), so
nothing imports in a circle."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from model.architectures import build_node_classifier
from model.config import ModelConfig, Task
from model.graph_level import GraphClassifier
from model.hetero_link import HeteroLinkPredictor
from model.hetero_recipes import build_hetero_model
from model.link import LinkPredictor
from model.typed_graph import hetero_spec

_MODULES: dict[Task, Callable[[ModelConfig], torch.nn.Module]] = {
    Task.NODE: build_node_classifier,
    Task.LINK: LinkPredictor,
    Task.GRAPH: GraphClassifier,
}


def build_model(config: ModelConfig | Mapping[str, Any]) -> torch.nn.Module:
    """Builds the untrained module for a config or its ``model_config.json`` dict.

    ``task`` picks the module: a ``NodeClassifier`` (``node``), a :class:`LinkPredictor`
    (``link``) or a :class:`GraphClassifier` (``graph``); on a graph of several node types or
    relations (``hetero``) the recipe's per-relation form (``model.hetero_recipes``), for
    ``link`` a :class:`HeteroLinkPredictor` of its ``target_edge_type``. Load
    weights with ``load_state_dict`` (or ``model.export.load_model``) and call ``eval()``
    before serving: dropout is active in training mode.
    """
    if not isinstance(config, ModelConfig):
        config = ModelConfig.from_dict(config)
    if config.hetero is not None and config.task is Task.LINK:  # a typed graph's relation
        return HeteroLinkPredictor(config)
    if config.hetero is not None:  # the per-relation form of the recipe
        return build_hetero_model(config.arch.value, hetero_spec(config))
    return _MODULES[config.task](config)
