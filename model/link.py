"""Link prediction: a node-level GNN encoder and a pair decoder.

``LinkPredictor.forward(x, edge_index, degree=None)`` returns one embedding per node (the
encoder's last layer, ``out_dim`` wide, no activation): that is the node's embedding, the same
thing the decoder consumes. ``score(z_src, z_dst)`` turns pairs of embeddings into logits and
``sigmoid(logit)`` is the served score. Both decoders are symmetric in the pair, so a score
says "these two nodes are linked" whatever the edge's direction.

The encoder is the node classifier of the same architecture (``model.architectures``), so its
exactness on ego-graphs (GCN's full-graph degrees included) carries over unchanged.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor
from torch_geometric.nn.models import MLP

from model.architectures import NodeClassifier, build_node_classifier
from model.config import Decoder, ModelConfig, Task

# Rows of the candidate table scored at once by ``score_against``: bounds the temporaries of
# the MLP decoder (rows x hidden floats) on a large graph.
SCORE_CHUNK_ROWS = 65_536


class DotDecoder(torch.nn.Module):
    """``<z_src, z_dst>``: no parameters; ranking by it is a maximum inner product search."""

    def forward(self, z_src: Tensor, z_dst: Tensor) -> Tensor:
        return (z_src * z_dst).sum(dim=-1)


class MLPDecoder(torch.nn.Module):
    """An MLP (Linear-ReLU-Linear) on the element-wise product ``z_src * z_dst``."""

    def __init__(self, embedding_dim: int, hidden_dim: int, dropout: float) -> None:
        super().__init__()
        self.mlp = MLP([embedding_dim, hidden_dim, 1], dropout=dropout, norm=None)

    def forward(self, z_src: Tensor, z_dst: Tensor) -> Tensor:
        return self.mlp(z_src * z_dst).squeeze(-1)


class LinkPredictor(torch.nn.Module):
    """Encoder (``encoder.gnn.*`` in the state_dict) and decoder (``decoder.*``)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if config.task is not Task.LINK:
            raise ValueError(f"LinkPredictor needs a config with task 'link', got {config.task}")
        self.encoder: NodeClassifier = build_node_classifier(
            dataclasses.replace(config, task=Task.NODE)
        )
        self.decoder: torch.nn.Module
        if config.decoder is Decoder.DOT:
            self.decoder = DotDecoder()
        else:
            self.decoder = MLPDecoder(config.out_dim, config.hidden_dim, config.dropout)

    def forward(self, x: Tensor, edge_index: Tensor, degree: Tensor | None = None) -> Tensor:
        """Node embeddings ``[num_rows, out_dim]``; ``degree`` as for the node classifiers."""
        return self.encoder(x, edge_index, degree=degree)

    def score(self, z_src: Tensor, z_dst: Tensor) -> Tensor:
        """Logits of pairs: row ``i`` of ``z_src`` with row ``i`` of ``z_dst``."""
        return self.decoder(z_src, z_dst)

    def score_against(self, z_src: Tensor, table: Tensor) -> Tensor:
        """Logits of one node (``z_src``, ``[out_dim]``) against every row of ``table``.

        Computed in chunks of ``SCORE_CHUNK_ROWS`` rows; the dot decoder is one matrix-vector
        product per chunk.
        """
        parts = []
        for start in range(0, table.shape[0], SCORE_CHUNK_ROWS):
            chunk = table[start : start + SCORE_CHUNK_ROWS].to(z_src.device, z_src.dtype)
            if isinstance(self.decoder, DotDecoder):
                parts.append(chunk @ z_src)
            else:
                parts.append(self.decoder(z_src.expand_as(chunk), chunk))
        if not parts:
            return z_src.new_empty(0)
        return torch.cat(parts)


class PairLogit(torch.nn.Module):
    """``(x, edge_index, pair, degree) -> logits of the pairs``: one module for the explainer.

    ``pair`` is ``[2, P]`` rows of ``x``; the explainer attributes the pair's logit to the
    ego-graph's features and edges.
    """

    def __init__(self, predictor: LinkPredictor) -> None:
        super().__init__()
        self.predictor = predictor

    def forward(
        self, x: Tensor, edge_index: Tensor, pair: Tensor, degree: Tensor | None = None
    ) -> Tensor:
        z = self.predictor(x, edge_index, degree=degree)
        return self.predictor.score(z[pair[0]], z[pair[1]])
