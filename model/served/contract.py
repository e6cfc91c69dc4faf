"""The one served-model contract: everything serving asks of a model, whoever wrote it.

Every model a worker, a build or a verification serves is built by the one factory
(``model.served.factory``: ``served_preset``, ``served_user_model``; ``model.export.load_model``
calls it) and declares what the engines need as attributes, as PyG's ``BasicGNN`` declares
``supports_edge_attr``: which task it answers, whether it reads a graph of several node types
(``typed``), what the ego-graph must carry (``serving_needs``), its hops, whether it has
embedding rows and how its rows are precomputed. The engines read those declarations and
never ask which class a model is or reach inside one; only the factory knows the classes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol, cast, runtime_checkable

import torch
from torch import Tensor

from model.config import Task
from model.user_model import EdgeInput, Output


class OneNodeType:
    """The contract's declarations of a model that reads a graph of one node type: not
    typed, no target type, no relation."""

    typed = False
    target = ""
    edge_type = None


class SeveralNodeTypes:
    """The contract's declarations of a model that reads a graph of several node types or
    relations (typed)."""

    typed = True

    @property
    def model_name(self) -> str:
        """The class the build and the logs name (the user's, not its adapter)."""
        return type(self).__name__


@dataclass(frozen=True)
class ServingNeeds:
    """What a served model asks of the ego-graph, and what its rows are.

    ``out_degrees``: the ego-graph's ``degree`` is each row's full-graph out-degree (ChebConv's
    Laplacian, ``model.chebconv``), not its in-degree (GCN); ``largest_degree``: the model is
    told the graph version's largest out-degree before each forward (its ``largest_degree``).
    """

    output: Output = Output.LOGITS
    edge_input: EdgeInput = EdgeInput.NONE
    boundary_degrees: bool = False
    out_degrees: bool = False
    largest_degree: bool = False


class Mode(str, Enum):
    """What a precomputed archive stores: every layer's rows, or every node's output."""

    LAYERS = "layers"
    OUTPUT = "output"


class LayerStack(Protocol):
    """Layers run one at a time over the whole graph (``NodeClassifier.layer``, the one rule
    of a ``BasicGNN`` layer's rows, ``model.trimmed.gnn_layer``)."""

    def parameters(self, recurse: bool = True) -> Iterator[torch.nn.Parameter]: ...

    def layer(
        self,
        index: int,
        x: Tensor,
        edge_index: Tensor,
        rows: int,
        degree: Tensor | None = None,
        edge_attr: Tensor | None = None,
    ) -> Tensor: ...


@dataclass(frozen=True, eq=False)
class Plan:
    """How a model's rows are precomputed and kept current (``model.precompute``).

    Attributes:
        mode: per-layer rows or every node's output.
        reason: why, as the build prints it.
        hops: layers mode: the layers stored; output mode: the model's hops, how far
            downstream an update reaches.
        stack: layers mode: the layers; None in output mode.
        degree: a node's degree is part of what its out-edges carry (GCN's normalisation, a
            user's degree-normalising layers): a changed in-list reaches its out-neighbours
            too; the GCN preset's layers read full-graph degrees.
        edge_attr: the layers read their in-edges' features (by edge ID).
        stored_embedding: a node's embedding is its layer ``L-1`` row (the input of the last
            layer); otherwise it is computed from the node's in-neighbourhood.
        types: on a typed graph, the node types whose rows are stored (a node model's target,
            a link model's two ends); empty: the graph's one type.
    """

    mode: Mode
    reason: str
    hops: int
    stack: LayerStack | None = None
    degree: bool = False
    edge_attr: bool = False
    stored_embedding: bool = False
    types: tuple[str, ...] = ()

    @property
    def arrays(self) -> int:
        """Row arrays stored: one per layer, or the one output."""
        return self.hops if self.mode is Mode.LAYERS else 1


@runtime_checkable
class ServedModel(Protocol):
    """What serving asks of a model (every preset and every adapter of a user's class).

    The forward depends on the inputs declared: on a graph of one type
    ``forward(x, edge_index, degree=None, level_sizes=None, edge_attr=None[, hop_edges])`` ->
    one row per node (``link``: one embedding per node), on a graph of several node types
    (``typed``) ``forward(HeteroInput)`` -> rows of ``target`` (``model.typed_batch``), and for
    ``graph`` ``forward(x, edge_index, batch=None, edge_attr=None)`` -> one row per graph. The
    link task adds ``score``/``score_against``/``decoder_name`` (``model.link.LinkModel``);
    the graph task ``in_dim``/``edge_dim`` (``model.graph_level.GraphModel``).
    """

    @property
    def task(self) -> Task:
        """What it answers: node rows, link scores or graph rows."""
        ...

    @property
    def typed(self) -> bool:
        """It reads a graph of several node types: a ``HeteroInput`` (PyG's dicts)."""
        ...

    @property
    def target(self) -> str:
        """The node type it answers for (a typed node model); "" otherwise: the graph's one
        type, or the link model's relation ends."""
        ...

    @property
    def edge_type(self) -> tuple[str, str, str] | None:
        """The relation a typed link model predicts; None for any other model."""
        ...

    @property
    def serving_needs(self) -> ServingNeeds:
        """What the ego-graph must carry and what the rows are."""
        ...

    @property
    def hops(self) -> int:
        """Its receptive field: the ego-graph's depth (graph task: message-passing steps)."""
        ...

    @property
    def has_embedding(self) -> bool:
        """:meth:`forward_with_embedding` gives embedding rows (``return_embedding``)."""
        ...

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

    def parameters(self, recurse: bool = True) -> Iterator[torch.nn.Parameter]:
        """A served model is a ``torch.nn.Module``: its parameters say its device."""
        ...

    def forward_with_embedding(self, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor | None]:
        """The rows and their embeddings of one forward pass, from the forward's inputs."""
        ...

    def precompute_plan(self) -> Plan | None:
        """How its rows are precomputed; None where they are not (graph models)."""
        ...

    def rows_of(self, node_type: str) -> ServedModel:
        """The typed node model computing ``node_type``'s rows: a node model itself for its
        target, a link model's ``encode`` rows of one end (ValueError for anything else)."""
        ...


# Classes whose instances were found to declare the contract: a runtime Protocol check reads
# every declaration (~35 us), which a request's parse should not pay each time.
_DECLARING: set[type] = set()


def served(model: torch.nn.Module) -> ServedModel:
    """``model`` as the contract sees it; TypeError, naming the class, for a module that does
    not declare the contract (build it with ``model.served.factory``)."""
    kind = type(model)
    if kind not in _DECLARING:
        if not isinstance(model, ServedModel):
            raise TypeError(
                f"{kind.__name__} does not declare the served-model contract "
                "(model.served.contract.ServedModel); build it with model.served.factory"
            )
        _DECLARING.add(kind)
    return cast(ServedModel, model)
