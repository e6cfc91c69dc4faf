"""The user's graph-level model behind the served graph-model protocol
(``model.graph_level.GraphModel``).

A graph model of your own has PyG's graph-level forward, ``forward(x, edge_index, batch[,
edge_attr | edge_weight])`` returning one row per graph (``batch`` as
``torch_geometric.data.Batch.batch``). Where the dataset has edge features and the forward takes
them (the rule of node archives, ``model.served.choose_edge_input``), each inline graph's
``edge_attr`` is passed on; otherwise an ``edge_attr`` parameter must have a default. The graph
embedding (``return_embedding``) is what the method named by ``--embedding-method`` returns
(called with the forward's arguments), else the input of the last Linear layer the forward
calls when that input has one row per graph (the build's probe checks it: the vector a
classifier head reads), else there is none and ``return_embedding`` is refused.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch_geometric.nn import Linear as PygLinear
from torch_geometric.nn import MessagePassing

from model.graph_level import GraphModule, batch_or_one
from model.served import UserAdapter, edge_kwargs
from model.served.capture import with_input_of
from model.served.contract import ServingNeeds
from model.user_model import EdgeInput, UserModelConfig

_LINEAR = (torch.nn.Linear, PygLinear)
_METHOD = "method:"


class UserGraphModel(UserAdapter, GraphModule):
    """The user's graph-level module behind the graph protocol (its weights under
    ``module.``)."""

    def __init__(self, module: torch.nn.Module, config: UserModelConfig) -> None:
        super().__init__(module, config)
        self.has_embedding = bool(config.embedding)
        self.serving_needs = ServingNeeds(output=config.output, edge_input=config.edge_input)

    @property
    def in_dim(self) -> int:
        return self.config.in_dim

    @property
    def edge_dim(self) -> int:
        return 0 if self.config.edge_input is EdgeInput.NONE else self.config.edge_dim

    def forward(
        self,
        x: Tensor,
        edge_index: Tensor,
        batch: Tensor | None = None,
        edge_attr: Tensor | None = None,
    ) -> Tensor:
        """The module's rows, one per graph of ``batch`` (None: one graph); ``edge_attr`` goes
        to the module as its forward takes it (``edge_attr`` or ``edge_weight``)."""
        batch = batch_or_one(x, batch)
        rows = self.module(x, edge_index, batch, **edge_kwargs(self.config.edge_input, edge_attr))
        graphs = int(batch.max()) + 1 if batch.numel() else 0
        if not isinstance(rows, Tensor) or rows.dim() != 2 or rows.size(0) != graphs:
            raise ValueError(
                f"{type(self.module).__name__}.forward must return one row per graph, a "
                f"[{graphs}, C] tensor; it returned {shape_of(rows)}"
            )
        return rows

    def forward_with_embedding(
        self,
        x: Tensor,
        edge_index: Tensor,
        batch: Tensor | None = None,
        edge_attr: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """The rows and the graph embeddings of one pass (a named method is a second call,
        with the forward's arguments); None when the model names no embedding."""
        name = self.config.embedding
        if not name:
            return self(x, edge_index, batch, edge_attr), None
        if batch is None:
            batch = torch.zeros(x.size(0), dtype=torch.long, device=x.device)
        if name.startswith(_METHOD):
            method = getattr(self.module, name.removeprefix(_METHOD))
            kwargs = edge_kwargs(self.config.edge_input, edge_attr)
            return self(x, edge_index, batch, edge_attr), method(x, edge_index, batch, **kwargs)
        layer = self.module.get_submodule(name)
        return with_input_of(layer, lambda: self(x, edge_index, batch, edge_attr))


@dataclass(frozen=True)
class GraphProbe:
    """What one forward of the module on two small graphs shows about it."""

    steps: int  # message-passing steps along the forward (propagate calls)
    out_dim: int
    last_linear: str  # the last Linear layer called, when its input is one row per graph


def check_graph_forward(module: torch.nn.Module, edge_input: EdgeInput = EdgeInput.NONE) -> None:
    """Refuses, in one line, a forward that cannot take ``(x, edge_index, batch)`` plus the
    edge keyword ``edge_input`` names (none by default)."""
    name = type(module).__name__
    parameters = list(inspect.signature(module.forward).parameters.values())
    positional = [
        p
        for p in parameters
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    varargs = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters)
    if len(positional) < 3 and not varargs:
        raise ValueError(
            f"{name}.forward takes {len(positional)} argument(s); a graph model's forward is "
            "forward(x, edge_index, batch) returning one row per graph"
        )
    required = [
        p.name
        for p in positional[3:]
        if p.default is inspect.Parameter.empty
        and p.kind is not inspect.Parameter.VAR_KEYWORD
        and p.name != edge_input.value
    ]
    if required:
        given = "x, edge_index and edge_attr (where the dataset has edge features)"
        raise ValueError(
            f"{name}.forward requires {', '.join(required)}: inline graphs carry {given}, so "
            f"give {required[0]} a default (e.g. {required[0]}=None)"
        )


def probe_graph(
    module: torch.nn.Module,
    in_dim: int,
    embedding_method: str | None,
    edge_dim: int = 0,
    edge_input: EdgeInput = EdgeInput.NONE,
) -> GraphProbe:
    """Runs the module once on two small graphs batched together (5 and 7 nodes, ``edge_dim``
    random edge features passed as ``edge_input`` says), counting message-passing steps,
    checking one row per graph, and noting the last Linear layer called with one row per graph
    (``embedding_method``, if named, must return one row per graph)."""
    check_graph_forward(module, edge_input)
    name = type(module).__name__
    steps: list[str] = []
    linear_inputs: list[tuple[str, int]] = []
    names = {id(sub): sub_name for sub_name, sub in module.named_modules()}
    handles = []
    for sub in module.modules():
        sub_name = names[id(sub)]
        if isinstance(sub, MessagePassing):
            handles.append(
                sub.register_propagate_forward_hook(
                    lambda _m, _i, _o, sub_name=sub_name: steps.append(sub_name)
                )
            )
        if isinstance(sub, _LINEAR):

            def keep(_m: torch.nn.Module, args: tuple[Any, ...], sub_name: str = sub_name) -> None:
                if args and isinstance(args[0], Tensor):
                    linear_inputs.append((sub_name, int(args[0].size(0))))

            handles.append(sub.register_forward_pre_hook(keep))
    x, edge_index, batch = _two_graphs(in_dim)
    generator = torch.Generator().manual_seed(1)
    edge_attr = torch.rand(edge_index.size(1), edge_dim, generator=generator)
    kwargs = edge_kwargs(edge_input, edge_attr if edge_dim else None)
    try:
        rows = _call(module, "forward", x, edge_index, batch, kwargs)
    finally:
        for handle in handles:
            handle.remove()
    if not isinstance(rows, Tensor) or rows.dim() != 2 or rows.size(0) != 2:
        raise ValueError(
            f"{name}.forward must return one row per graph ([num_graphs, C]); on two graphs it "
            f"returned {shape_of(rows)}"
        )
    if embedding_method:
        embedding = _call(module, embedding_method, x, edge_index, batch, kwargs)
        if not isinstance(embedding, Tensor) or embedding.dim() != 2 or embedding.size(0) != 2:
            raise ValueError(
                f"--embedding-method {embedding_method}: {name}.{embedding_method} must return "
                f"one row per graph ([num_graphs, D]); on two graphs it returned "
                f"{shape_of(embedding)}"
            )
    last_name, last_rows = linear_inputs[-1] if linear_inputs else ("", 0)
    return GraphProbe(
        steps=len(steps), out_dim=int(rows.size(1)), last_linear=last_name if last_rows == 2 else ""
    )


def _call(
    module: torch.nn.Module,
    method: str,
    x: Tensor,
    edge_index: Tensor,
    batch: Tensor,
    kwargs: dict[str, Any],
) -> Any:
    """``module.<method>(x, edge_index, batch, **kwargs)`` on the probe's graphs; a failure in
    one line."""
    try:
        with torch.no_grad():
            call = module if method == "forward" else getattr(module, method)
            return call(x, edge_index, batch, **kwargs)
    except Exception as error:
        edges = "".join(f", {name}" for name in kwargs)
        raise ValueError(
            f"{type(module).__name__}.{method}(x, edge_index, batch{edges}) failed on two small "
            f"graphs with {x.size(1)} node features: {type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else ''}"
        ) from None


def _two_graphs(in_dim: int) -> tuple[Tensor, Tensor, Tensor]:
    """A 5-cycle and a 7-cycle with a chord, both directions, as one batch."""
    generator = torch.Generator().manual_seed(0)
    edges = [(i, (i + 1) % 5) for i in range(5)] + [(5 + i, 5 + (i + 1) % 7) for i in range(7)]
    edges.append((5, 8))
    pairs = torch.tensor(edges).t()
    edge_index = torch.cat([pairs, pairs.flip(0)], dim=1)
    x = torch.randn(12, in_dim, generator=generator)
    batch = torch.tensor([0] * 5 + [1] * 7)
    return x, edge_index, batch


def shape_of(value: object) -> str:
    if isinstance(value, Tensor):
        return f"a tensor of shape {list(value.shape)}"
    return f"a {type(value).__name__}"
