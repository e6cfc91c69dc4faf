"""A stored graph of several node types or relations as the heterogeneous models read it.

:func:`hetero_section` is the store's schema as ``ModelConfig.hetero`` records it (what the
recipe is sized by); :func:`target_relation` checks the relation a link archive predicts;
:func:`hetero_spec` rebuilds the recipe's spec from a config;
:func:`whole_graph_input` is the whole graph as one ``HeteroInput``, for training and for the
full-graph forward every served answer is held to.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from graph_assets.schema import EdgeType, GraphSchema
from graph_assets.stored.store import GraphStore
from model.config import ModelConfig, Task
from model.hetero_recipes import HeteroSpec
from model.typed_batch import HeteroInput


def hetero_section(schema: GraphSchema, target_edge_type: str | None = None) -> dict[str, Any]:
    """``ModelConfig.hetero`` for a graph of this schema (a link model's with the relation it
    predicts)."""
    link = {} if target_edge_type is None else {"target_edge_type": target_edge_type}
    return {
        "node_types": schema.node_type_names,
        "edge_types": [list(r.edge_type.triple) for r in schema.relations],
        "in_dims": {t.name: t.feature_dim for t in schema.node_types},
        "num_nodes": {t.name: t.num_nodes for t in schema.node_types if t.feature_dim == 0},
        "edge_dims": {r.name: r.edge_feature_dim for r in schema.relations if r.edge_feature_dim},
        "target": schema.target,
        **link,
    }


def target_relation(schema: GraphSchema, name: str | None) -> EdgeType | None:
    """The relation a link archive predicts (``--target-edge-type``): required on a graph of
    several node types or relations, refused on a graph of one; ValueError listing the
    graph's relations otherwise. None on a graph of one type."""
    relations = ", ".join(schema.edge_type_names)
    if schema.is_homogeneous:
        if name is not None:
            raise ValueError(
                f"--target-edge-type {name}: this graph has one node type and one relation "
                f"({relations}); leave --target-edge-type out"
            )
        return None
    if name is None:
        raise ValueError(
            "--task link on a graph of several node types or relations predicts one of them: "
            f"give --target-edge-type, one of {relations}"
        )
    if name not in schema.edge_type_names:
        raise ValueError(
            f"--target-edge-type {name}: this graph has no such relation; its relations are "
            f"{relations}"
        )
    return EdgeType.parse(name)


def hetero_spec(config: ModelConfig) -> HeteroSpec:
    """The recipe's spec from a config whose ``hetero`` section is set (ValueError naming
    what is malformed otherwise)."""
    section = config.hetero
    if section is None:
        raise ValueError("the model config describes a graph of one type (no hetero section)")
    try:
        edge_types = tuple(tuple(triple) for triple in section["edge_types"])
        by_name = {"__".join(triple): triple for triple in edge_types}
        target, outputs = section["target"], ()
        if config.task is Task.LINK:  # the encoder outputs both ends of the relation
            src, _, target = by_name[section["target_edge_type"]]
            outputs = tuple(dict.fromkeys((src, target)))
        return HeteroSpec(
            node_types=tuple(section["node_types"]),
            edge_types=edge_types,
            in_dims=dict(section["in_dims"]),
            num_nodes=dict(section.get("num_nodes", {})),
            edge_dims={by_name[name]: dim for name, dim in section.get("edge_dims", {}).items()},
            target=target,
            outputs=outputs,
            num_classes=config.out_dim,
            hidden_dim=config.hidden_dim,
            num_layers=config.num_layers,
            heads=config.heads,
            dropout=config.dropout,
        )
    except (KeyError, TypeError) as error:
        raise ValueError(f"the model config's hetero section is malformed ({error!r})") from None


def whole_graph_input(store: GraphStore) -> HeteroInput:
    """The whole stored graph: each type's features and node indices, each relation's edges
    in per-type positions with their features."""
    schema = store.schema
    x_dict, n_id_dict = {}, {}
    for index, node_type in enumerate(schema.node_types):
        x_dict[node_type.name] = torch.from_numpy(np.array(store.tables[index].features))
        n_id_dict[node_type.name] = torch.arange(node_type.num_nodes)
    dst = np.repeat(np.arange(store.num_nodes, dtype=np.int64), np.diff(store.indptr))
    src = np.asarray(store.indices, dtype=np.int64)
    kinds = (
        np.zeros(len(src), dtype=np.int64)
        if store.edge_type is None
        else np.asarray(store.edge_type, dtype=np.int64)
    )
    edge_index_dict, edge_attr_dict = {}, {}
    for r, relation in enumerate(schema.relations):
        edge_type = relation.edge_type
        mine = kinds == r
        local = np.stack(
            [
                src[mine] - schema.node_type(edge_type.src).offset,
                dst[mine] - schema.node_type(edge_type.dst).offset,
            ]
        )
        edge_index_dict[edge_type.triple] = torch.from_numpy(local)
        if relation.edge_feature_dim:
            # Rows of the relation's table are its edges in CSC order: the order of ``mine``.
            table = np.array(store.edge_features_by_relation[r], dtype=np.float32)
            edge_attr_dict[edge_type.triple] = torch.from_numpy(table)
    return HeteroInput(x_dict, edge_index_dict, n_id_dict, edge_attr_dict)
