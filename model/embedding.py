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

Captured from the same forward pass that gives the prediction
(``model.served.capture.with_input_of``, a forward pre-hook on the layer), so an embedding
always belongs to the answer it comes with.
"""

from __future__ import annotations

import torch
from torch import Tensor

from model.served.contract import served


def forward_with_embedding(
    model: torch.nn.Module,
    x: Tensor,
    edge_index: Tensor,
    degree: Tensor | None = None,
    edge_attr: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """``(output, embedding)`` per row of ``x`` from one forward pass of a node-level model of
    a graph of one type (the contract's ``forward_with_embedding``); ValueError for a model
    with none."""
    output, embedding = served(model).forward_with_embedding(x, edge_index, degree, edge_attr)
    if embedding is None:
        raise ValueError(f"no node embedding is defined for {type(model).__name__}")
    return output, embedding
