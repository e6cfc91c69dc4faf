"""Link prediction: the served link-model protocol, and the preset, a node-level GNN encoder
and a pair decoder.

The protocol (:class:`LinkModel`) is what the link engine, its explanations and the candidate
embeddings ask of a link model, whoever wrote it: ``forward(x, edge_index, degree=None,
level_sizes=None, edge_attr=None)`` encodes an ego-graph (or the whole graph) into one
embedding per row, the node protocol's keywords (``model.served``); ``score(z_src, z_dst)``
scores pairs of embeddings and ``score_against(z_src, table)`` one node against every row of a
table. :class:`LinkPredictor` implements it; the user's GAE-style class gets it from
``model.served_link.UserLinkModel``. What a score is follows the model's
``serving_needs.output``: ``logits`` (the presets) are served as ``sigmoid(logit)``,
``probabilities`` and ``raw`` as they are (:func:`answer_scores`).

``LinkPredictor.forward`` returns the encoder's last layer (``out_dim`` wide, no activation):
that is the node's embedding, the same thing the decoder consumes. Both decoders are symmetric
in the pair, so a score says "these two nodes are linked" whatever the edge's direction. The
encoder is the node classifier of the same architecture (``model.architectures``), so its
exactness on ego-graphs (GCN's full-graph degrees included) carries over unchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor
from torch_geometric.nn.models import MLP

from model.architectures import NodeClassifier, build_node_classifier
from model.config import Decoder, ModelConfig, Task
from model.served.contract import OneNodeType, Plan, ServedModel, ServingNeeds
from model.user_model import Output

# Rows of the candidate table scored at once by ``score_against``: bounds the temporaries of
# the MLP decoder (rows x hidden floats) on a large graph.
SCORE_CHUNK_ROWS = 65_536


@runtime_checkable
class LinkModel(Protocol):
    """The served link-model protocol (see the module docstring)."""

    @property
    def decoder_name(self) -> str:
        """What describe reports as the archive's decoder."""
        ...

    def __call__(
        self,
        x: Tensor,
        edge_index: Tensor,
        degree: Tensor | None = None,
        level_sizes: Sequence[int] | None = None,
        edge_attr: Tensor | None = None,
    ) -> Tensor: ...

    def score(self, z_src: Tensor, z_dst: Tensor) -> Tensor: ...

    def score_against(self, z_src: Tensor, table: Tensor) -> Tensor: ...


def answer_scores(scores: Tensor, output: Output) -> Tensor:
    """Pair scores as answers carry them: ``sigmoid`` of logits, anything else as it is."""
    scores = scores.float()
    return torch.sigmoid(scores) if output is Output.LOGITS else scores


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


class RowEmbedding(torch.nn.Module):
    """A link model whose node embedding is its row (the presets' and the user's ``encode``):
    ``forward_with_embedding`` answers ``(z, z)``."""

    def forward_with_embedding(
        self,
        x: Tensor,
        edge_index: Tensor,
        degree: Tensor | None = None,
        edge_attr: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """A node's embedding is its row: ``(z, z)``."""
        z = self(x, edge_index, degree=degree, edge_attr=edge_attr)
        return z, z


class LinkPredictor(OneNodeType, RowEmbedding):
    """Encoder (``encoder.gnn.*`` in the state_dict) and decoder (``decoder.*``)."""

    task = Task.LINK
    serving_needs = ServingNeeds()
    has_embedding = True

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if config.task is not Task.LINK:
            raise ValueError(f"LinkPredictor needs a config with task 'link', got {config.task}")
        self.encoder: NodeClassifier = build_node_classifier(
            dataclasses.replace(config, task=Task.NODE)
        )
        self.decoder = build_decoder(config)

    @property
    def decoder_name(self) -> str:
        return type(self.decoder).__name__

    @property
    def hops(self) -> int:
        return self.encoder.hops

    def forward(
        self,
        x: Tensor,
        edge_index: Tensor,
        degree: Tensor | None = None,
        level_sizes: Sequence[int] | None = None,
        edge_attr: Tensor | None = None,
    ) -> Tensor:
        """Node embeddings ``[num_rows, out_dim]``; the keywords as for the node classifiers
        (only the seeds' rows when ``level_sizes`` trims)."""
        return self.encoder(
            x, edge_index, degree=degree, level_sizes=level_sizes, edge_attr=edge_attr
        )

    def precompute_plan(self) -> Plan:
        """The encoder's per-layer rows."""
        return self.encoder.precompute_plan()

    def rows_of(self, node_type: str) -> ServedModel:
        raise ValueError("the LinkPredictor preset reads a graph of one node type")

    def score(self, z_src: Tensor, z_dst: Tensor) -> Tensor:
        """Logits of pairs: row ``i`` of ``z_src`` with row ``i`` of ``z_dst``."""
        return self.decoder(z_src, z_dst)

    def score_against(self, z_src: Tensor, table: Tensor) -> Tensor:
        """Logits of one node (``z_src``, ``[out_dim]``) against every row of ``table``."""
        return decode_against(self.decoder, z_src, table)


def build_decoder(config: ModelConfig) -> torch.nn.Module:
    """The config's pair decoder over ``out_dim``-wide embeddings."""
    if config.decoder is Decoder.DOT:
        return DotDecoder()
    return MLPDecoder(config.out_dim, config.hidden_dim, config.dropout)


def decode_against(decoder: torch.nn.Module, z_src: Tensor, table: Tensor) -> Tensor:
    """``decoder``'s logits of one embedding (``z_src``, ``[D]``) against every row of
    ``table``, in chunks of ``SCORE_CHUNK_ROWS`` rows; the dot decoder is one matrix-vector
    product per chunk."""
    if isinstance(decoder, DotDecoder):
        return by_chunks(z_src, table, lambda chunk: chunk @ z_src)
    return by_chunks(z_src, table, lambda chunk: decoder(z_src.expand_as(chunk), chunk))


def by_chunks(z_src: Tensor, table: Tensor, score: Callable[[Tensor], Tensor]) -> Tensor:
    """``score`` of every chunk of ``SCORE_CHUNK_ROWS`` rows of ``table`` (on ``z_src``'s device
    and dtype), concatenated: one node against a whole table without a table-sized product."""
    parts = []
    for start in range(0, table.shape[0], SCORE_CHUNK_ROWS):
        parts.append(score(table[start : start + SCORE_CHUNK_ROWS].to(z_src.device, z_src.dtype)))
    if not parts:
        return z_src.new_empty(0)
    return torch.cat(parts)


class PairLogit(torch.nn.Module):
    """``(x, edge_index, pair, degree, level_sizes, edge_attr) -> scores of the pairs``: one
    module for the explainer, over any :class:`LinkModel`.

    ``pair`` is ``[2, P]`` rows of ``x``; the explainer attributes the pair's score (the logit,
    for a model whose scores are logits) to the ego-graph's features and edges. The keywords
    come in the protocol's order: Captum hands them on by position.
    """

    def __init__(self, predictor: LinkModel) -> None:
        super().__init__()
        self.predictor = predictor

    def forward(
        self,
        x: Tensor,
        edge_index: Tensor,
        pair: Tensor,
        degree: Tensor | None = None,
        level_sizes: Sequence[int] | None = None,
        edge_attr: Tensor | None = None,
    ) -> Tensor:
        edges: dict[str, Any] = {} if edge_attr is None else {"edge_attr": edge_attr}
        z = self.predictor(x, edge_index, degree=degree, level_sizes=level_sizes, **edges)
        return self.predictor.score(z[pair[0]], z[pair[1]])
