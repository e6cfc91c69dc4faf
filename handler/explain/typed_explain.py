"""Explanations on a graph of several node types or relations: Integrated Gradients through
PyG's heterogeneous Captum path (``to_captum_input`` on ``x_dict`` and one edge mask per
relation, ``CaptumHeteroModel``, ``captum_output_to_dicts``), on the seed's sampled ego-graph,
as ``handler.explain.ego_explain`` does on one type: the same method, steps, budget and listing.

Edge masks reach the messages through PyG's own rule (``set_hetero_masks``: each relation's
layer of a ``HeteroConv`` or ``to_hetero`` model) and, for a layer that passes the messages of
every relation itself (``RGCNConv``, ``HGTConv``), through :class:`RelationsInOrder`. The model
runs untrimmed on the whole ego-graph, so that each mask meets every message of its edges; the
answer is the served forward's (trimmed, as the node engine computes it).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch_geometric.explain.algorithm.captum import (
    CaptumHeteroModel,
    MaskLevelType,
    captum_output_to_dicts,
    to_captum_input,
)
from torch_geometric.explain.algorithm.utils import clear_masks, set_hetero_masks
from torch_geometric.nn import MessagePassing
from torch_geometric.typing import EdgeType

from handler.explain.ego_explain import Attribution, Naming, within_budget
from handler.protocol.errors import BadRequest
from model.typed_batch import HeteroInput
from model.typed_rows import TypedSubgraph

_MASKS = MaskLevelType.node_and_edge  # feature attributions and edge masks, as on one type


class TargetRows(torch.nn.Module):
    """A served typed model in the signature PyG's explainers call: ``forward(x_dict,
    edge_index_dict, n_id_dict, edge_attr_dict)`` -> the target type's rows."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        x_dict: dict[str, Tensor],
        edge_index_dict: dict[EdgeType, Tensor],
        n_id_dict: dict[str, Tensor],
        edge_attr_dict: dict[EdgeType, Tensor],
    ) -> Tensor:
        return self.model(HeteroInput(x_dict, edge_index_dict, n_id_dict, edge_attr_dict))


class RelationsInOrder:
    """The edge mask of a layer that passes the messages of several relations: its propagate
    calls of one forward see the relations' edges in ``edge_index_dict`` order, all at once
    (``HGTConv``) or relation by relation (``RGCNConv``); each call gets the next slice of the
    relations' masks, side by side."""

    def __init__(self, name: str, mask: Tensor) -> None:
        self.name = name
        self.mask = mask
        self.cursor = 0

    def __call__(self, module: MessagePassing, inputs: tuple[Any, ...]) -> None:
        edge_index = inputs[0]
        if not isinstance(edge_index, Tensor) or edge_index.dim() != 2:
            raise self.refusal(f"passes messages over a {type(edge_index).__name__}")
        stop = self.cursor + edge_index.size(1)
        if stop > self.mask.numel():
            raise self.refusal(
                f"passes messages over {stop} edges, and the ego-graph's relations have "
                f"{self.mask.numel()}"
            )
        module._edge_mask = self.mask[self.cursor : stop]
        module._loop_mask = edge_index[0] != edge_index[1]
        self.cursor = stop if stop < self.mask.numel() else 0

    def refusal(self, what: str) -> BadRequest:
        return BadRequest(
            f"this archive's model cannot be explained: its layer {self.name!r} {what}; "
            "explanations need each relation's messages from its own layer (HeteroConv, "
            "to_hetero) or from a layer over all relations in order (RGCNConv, HGTConv)"
        )


@contextmanager
def relation_masks(
    model: torch.nn.Module,
    masks: Mapping[EdgeType, Tensor],
    edge_index_dict: Mapping[EdgeType, Tensor],
) -> Iterator[None]:
    """Within the block, each relation's edge mask multiplies the messages of its edges in
    every layer that passes them: PyG's rule for per-relation layers
    (``set_hetero_masks``), :class:`RelationsInOrder` for the others. A model whose layers
    pass other messages is refused (400) rather than explained wrongly."""
    set_hetero_masks(model, dict(masks), dict(edge_index_dict), apply_sigmoid=False)
    together = torch.cat([masks[key] for key in edge_index_dict])
    placed = []
    try:
        for name, module in model.named_modules():
            if not isinstance(module, MessagePassing) or module.explain is not None:
                continue  # masked per relation already, or explicitly not explained
            module.explain = True
            module._apply_sigmoid = False
            order = RelationsInOrder(name, together)
            placed.append((order, module.register_propagate_forward_pre_hook(order)))
        yield
        for order, _ in placed:
            if order.cursor:
                raise order.refusal("leaves some of the relations' edges without messages")
    finally:
        for _, handle in placed:
            handle.remove()
        clear_masks(model)


class RelationMaskedModel(CaptumHeteroModel):
    """PyG's Captum model of a heterogeneous GNN (node and edge masks), with the edge masks
    placed by :func:`relation_masks`. Every input is kept in the autograd graph, so one the
    model does not read (a featureless type's empty rows, a relation no layer reaches) is
    attributed 0 instead of stopping Captum's gradient."""

    def forward(self, *args: Any) -> Tensor:
        x_dict, edge_index_dict, masks = self._captum_data_to_hetero_data(*args)
        assert masks is not None
        rest = args[self.num_node_types + self.num_edge_types + 1 :]
        with relation_masks(self.model, masks, edge_index_dict):
            out = self.model(x_dict, edge_index_dict, *rest)
        touched = sum(t.sum() for t in (*x_dict.values(), *masks.values()))
        return self.postprocess(out + 0.0 * touched)


def typed_integrated_gradients(
    model: torch.nn.Module,
    ego: TypedSubgraph,
    *,
    mode: str,
    target: int | None,
    steps: int,
    budget_s: float,
) -> Attribution:
    """IG attributions of the seed (the target type's row 0) in the ego-graph's row and edge
    order: a row's features in its type's columns (types side by side, schema order), zeros
    elsewhere; ``target`` the class explained (None for a regression)."""
    if model.training:
        raise ValueError("explain a model in eval mode")
    inputs = ego.inputs()
    metadata = (list(inputs.x_dict), list(inputs.edge_index_dict))
    captum_model = RelationMaskedModel(TargetRows(model), _MASKS, 0, metadata)
    captum_inputs, extra = to_captum_input(
        inputs.x_dict, inputs.edge_index_dict, _MASKS, inputs.n_id_dict, inputs.edge_attr_dict
    )

    def run(n_steps: int) -> tuple[Tensor, Tensor]:
        from captum.attr import IntegratedGradients

        attributions = IntegratedGradients(captum_model).attribute(
            captum_inputs,
            target=target,
            additional_forward_args=extra,
            n_steps=n_steps,
            internal_batch_size=1,
        )
        node_masks, edge_masks = captum_output_to_dicts(attributions, _MASKS, metadata)
        assert node_masks is not None and edge_masks is not None
        return _side_by_side(ego, node_masks, edge_masks)

    return within_budget(run, steps, budget_s)


def typed_naming(ego: TypedSubgraph) -> Naming:
    """How the listing names the rows, edges and feature columns of ``ego`` (columns as
    :func:`typed_integrated_gradients` lays them out)."""
    widths = _widths(ego)
    return Naming(
        node_types=ego.layout.node_types,
        relations=tuple("__".join(key) for key in ego.layout.edge_types),
        row_type=ego.row_type,
        edge_relation=ego.edge_relation,
        column_type=np.repeat(np.arange(len(widths)), widths),
        column_feature=np.concatenate([np.arange(width) for width in widths]),
    )


def _widths(ego: TypedSubgraph) -> list[int]:
    """Each node type's feature width, in the layout's (schema) order."""
    return [ego.features[key].size(1) for key in ego.layout.node_types]


def _side_by_side(
    ego: TypedSubgraph, node_masks: Mapping[str, Tensor], edge_masks: Mapping[EdgeType, Tensor]
) -> tuple[Tensor, Tensor]:
    """Per-type node masks as one ``[n, sum of widths]`` mask in row order, per-relation edge
    masks as one ``[E]`` mask in edge order."""
    layout = ego.layout
    widths = _widths(ego)
    rows = layout.position.numel()
    node_mask = torch.zeros(rows, sum(widths), dtype=torch.float64)
    column = 0
    for key, width in zip(layout.node_types, widths, strict=True):
        node_mask[layout.rows[key].cpu(), column : column + width] = node_masks[key].cpu().double()
        column += width
    edge_mask = torch.zeros(ego.edge_relation.size, dtype=torch.float64)
    for key in layout.edge_types:
        edge_mask[layout.edges[key].cpu()] = edge_masks[key].cpu().double()
    return node_mask, edge_mask
