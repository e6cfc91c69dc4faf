"""Node embeddings served next to predictions: what each architecture's embedding is.

- Node classifiers (GCN, GraphSAGE, GAT, GIN, and the user's own class): the input of the last
  message-passing layer the forward calls (or what the method named by ``--embedding-method``
  returns),
  i.e. the output of layer ``L-1`` after its ReLU (``hidden_dim`` wide; for GAT the
  concatenated heads). The last layer is the classifier: it maps this representation, and its
  neighbours', to class logits. With one layer it is the input features.
- Link models: the encoder's output, the vector the decoder scores (``out_dim`` wide; the
  user's ``encode``).
- Graph models: ``forward_with_embedding`` (the preset's pooled graph vector; for the user's
  class what ``--embedding-method`` returns, else the input of the last Linear layer,
  ``model.served_graph``).

Captured from the same forward pass that gives the prediction (a forward pre-hook on the last
layer), so an embedding always belongs to the answer it comes with.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from model.architectures import NodeClassifier
from model.link import LinkModel
from model.served import UserNodeModel, edge_kwargs
from model.served_hetero import HeteroNodeModel


def has_embedding(model: torch.nn.Module) -> bool:
    """Whether the model defines a node embedding (``return_embedding``): the user's class
    only when its build found a message-passing layer or was given ``--embedding-method``
    (a typed one: an embedding submodule); every preset does."""
    if isinstance(model, UserNodeModel):
        return bool(model.config.embedding)
    if isinstance(model, HeteroNodeModel):
        return model.has_embedding
    return True


def forward_with_embedding(
    model: torch.nn.Module,
    x: Tensor,
    edge_index: Tensor,
    degree: Tensor | None = None,
    edge_attr: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """``(output, embedding)`` per row of ``x`` from one forward pass of a node-level model
    (``edge_attr``: the edges' features, for a model that reads them)."""
    if isinstance(model, LinkModel):
        z = model(x, edge_index, degree=degree, edge_attr=edge_attr)
        return z, z
    if isinstance(model, UserNodeModel):
        layer = model.embedding_module()
        if layer is None:  # a method the user named
            method = getattr(model.module, model.config.embedding.removeprefix("method:"))
            extra = edge_kwargs(model.config.edge_input, edge_attr)
            output = model(x, edge_index, degree=degree, edge_attr=edge_attr)
            with model.graph_degrees(degree):
                return output, method(x, edge_index, **extra)
        return with_input_of(
            layer, lambda: model(x, edge_index, degree=degree, edge_attr=edge_attr)
        )
    if not isinstance(model, NodeClassifier):
        raise TypeError(f"no node embedding is defined for {type(model).__name__}")
    return with_input_of(model.gnn.convs[-1], lambda: model(x, edge_index, degree=degree))


def with_input_of(layer: torch.nn.Module, forward: Any) -> tuple[Tensor, Tensor]:
    """``forward()``'s output and the input of ``layer``'s last call in it (the destination
    rows of a bipartite call)."""
    captured: list[Tensor] = []

    def keep_input(_module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        value = args[0] if args else kwargs["x"]
        captured.append(value[1] if isinstance(value, tuple) else value)

    handle = layer.register_forward_pre_hook(keep_input, with_kwargs=True)
    try:
        output = forward()
    finally:
        handle.remove()
    return output, captured[-1]
