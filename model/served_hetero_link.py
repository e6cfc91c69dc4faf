"""The user's link model of a typed graph behind the served protocol
(``model.hetero_link.HeteroLinkModel``).

The convention is PyG's GAE one on dicts, as PyG's heterogeneous link examples
(``examples/hetero/movie_lens_sage.py``) write it: ``encode(x_dict, edge_index_dict[,
edge_attr_dict][, n_id_dict]) -> z_dict`` and ``decode(z_dict, edge_label_index) -> scores``,
where ``edge_label_index[0]`` indexes the relation's source type's rows of ``z_dict`` and
``edge_label_index[1]`` its destination type's. :class:`UserHeteroLinkModel` hands pairs to
``decode`` as a small ``z_dict`` (the pairs' rows of each end) and an ``edge_label_index``
into it, so a ``decode`` that reads the pairs' rows scores them as on the whole graph's.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor
from torch_geometric.typing import EdgeType

from model.hetero_link import HeteroLinkModel
from model.link import by_chunks
from model.served_hetero import DictCall
from model.served_link import decoded_scores, method_of
from model.typed_batch import HeteroInput
from model.user_model import Output


class UserHeteroLinkModel(HeteroLinkModel):
    """The user's module (its weights under ``module.``) predicting ``edge_type``.

    Args:
        module: the user's module, with ``encode`` and ``decode`` (checked by
            ``model.served_link.check_link_methods``).
        edge_type: the relation predicted, ``(src, relation, dst)``.
        output: what ``decode`` returns (``model.user_model.Output``; logits are served as
            their sigmoid).
        boundary_degrees: the ego-graph must carry the deepest hop's in-degrees; None: True
            when the module holds a layer that normalises by its sources' degrees (GCNConv).
        hops: its receptive field (the config's ``num_layers``); 0 while a build probes it.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        edge_type: EdgeType,
        output: Output = Output.LOGITS,
        boundary_degrees: bool | None = None,
        hops: int = 0,
    ) -> None:
        super().__init__()
        self.module = module
        self.edge_type = edge_type
        self.hops = hops
        self._encode = DictCall(method_of(module, "encode"))
        self.serving_needs = self._encode.needs(module, output, boundary_degrees)

    @property
    def decoder_name(self) -> str:
        return f"{type(self.module).__name__}.decode"

    @property
    def model_name(self) -> str:
        return type(self.module).__name__

    def encode(self, inputs: HeteroInput) -> dict[str, Tensor]:
        """``encode``'s rows of both ends of the relation (checked: one per row)."""
        z = self._encode(inputs)
        ends = dict.fromkeys((self.edge_type[0], self.edge_type[2]))
        for key in ends:
            rows = z.get(key) if isinstance(z, Mapping) else None
            count = inputs.n_id_dict[key].numel()
            if not isinstance(rows, Tensor) or rows.dim() != 2 or rows.size(0) != count:
                got = list(rows.shape) if isinstance(rows, Tensor) else type(rows).__name__
                raise ValueError(
                    f"{type(self.module).__name__}.encode must return a dict with a [{count}, D] "
                    f"tensor for {key!r}; got {got}"
                )
        return {key: z[key] for key in ends}

    def score(self, z_src: Tensor, z_dst: Tensor) -> Tensor:
        """``decode`` of pairs: row ``i`` of ``z_src`` with row ``i`` of ``z_dst``."""
        rows = torch.arange(z_src.size(0), device=z_src.device)
        return self._decode(z_src, z_dst, rows, rows)

    def score_against(self, z_src: Tensor, table: Tensor) -> Tensor:
        """``decode`` of one source with every row of ``table``, in chunks of
        ``SCORE_CHUNK_ROWS`` rows."""

        def decode_chunk(chunk: Tensor) -> Tensor:
            rows = torch.arange(chunk.size(0), device=z_src.device)
            return self._decode(z_src.unsqueeze(0), chunk, torch.zeros_like(rows), rows)

        return by_chunks(z_src, table, decode_chunk)

    def _decode(self, z_src: Tensor, z_dst: Tensor, src: Tensor, dst: Tensor) -> Tensor:
        """``decode`` of pairs ``(z_src[src[i]], z_dst[dst[i]])``; a relation within one type
        gets one table, the destinations' rows after the sources'."""
        source, _, target = self.edge_type
        if source == target:
            z_dict = {source: torch.cat([z_src, z_dst])}
            dst = dst + z_src.size(0)
        else:
            z_dict = {source: z_src, target: z_dst}
        index = torch.stack([src, dst])
        scores = method_of(self.module, "decode")(z_dict, index)
        return decoded_scores(type(self.module).__name__, scores, index.size(1))
