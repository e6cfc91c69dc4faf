"""The user's link model behind the served link-model protocol (``model.link.LinkModel``).

A link model of your own follows PyG's GAE convention: ``encode(x, edge_index[, edge_attr |
edge_weight]) -> z``, one embedding per node, and ``decode(z, edge_label_index) -> scores``,
one score per column of ``edge_label_index``. :class:`UserLinkModel` is the adapter: its
``forward`` is ``encode`` on an ego-graph (or the whole graph) with the node protocol's
keywords, and ``score`` / ``score_against`` hand pairs of embeddings to ``decode`` as a small
``z`` and an ``edge_label_index`` into it, so any ``decode`` that reads the pairs' rows of
``z`` scores them as it would on the whole graph's ``z``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from model.chebconv import chebconv_layers, graph_degrees, scales_by_largest_degree
from model.config import Task
from model.link import RowEmbedding, by_chunks
from model.served import UserAdapter, edge_kwargs, output_plan
from model.served.contract import Plan, ServedModel, ServingNeeds
from model.user_model import UserModelConfig

LINK_METHODS = ("encode", "decode")
_CONVENTION = (
    "a link model follows PyG's GAE convention: encode(x, edge_index[, edge_attr]) -> z and "
    "decode(z, edge_label_index) -> scores"
)


def check_link_methods(module: torch.nn.Module) -> None:
    """Refuses, in one line, a module without ``encode`` or ``decode``."""
    missing = [name for name in LINK_METHODS if not callable(getattr(module, name, None))]
    if missing:
        raise ValueError(
            f"{type(module).__name__} has no {' or '.join(missing)} method: {_CONVENTION}"
        )


class UserLinkModel(UserAdapter, RowEmbedding):
    """The user's GAE-style module behind the link protocol (its weights under ``module.``);
    a node's embedding is its row, ``encode``'s."""

    task = Task.LINK
    has_embedding = True

    def __init__(self, module: torch.nn.Module, config: UserModelConfig) -> None:
        check_link_methods(module)
        super().__init__(module, config)
        self.serving_needs = ServingNeeds(
            output=config.output,
            edge_input=config.edge_input,
            boundary_degrees=config.boundary_degrees,
            out_degrees=bool(chebconv_layers(module)),
            largest_degree=scales_by_largest_degree(module),
        )
        # The graph's largest out-degree, as UserNodeModel.largest_degree.
        self.largest_degree = config.max_degree

    @property
    def decoder_name(self) -> str:
        return f"{type(self.module).__name__}.decode"

    def forward(
        self,
        x: Tensor,
        edge_index: Tensor,
        degree: Tensor | None = None,
        level_sizes: Sequence[int] | None = None,
        edge_attr: Tensor | None = None,
    ) -> Tensor:
        """``encode``'s embeddings, one row per row of ``x``; ``degree`` is not the user's
        business (boundary degrees come in the ego-graph's edges) and ``encode`` is not
        trimmed, so ``level_sizes`` changes nothing."""
        encode = method_of(self.module, "encode")
        kwargs = edge_kwargs(self.config.edge_input, edge_attr)
        if degree is not None and chebconv_layers(self.module):  # model.chebconv
            with graph_degrees(self.module, degree, self.largest_degree):
                z = encode(x, edge_index, **kwargs)
        else:
            z = encode(x, edge_index, **kwargs)
        if not isinstance(z, Tensor) or z.dim() != 2 or z.size(0) != x.size(0):
            raise ValueError(
                f"{type(self.module).__name__}.encode must return one embedding per node, a "
                f"[{x.size(0)}, D] tensor; it returned {_shape(z)}"
            )
        return z

    def precompute_plan(self) -> Plan:
        """Every node's embedding (``encode``), recomputed from its in-neighbourhood."""
        config = self.config
        return output_plan(
            type(self.module).__name__,
            "is a link model (its encode's embeddings are the rows)",
            config.num_layers,
            config.boundary_degrees,
        )

    def rows_of(self, node_type: str) -> ServedModel:
        raise ValueError(f"{type(self.module).__name__} reads a graph of one node type")

    def score(self, z_src: Tensor, z_dst: Tensor) -> Tensor:
        """``decode`` of pairs: row ``i`` of ``z_src`` with row ``i`` of ``z_dst``."""
        pairs = z_src.size(0)
        rows = torch.arange(pairs, device=z_src.device)
        return self._decode(torch.cat([z_src, z_dst]), torch.stack([rows, rows + pairs]))

    def score_against(self, z_src: Tensor, table: Tensor) -> Tensor:
        """``decode`` of one node (``z_src``, ``[D]``) with every row of ``table``, in chunks
        of ``SCORE_CHUNK_ROWS`` rows."""

        def decode_chunk(chunk: Tensor) -> Tensor:
            rows = torch.arange(1, chunk.size(0) + 1, device=z_src.device)
            index = torch.stack([torch.zeros_like(rows), rows])
            return self._decode(torch.cat([z_src.unsqueeze(0), chunk]), index)

        return by_chunks(z_src, table, decode_chunk)

    def _decode(self, z: Tensor, edge_label_index: Tensor) -> Tensor:
        scores = method_of(self.module, "decode")(z, edge_label_index)
        return decoded_scores(type(self.module).__name__, scores, edge_label_index.size(1))


def method_of(module: torch.nn.Module, name: str) -> Callable[..., Any]:
    """A method of the user's module by name (checked at build by :func:`check_link_methods`)."""
    method: Callable[..., Any] = getattr(module, name)
    return method


def decoded_scores(name: str, scores: object, pairs: int) -> Tensor:
    """``decode``'s answer as ``[pairs]`` (``[pairs, 1]`` is accepted); anything else is
    refused naming what it returned."""
    if not isinstance(scores, Tensor) or scores.numel() != pairs or scores.dim() > 2:
        raise ValueError(
            f"{name}.decode must return one score per pair, a [{pairs}] tensor; it returned "
            f"{_shape(scores)}"
        )
    return scores.reshape(pairs)


def _shape(value: object) -> str:
    if isinstance(value, Tensor):
        return f"a tensor of shape {list(value.shape)}"
    return f"a {type(value).__name__}"
