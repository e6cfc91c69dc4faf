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
from model.served.contract import Plan, ServedModel, ServingNeeds, SeveralNodeTypes
from model.served_hetero import HeteroNodeModel, typed_plan
from model.typed_batch import HeteroInput
from model.typed_graph import hetero_spec


class HeteroLinkModel(SeveralNodeTypes, torch.nn.Module):
    """The served protocol of a link model of a typed graph (see the module docstring).

    Attributes:
        edge_type: the relation predicted, ``(src, relation, dst)``; pairs are ``[src node,
            dst node]``.
        serving_needs: what its ego-graphs carry (edge features, boundary degrees) and what
            its scores are.
    """

    task = Task.LINK
    target = ""
    has_embedding = False
    edge_type: EdgeType
    serving_needs: ServingNeeds
    hops: int

    @property
    def decoder_name(self) -> str:
        """What describe reports as the archive's decoder."""
        raise NotImplementedError

    def forward_with_embedding(self, inputs: HeteroInput) -> tuple[Tensor, Tensor]:
        """A typed link model's embeddings are its ends' rows (:meth:`encode`)."""
        raise ValueError(f"{self.model_name} embeds through encode, per end of its relation")

    def precompute_plan(self) -> Plan:
        """Every ``encode`` embedding of the relation's two ends."""
        src, _, dst = self.edge_type
        types = tuple(dict.fromkeys((src, dst)))
        stored = f"every {' and '.join(types)} node's embedding (encode)"
        return typed_plan(
            self.model_name, types, stored, self.hops, self.serving_needs.boundary_degrees
        )

    def rows_of(self, node_type: str) -> ServedModel:
        """``encode``'s rows of ``node_type``, one end of the relation."""
        if node_type not in (self.edge_type[0], self.edge_type[2]):
            raise ValueError(f"{node_type!r} is not an end of {self.model_name}'s relation")
        return TypeRows(self, node_type)

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
        self.hops = self.encoder.hops

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
        self.hops = model.hops

    def forward(self, inputs: HeteroInput) -> Tensor:
        return self.link.encode(inputs)[self.target]

    @property
    def has_embedding(self) -> bool:
        return False
