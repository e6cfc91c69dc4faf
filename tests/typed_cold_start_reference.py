"""The reference a cold-start answer on a graph of several node types is held to: the whole
graph as one HeteroInput with the new node (of the target type) and its edges added."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from graph_assets.schema import GraphSchema
from model.typed_batch import HeteroInput

# An edge of the new node: (relation, its other end's position within its type, into the new
# node, its features or None on a relation without).
LocatedEdge = tuple[tuple[str, str, str], int, bool, Sequence[float] | None]


def with_new_node(
    inputs: HeteroInput, schema: GraphSchema, x: Sequence[float], edges: Sequence[LocatedEdge]
) -> tuple[HeteroInput, int]:
    """``inputs`` plus a node of ``schema``'s target type (the last of its type) with ``edges``;
    and its position."""
    target = schema.target
    x_dict, n_id = dict(inputs.x_dict), dict(inputs.n_id_dict)
    new = int(x_dict[target].shape[0])
    x_dict[target] = torch.cat([x_dict[target], torch.tensor([list(x)], dtype=torch.float32)])
    n_id[target] = torch.cat([n_id[target], torch.tensor([new])])
    edge_index, edge_attr = dict(inputs.edge_index_dict), dict(inputs.edge_attr_dict)
    for triple, other, into, attr in edges:
        pair = torch.tensor([[other], [new]] if into else [[new], [other]])
        edge_index[triple] = torch.cat([edge_index[triple], pair], dim=1)
        relation = schema.relations[schema.relation_index("__".join(triple))]
        if relation.edge_feature_dim:
            row = torch.tensor([list(attr or [])], dtype=torch.float32)
            edge_attr[triple] = torch.cat([edge_attr[triple], row])
    return HeteroInput(x_dict, edge_index, n_id, edge_attr), new
