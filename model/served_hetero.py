"""The served-model protocol on heterogeneous graphs: ``forward(HeteroInput) -> rows`` of one
target node type, whoever wrote the model.

The recipes (``model.hetero_recipes``) implement it themselves; the user's module gets it from
:class:`UserHeteroModel`, which calls PyG's own signature, ``forward(x_dict, edge_index_dict)``
plus ``edge_attr_dict`` and ``n_id_dict`` where the module takes them, as
:class:`model.served.UserNodeModel` does on homogeneous graphs. :func:`answer_seeds` runs either
on a sampled ego-graph.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch_geometric.nn import MessagePassing
from torch_geometric.typing import EdgeType

from model.config import Task
from model.served import _SOURCE_DEGREE_LAYERS
from model.served.contract import Mode, Plan, ServedModel, ServingNeeds, SeveralNodeTypes
from model.typed_batch import HeteroInput, TypedLayout
from model.user_model import EdgeInput, Output


class HeteroNodeModel(SeveralNodeTypes, torch.nn.Module):
    """A model whose rows are those of :attr:`target`, the node type it answers for, within
    :attr:`hops` hops (the served-model contract's typed node model)."""

    task = Task.NODE
    edge_type = None
    target: str
    serving_needs: ServingNeeds
    hops: int

    def forward(self, inputs: HeteroInput) -> Tensor:
        """``[rows of the target type, C]``."""
        return self.forward_with_embedding(inputs)[0]

    def forward_with_embedding(self, inputs: HeteroInput) -> tuple[Tensor, Tensor]:
        """``(output, embedding)`` of the target type's rows from one forward pass."""
        raise NotImplementedError(f"{type(self).__name__} defines no node embedding")

    @property
    def has_embedding(self) -> bool:
        """Whether :meth:`forward_with_embedding` answers (``return_embedding``)."""
        return True

    def precompute_plan(self) -> Plan:
        """Every output of the target type, each from its whole in-neighbourhood."""
        return typed_plan(
            self.model_name,
            (self.target,),
            f"every {self.target} node's output",
            self.hops,
            self.serving_needs.boundary_degrees,
        )

    def rows_of(self, node_type: str) -> ServedModel:
        if node_type != self.target:
            raise ValueError(f"{self.model_name} answers for {self.target!r}, not {node_type!r}")
        return self


def typed_plan(name: str, types: tuple[str, ...], stored: str, hops: int, degree: bool) -> Plan:
    """Every output (a link model's: every ``encode`` embedding) of the node types answers
    read on a typed graph, each recomputed from its whole in-neighbourhood over every
    relation."""
    if hops < 1:
        raise ValueError(
            f"the hops of {name} must be given (its config's num_layers, >= 1); got {hops}"
        )
    return Plan(
        mode=Mode.OUTPUT,
        reason=(
            f"{stored}: {name} reads a graph of several node types; an update recomputes the "
            f"{' and '.join(types)} rows within {hops} hops downstream of what it changed "
            f"(over every relation), each from its whole {hops}-hop in-neighbourhood"
        ),
        hops=hops,
        degree=degree,
        types=types,
    )


def answer_seeds(
    model: ServedModel,
    layout: TypedLayout,
    features: Mapping[str, Tensor],
    n_id: Mapping[str, Tensor],
    edge_features: Mapping[EdgeType, Tensor],
    num_seeds: int,
    embedding: bool = False,
    hops: tuple[Sequence[int], Tensor] | None = None,
) -> tuple[Tensor, Tensor | None]:
    """The seeds' output rows (and embeddings with ``embedding``) on a sampled ego-graph.

    The seeds are its first ``num_seeds`` rows and all of ``model.target``: the target's rows
    are ascending, so they are its first positions. ``features``, ``n_id`` and
    ``edge_features`` as :meth:`TypedLayout.inputs` takes them; ``hops``, the ego-graph's
    ``(level_sizes, edge_index)``, lets a recipe compute each layer for the rows that need it
    only."""
    target_rows = layout.rows[model.target]
    if target_rows.numel() < num_seeds or (
        num_seeds and int(target_rows[num_seeds - 1]) != num_seeds - 1
    ):
        raise ValueError(
            f"the first {num_seeds} rows must be seeds of the model's target type "
            f"{model.target!r}; the ego-graph has {target_rows.numel()} rows of that type"
        )
    level_sizes, edge_index = hops if hops is not None else (None, None)
    inputs = layout.inputs(features, n_id, edge_features, level_sizes, edge_index)
    if not embedding:
        return model(inputs)[:num_seeds], None
    out, emb = model.forward_with_embedding(inputs)
    if emb is None:
        raise ValueError(f"the model answering for {model.target!r} has no embedding")
    return out[:num_seeds], emb[:num_seeds]


class DictCall:
    """How a user's method takes PyG's typed inputs: ``(x_dict, edge_index_dict)`` plus
    ``edge_attr_dict`` and ``n_id_dict`` where its signature names them; the one rule for every
    typed adapter (node and link)."""

    def __init__(self, method: Callable[..., Any]) -> None:
        parameters = inspect.signature(method).parameters
        self.method = method
        self.takes_edge_attr = "edge_attr_dict" in parameters
        self.takes_n_id = "n_id_dict" in parameters

    def __call__(self, inputs: HeteroInput) -> Any:
        kwargs: dict[str, Any] = {}
        if self.takes_edge_attr:
            kwargs["edge_attr_dict"] = inputs.edge_attr_dict
        if self.takes_n_id:
            kwargs["n_id_dict"] = inputs.n_id_dict
        return self.method(inputs.x_dict, inputs.edge_index_dict, **kwargs)

    def needs(
        self, module: torch.nn.Module, output: Output, boundary_degrees: bool | None
    ) -> ServingNeeds:
        """What the ego-graph must carry for it; ``boundary_degrees`` None: found in
        ``module`` (:func:`normalises_by_source_degree`)."""
        if boundary_degrees is None:
            boundary_degrees = normalises_by_source_degree(module)
        return ServingNeeds(
            output=output,
            edge_input=EdgeInput.EDGE_ATTR if self.takes_edge_attr else EdgeInput.NONE,
            boundary_degrees=boundary_degrees,
        )


class UserHeteroModel(HeteroNodeModel):
    """The user's heterogeneous module (its weights under ``module.``): PyG's
    ``forward(x_dict, edge_index_dict[, edge_attr_dict][, n_id_dict])`` returning a dict of
    per-type rows (``to_hetero(...)``, a ``HeteroConv`` stack) or the target's rows.

    Args:
        module: the user's module.
        target: the node type answered for.
        output: what its rows are (``model.user_model.Output``).
        boundary_degrees: the ego-graph must carry the deepest hop's in-degrees; None: True
            when the module holds a layer that normalises by its sources' degrees (GCNConv).
        embedding: name of a submodule whose first input holds the embedding (an ``x_dict``,
            the target's rows, or a relation into the target's ``(source, target)`` pair), or
            ``""`` for none.
        hops: its receptive field (the config's ``num_layers``); 0 while a build probes it.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        target: str,
        output: Output = Output.LOGITS,
        boundary_degrees: bool | None = None,
        embedding: str = "",
        hops: int = 0,
    ) -> None:
        super().__init__()
        self.module = module
        self.target = target
        self.hops = hops
        self._call = DictCall(module.forward)
        self.serving_needs = self._call.needs(module, output, boundary_degrees)
        self._embedding = module.get_submodule(embedding) if embedding else None

    def forward(self, inputs: HeteroInput) -> Tensor:
        """The target type's rows of the module's output."""
        out = self._call(inputs)
        rows = out.get(self.target) if isinstance(out, Mapping) else out
        count = inputs.n_id_dict[self.target].numel()
        if not isinstance(rows, Tensor) or rows.dim() != 2 or rows.size(0) != count:
            got = f"shape {list(rows.shape)}" if isinstance(rows, Tensor) else type(rows).__name__
            raise ValueError(
                f"{type(self.module).__name__}.forward must return a dict with a "
                f"[{count}, C] tensor for {self.target!r} (or that tensor); got {got}"
            )
        return rows

    @property
    def has_embedding(self) -> bool:
        return self._embedding is not None

    @property
    def model_name(self) -> str:
        return type(self.module).__name__

    def forward_with_embedding(self, inputs: HeteroInput) -> tuple[Tensor, Tensor]:
        """The output and the target's rows of the embedding submodule's input, captured in
        the same forward pass so that an embedding belongs to the answer it comes with."""
        if self._embedding is None:
            raise ValueError(f"no embedding submodule was named for {type(self.module).__name__}")
        captured: list[Any] = []

        def keep(_module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            captured.append(args[0] if args else next(iter(kwargs.values())))

        handle = self._embedding.register_forward_pre_hook(keep, with_kwargs=True)
        try:
            out = self(inputs)
        finally:
            handle.remove()
        value = captured[-1]
        if isinstance(value, tuple):  # a relation's (source, destination) rows
            value = value[1]
        emb = value.get(self.target) if isinstance(value, Mapping) else value
        if not isinstance(emb, Tensor) or emb.size(0) != out.size(0):
            raise ValueError(
                f"the input of the embedding submodule holds no rows of {self.target!r}"
            )
        return out, emb


def normalises_by_source_degree(module: torch.nn.Module) -> bool:
    """A layer in ``module`` weighs a message by its source's degree (GCNConv and the like,
    ``model.served``'s list), which an ego-graph's deepest hop truncates without a boundary."""
    for sub in module.modules():
        name = type(sub).__name__
        if name in _SOURCE_DEGREE_LAYERS and not (
            name == "GCNConv" and not getattr(sub, "normalize", True)
        ):
            return True
    return False


@dataclass(frozen=True)
class HeteroProbe:
    """What one forward of a user's heterogeneous module on a small typed graph shows."""

    steps: int  # message-passing depth: propagate calls per relation (or layers called)
    how: str  # how ``steps`` was counted, as the build prints it
    out_dim: int


def probe_hetero(
    module: torch.nn.Module,
    inputs: HeteroInput,
    run: Callable[[HeteroInput], Tensor],
    method: str = "forward",
) -> HeteroProbe:
    """Runs ``run`` (the adapter of ``module``: ``UserHeteroModel``, a link model's rows of
    one type) once on ``inputs``, counting ``module``'s message-passing steps: a per-relation
    layer (``to_hetero``, ``HeteroConv``: its path names the relation) adds one per call to its
    relation's count, and the depth is the largest count; a module without per-relation layers
    counts the layers it calls. ``method`` names the method run in the refusal."""
    # to_hetero names a relation's copy src__relation__dst, PyG's ModuleDict (HeteroConv)
    # <src___relation___dst>.
    spellings = {
        "__".join(edge_type): ("__".join(edge_type), "___".join(edge_type))
        for edge_type in inputs.edge_index_dict
    }
    keys = list(spellings)
    per_relation: dict[str, int] = dict.fromkeys(keys, 0)
    called: set[str] = set()
    handles = []
    for name, sub in module.named_modules():
        if isinstance(sub, MessagePassing):

            def count(_m: Any, _inputs: Any, _out: Any, name: str = name) -> None:
                called.add(name)
                for key, forms in spellings.items():
                    if any(form in name for form in forms):
                        per_relation[key] += 1

            handles.append(sub.register_propagate_forward_hook(count))
    try:
        with torch.no_grad():
            out = run(inputs)
    except Exception as error:
        raise ValueError(
            f"{type(module).__name__}.{method}(x_dict, edge_index_dict, ...) failed on a small "
            f"typed graph of this graph's types and relations: {type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else ''}"
        ) from None
    finally:
        for handle in handles:
            handle.remove()
    if max(per_relation.values(), default=0):
        steps = max(per_relation.values())
        how = f"{steps} calls of one relation's layers in one forward"
    else:
        steps = len(called)
        how = (
            f"{steps} message-passing layers called in one forward, an uncertain count (layers "
            "side by side count twice, a neighbour read outside MessagePassing not at all)"
        )
    return HeteroProbe(steps=steps, how=how, out_dim=int(out.size(1)))


def small_typed_input(
    node_types: Mapping[str, int], edge_types: Mapping[EdgeType, int], nodes: int = 6
) -> HeteroInput:
    """A small random typed graph: ``nodes`` nodes of each type (``node_types``: feature
    widths), each relation a ring between its types with edge features of its width."""
    generator = torch.Generator().manual_seed(0)
    ring = torch.arange(nodes)
    edge_index = torch.stack([ring, (ring + 1) % nodes])
    return HeteroInput(
        x_dict={
            t: torch.randn(nodes, width, generator=generator) for t, width in node_types.items()
        },
        edge_index_dict={e: edge_index for e in edge_types},
        n_id_dict={t: torch.arange(nodes) for t in node_types},
        edge_attr_dict={
            e: torch.rand(nodes, width, generator=generator)
            for e, width in edge_types.items()
            if width
        },
    )
