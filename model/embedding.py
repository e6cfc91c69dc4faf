"""Node embeddings served next to predictions: each served model's ``forward_with_embedding``
(``model.served.contract``) says what its embedding is.

- Node classifiers (GCN, GraphSAGE, GAT, GIN, and the user's own class): the input of the last
  message-passing layer the forward calls (or what the method named by ``--embedding-method``
  returns), i.e. the output of layer ``L-1`` after its ReLU (``hidden_dim`` wide; for GAT the
  concatenated heads). The last layer is the classifier: it maps this representation, and its
  neighbours', to class logits. With one layer it is the input features.
- Link models: the encoder's output, the vector the decoder scores (``out_dim`` wide; the
  user's ``encode``).
- Graph models: the preset's pooled graph vector; for the user's class what
  ``--embedding-method`` returns, else the input of the last Linear layer
  (``model.served_graph``).

Captured from the same forward pass that gives the prediction (:func:`with_input_of`, a
forward pre-hook on the layer), so an embedding always belongs to the answer it comes with.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


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
