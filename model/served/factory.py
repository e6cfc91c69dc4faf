"""The one factory of served models: the preset a config names, or the adapter that puts the
user's class behind the served-model contract (``model.served.contract``).

This module is the one place that knows the classes: every other module asks the contract's
declarations (``task``, ``typed``, ``serving_needs``, ...) and never which class a model is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from graph_assets.schema import EdgeType
from model.architectures import NodeClassifier
from model.config import ModelConfig, Task
from model.registry import build_model
from model.served import UserNodeModel
from model.served.contract import served
from model.served_graph import UserGraphModel
from model.served_hetero import UserHeteroModel
from model.served_hetero_link import UserHeteroLinkModel
from model.served_link import UserLinkModel, method_of
from model.user_model import UserModelConfig

# The adapter that puts the user's class of a graph of one type behind the contract, per task.
_USER_ADAPTERS: dict[Task, type[UserNodeModel | UserLinkModel | UserGraphModel]] = {
    Task.NODE: UserNodeModel,
    Task.LINK: UserLinkModel,
    Task.GRAPH: UserGraphModel,
}


def served_preset(config: ModelConfig) -> torch.nn.Module:
    """The untrained preset ``config`` names (``model.registry.build_model``), checked to
    declare the contract."""
    model = build_model(config)
    served(model)
    return model


def served_user_model(module: torch.nn.Module, config: UserModelConfig) -> torch.nn.Module:
    """The adapter of the user's ``module`` (its weights loaded) for ``config``'s task, on a
    graph of one type or of several (``config.hetero``)."""
    adapter: torch.nn.Module
    if config.hetero is not None and config.task is Task.LINK:
        edge_type = EdgeType.parse(config.hetero["target_edge_type"]).triple
        adapter = UserHeteroLinkModel(
            module, edge_type, config.output, config.boundary_degrees, hops=config.num_layers
        )
    elif config.hetero is not None:
        adapter = UserHeteroModel(
            module,
            config.hetero["target"],
            config.output,
            config.boundary_degrees,
            embedding=config.embedding,
            hops=config.num_layers,
        )
    else:
        adapter = _USER_ADAPTERS[config.task](module, config)
    served(adapter)
    return adapter


@dataclass(frozen=True)
class OwnModel:
    """What a build compares a model's served answers with: its own calls on a whole graph,
    not the adapter's (``archive_build.verify``).

    Attributes:
        module: the user's class behind an adapter, the preset itself.
        forward: the call the model itself makes on a whole graph: the user's module (a link
            model's ``encode``), a typed user model's dict call, the preset.
        decode: a user's link model's ``decode(z, edge_label_index)`` (its answer checked by
            ``model.served_link.decoded_scores``); None: the preset's ``score``.
        ring_probe: ``forward`` takes ``(x, edge_index)`` of a graph of one type, so a small
            directed ring can show which layer reads out-neighbours (a user's class only).
    """

    module: torch.nn.Module
    forward: Callable[..., Any]
    decode: Callable[..., Any] | None
    ring_probe: bool


def own_model(model: torch.nn.Module) -> OwnModel:
    """``model``'s own calls (:class:`OwnModel`)."""
    if isinstance(model, UserLinkModel):
        return OwnModel(
            model.module, method_of(model.module, "encode"), method_of(model.module, "decode"), True
        )
    if isinstance(model, UserNodeModel | UserGraphModel):
        return OwnModel(model.module, model.module, None, True)
    if isinstance(model, UserHeteroModel):  # PyG's dict call on the module, the target's rows
        return OwnModel(model.module, model.forward, None, False)
    if isinstance(model, UserHeteroLinkModel):
        return OwnModel(model.module, model.encode, method_of(model.module, "decode"), False)
    return OwnModel(model, model, None, False)


def with_boundary_degrees(model: torch.nn.Module) -> torch.nn.Module | None:
    """A fresh adapter of the same user's module whose ego-graphs carry boundary degrees, for
    a user's model of one type whose build did not find it needs them; None otherwise."""
    if not isinstance(model, UserNodeModel | UserLinkModel) or model.config.boundary_degrees:
        return None
    config = dataclasses.replace(model.config, boundary_degrees=True)
    return type(model)(model.module, config).eval()


def preset_keys(model: torch.nn.Module, state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """A preset's weights as saved from the plain PyG model (``GraphSAGE(...).state_dict()``,
    no ``gnn.`` prefix) under the preset's own keys."""
    expected = model.state_dict()
    if set(state_dict) <= set(expected) or not isinstance(model, NodeClassifier):
        return dict(state_dict)
    prefixed = {f"gnn.{key}": value for key, value in state_dict.items()}
    return prefixed if set(prefixed) <= set(expected) else dict(state_dict)
