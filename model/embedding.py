"""Node embeddings served next to predictions: what each architecture's embedding is.

- Node classifiers (GCN, GraphSAGE, GAT, GIN): the input of the last message-passing layer,
  i.e. the output of layer ``L-1`` after its ReLU (``hidden_dim`` wide; for GAT the
  concatenated heads). The last layer is the classifier: it maps this representation, and its
  neighbours', to class logits. With one layer it is the input features.
- Link predictors: the encoder's output, the vector the decoder scores (``out_dim`` wide).
- Graph classifiers: ``GraphClassifier.forward_with_embedding`` (the pooled graph vector).

Captured from the same forward pass that gives the prediction (a forward pre-hook on the last
layer), so an embedding always belongs to the answer it comes with.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from model.architectures import NodeClassifier
from model.link import LinkPredictor


def forward_with_embedding(
    model: torch.nn.Module, x: Tensor, edge_index: Tensor, degree: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """``(output, embedding)`` per row of ``x`` from one forward pass of a node-level model."""
    if isinstance(model, LinkPredictor):
        z = model(x, edge_index, degree=degree)
        return z, z
    if not isinstance(model, NodeClassifier):
        raise TypeError(f"no node embedding is defined for {type(model).__name__}")
    captured: list[Tensor] = []

    def keep_input(_module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        captured.append(args[0])

    handle = model.gnn.convs[-1].register_forward_pre_hook(keep_input)
    try:
        output = model(x, edge_index, degree=degree)
    finally:
        handle.remove()
    return output, captured[-1]
