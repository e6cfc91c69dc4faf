"""The architecture config: the one home of model defaults, stored as ``model_config.json``.

Strings from JSON or the command line become Enums here, at the edge, and every value is
checked once, so a bad archive fails when it is built or loaded rather than mid-request.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from enum import Enum
from typing import Any, Self


class Setting(str, Enum):
    """A setting with named values: ``parse`` takes a member or its value in any case, and its
    error names the setting (:meth:`setting`) and lists the accepted values."""

    @classmethod
    def setting(cls) -> str:
        """The setting's name in errors: the class's, in lower case."""
        return cls.__name__.lower()

    @classmethod
    def parse(cls, value: object) -> Self:
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            try:
                return cls(value.strip().lower())
            except ValueError:
                pass
        allowed = ", ".join(repr(member.value) for member in cls)
        raise ValueError(f"{cls.setting()} must be one of {allowed}, got {value!r}")


class Task(Setting):
    """What the model predicts: a class per node, a score per node pair, a class per graph."""

    NODE = "node"
    LINK = "link"
    GRAPH = "graph"


class Arch(Setting):
    """The message-passing architecture; ``rgcn`` and ``hgt`` are relational recipes for a
    graph of several node types or relations."""

    GCN = "gcn"
    SAGE = "sage"
    GAT = "gat"
    GIN = "gin"
    RGCN = "rgcn"
    HGT = "hgt"


class Decoder(Setting):
    """How a link predictor scores a pair from the two node embeddings."""

    DOT = "dot"
    MLP = "mlp"


class Pooling(Setting):
    """How a graph classifier reduces its node representations to one vector per graph."""

    SUM = "sum"
    MEAN = "mean"
    MAX = "max"


# Keys that only one task reads; ``to_dict`` writes them only for that task.
_TASK_KEYS = {"decoder": Task.LINK, "pooling": Task.GRAPH}


@dataclass(kw_only=True)
class ModelConfig:
    """Everything ``build_model`` needs to rebuild the module that a ``model.pt`` belongs to.

    Attributes:
        task: what is predicted; ``node`` (default), ``link`` or ``graph``.
        arch: ``gcn``, ``sage``, ``gat`` or ``gin``; default ``sage``.
        in_dim: node feature width (the graph store's ``feature_dim``).
        hidden_dim: width of hidden layers, default 64; for GAT the total over heads, so it
            must be divisible by ``heads``.
        out_dim: number of classes (>= 2) for ``node`` and ``graph``; for ``link`` the width of
            the node embeddings the decoder scores.
        num_layers: message-passing layers = hops of the ego-graph the server samples; default 2.
        heads: GAT attention heads, default 4 (ignored by the other architectures).
        dropout: training-time dropout probability in ``[0, 1)``, default 0.5.
        decoder: ``link`` only: ``dot`` (default; score = <z_src, z_dst>) or ``mlp`` (an MLP on
            z_src * z_dst). Both are symmetric in the pair.
        pooling: ``graph`` only: ``sum`` (default, as in the GIN paper), ``mean`` or ``max``.
        hetero: a graph of several node types or relations: ``node_types``, ``edge_types``
            (``[src, relation, dst]`` triples), ``in_dims`` and ``num_nodes`` per type,
            ``edge_dims`` per relation (``src__relation__dst``) and ``target``, as
            ``model.typed_graph.hetero_section`` writes them from the store; the recipe is then
            the per-relation form of ``arch`` (``model.hetero_recipes``) and ``in_dim`` the
            target type's width; ``link`` adds ``target_edge_type`` (``src__relation__dst``,
            the relation predicted). None (default): a graph of one type.
    """

    task: Task = Task.NODE
    arch: Arch = Arch.SAGE
    in_dim: int
    hidden_dim: int = 64
    out_dim: int
    num_layers: int = 2
    heads: int = 4
    dropout: float = 0.5
    decoder: Decoder = Decoder.DOT
    pooling: Pooling = Pooling.SUM
    hetero: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.task = Task.parse(self.task)
        self.arch = Arch.parse(self.arch)
        self.decoder = Decoder.parse(self.decoder)
        self.pooling = Pooling.parse(self.pooling)
        self.in_dim = _check_int("in_dim", self.in_dim, minimum=0 if self.hetero else 1)
        if self.arch in (Arch.RGCN, Arch.HGT) and self.hetero is None:
            raise ValueError(
                f"arch {self.arch.value!r} is a relational recipe for a graph of several node "
                "types or relations; this graph has one (use gcn, sage, gat or gin)"
            )
        if self.hetero is not None:
            check_hetero_task(self.task, self.hetero)
        self.out_dim = _check_int("out_dim", self.out_dim, minimum=2)
        self.hidden_dim = _check_int("hidden_dim", self.hidden_dim, minimum=1)
        self.num_layers = _check_int("num_layers", self.num_layers, minimum=1)
        self.heads = _check_int("heads", self.heads, minimum=1)
        # NaN fails the range test too.
        if (
            isinstance(self.dropout, bool)
            or not isinstance(self.dropout, numbers.Real)
            or not 0.0 <= self.dropout < 1.0
        ):
            raise ValueError(
                f"dropout must be a number in [0, 1), got {self.dropout!r}; for example dropout=0.5"
            )
        self.dropout = float(self.dropout)
        if self.arch is Arch.GAT and self.hidden_dim % self.heads != 0:
            raise ValueError(
                f"hidden_dim must be divisible by heads for arch 'gat' (the heads split the "
                f"hidden width), got hidden_dim={self.hidden_dim} and heads={self.heads}; "
                f"for example hidden_dim={self.heads * max(1, round(self.hidden_dim / self.heads))}"
            )

    def to_dict(self) -> dict[str, Any]:
        """The JSON form written as ``model_config.json``: plain strings and numbers."""
        data = asdict(self)
        for key, value in data.items():
            if isinstance(value, Enum):
                data[key] = value.value
        for key, task in _TASK_KEYS.items():
            if self.task is not task:
                del data[key]
        if self.hetero is None:
            del data["hetero"]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelConfig:
        """Validates a ``model_config.json`` dict; missing optional keys take the defaults."""
        if not isinstance(data, Mapping):
            raise ValueError(
                f"a model config must be a JSON object, got {type(data).__name__}; "
                'for example {"arch": "sage", "in_dim": 128, "out_dim": 8}'
            )
        known = {field.name for field in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(
                f"unknown model config key(s) {unknown}; the accepted keys are {sorted(known)}"
            )
        missing = [name for name in ("in_dim", "out_dim") if name not in data]
        if missing:
            raise ValueError(
                f"model config is missing {missing}: in_dim is the feature width and out_dim "
                "the number of classes of the graph"
            )
        return cls(**data)


def check_hetero_task(task: Task, hetero: Mapping[str, Any]) -> None:
    """A graph of several node types serves ``node`` and, for a relation named by
    ``target_edge_type`` (one of its ``edge_types``), ``link``; ValueError otherwise."""
    if task is Task.GRAPH:
        raise ValueError(
            "a graph of several node types or relations is served for --task node or link; "
            "graph classification of typed graphs is not available yet"
        )
    name = hetero.get("target_edge_type")
    relations = ["__".join(triple) for triple in hetero.get("edge_types", [])]
    if task is Task.LINK and name not in relations:
        raise ValueError(
            f"a link model of a graph of several node types predicts one of its relations: "
            f"target_edge_type must be one of {', '.join(relations)}, got {name!r}"
        )
    if task is Task.NODE and name is not None:
        raise ValueError("target_edge_type goes with task 'link'; a node model has none")


def _check_int(name: str, value: object, *, minimum: int) -> int:
    """Accepts any integer type (a numpy int from a store's metadata too), returns a plain int."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)
