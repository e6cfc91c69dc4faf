"""Link prediction on one relation of a graph of several node types (recommendation: a user
buys an item): the served protocol, the recipes' predictor, and one type's rows of a link model
for an ego-graph.

:class:`HeteroLinkModel` is what the link engine, the stored embeddings and the build's
verification ask of such a model, whoever wrote it: ``encode(HeteroInput) -> z_dict`` with the
rows of the relation's source and destination types; ``score(z_src, z_dst)`` of pairs and
``score_against(z_src, table)`` of one source against rows of the destination type, as
``model.link.LinkModel`` on a graph of one type. :class:`HeteroLinkPredictor` is the recipes'
(a ``model.hetero_recipes`` encoder that outputs both ends, a dot or MLP decoder); the user's
class gets the protocol from ``model.served_hetero_link``.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch_geometric.typing import EdgeType

from graph_assets.schema import EdgeType as RelationName
from model.config import ModelConfig, Task
from model.hetero_recipes import HeteroRecipe, build_hetero_model
from model.link import build_decoder, decode_against
from model.served import ServingNeeds
from model.served_hetero import HeteroNodeModel
from model.typed_batch import HeteroInput
from model.typed_graph import hetero_spec


class HeteroLinkModel(torch.nn.Module):
    """The served protocol of a link model of a typed graph (see the module docstring).

    Attributes:
        edge_type: the relation predicted, ``(src, relation, dst)``; pairs are ``[src node,
            dst node]``.
        serving_needs: what its ego-graphs carry (edge features, boundary degrees) and what
            its scores are.
    """

    edge_type: EdgeType
    serving_needs: ServingNeeds

    @property
    def decoder_name(self) -> str:
        """What describe reports as the archive's decoder."""
        raise NotImplementedError

    def encode(self, inputs: HeteroInput) -> dict[str, Tensor]:
        """Embeddings of every row of the relation's source and destination types."""
        raise NotImplementedError

    def score(self, z_src: Tensor, z_dst: Tensor) -> Tensor:
        """Scores of pairs: row ``i`` of ``z_src`` with row ``i`` of ``z_dst``."""
        raise NotImplementedError

    def score_against(self, z_src: Tensor, table: Tensor) -> Tensor:
        """Scores of one source (``z_src``, ``[D]``) against every row of ``table``."""
        raise NotImplementedError


class HeteroLinkPredictor(HeteroLinkModel):
    """A recipe as encoder (``encoder.*`` in the state_dict) of both ends of
    ``hetero["target_edge_type"]`` and the config's decoder (``decoder.*``)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if config.task is not Task.LINK or config.hetero is None:
            raise ValueError("HeteroLinkPredictor needs a link config of a typed graph")
        spec = hetero_spec(config)
        self.encoder: HeteroRecipe = build_hetero_model(config.arch.value, spec)
        self.decoder = build_decoder(config)
        self.edge_type = RelationName.parse(config.hetero["target_edge_type"]).triple
        self.serving_needs = self.encoder.serving_needs

    @property
    def decoder_name(self) -> str:
        return type(self.decoder).__name__

    def encode(self, inputs: HeteroInput) -> dict[str, Tensor]:
        return self.encoder.forward_types(inputs)[0]

    def score(self, z_src: Tensor, z_dst: Tensor) -> Tensor:
        """Logits of pairs."""
        out: Tensor = self.decoder(z_src, z_dst)
        return out

    def score_against(self, z_src: Tensor, table: Tensor) -> Tensor:
        """Logits of one source against every row of ``table``."""
        return decode_against(self.decoder, z_src, table)


class TypeRows(HeteroNodeModel):
    """One node type's embeddings of a link model as a node model's rows of its target: what
    an ego-graph whose seeds are of that type is run through (``handler.graph.typed_ego``)."""

    def __init__(self, model: HeteroLinkModel, node_type: str) -> None:
        super().__init__()
        self.link = model
        self.target = node_type
        self.serving_needs = model.serving_needs

    def forward(self, inputs: HeteroInput) -> Tensor:
        return self.link.encode(inputs)[self.target]

    @property
    def has_embedding(self) -> bool:
        return False
