"""Typed graphs for tests: the generated fraud graph with each relation's reverse (so messages
reach users), stored, and a seeded node recipe sized for it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from graph_assets import GraphStore, open_store, write_store
from graph_assets.input.synthetic_typed import fraud_graph
from graph_assets.tables import RawRelation, TypedGraph
from model import ModelConfig, build_model
from model.served_hetero import UserHeteroModel
from model.typed_graph import hetero_section
from tests.unit.archive_build import user_models


def with_reverses(graph: TypedGraph) -> TypedGraph:
    """``graph`` with each relation's reverse, as ``--undirected`` adds them."""
    reverses = tuple(
        RawRelation(r.edge_type.reverse(), r.dst, r.src, r.edge_features, r.edge_feature_names)
        for r in graph.relations
    )
    return dataclasses.replace(graph, relations=graph.relations + reverses)


def fraud_store(
    path: Path, users: int, merchants: int, devices: int, payments: int, seed: int
) -> GraphStore:
    """The fraud graph with its reverses, written at ``path`` and opened."""
    write_store(with_reverses(fraud_graph(users, merchants, devices, payments, seed=seed)), path)
    return open_store(path)


def node_recipe(store: GraphStore, arch: str, hidden: int = 16) -> torch.nn.Module:
    """A seeded per-relation recipe of ``arch`` answering the store's target type, in eval
    mode; the payments' edge-feature maps are scaled down (amounts are ~100) so that gat's
    attention does not saturate and every input moves the answer."""
    torch.manual_seed(0)
    config = ModelConfig(
        arch=arch,
        in_dim=store.feature_dim,
        out_dim=2,
        hidden_dim=hidden,
        heads=2,
        hetero=hetero_section(store.schema),
    )
    model = build_model(config).eval()
    with torch.no_grad():
        for sub in model.modules():
            if isinstance(getattr(sub, "lin_edge", None), torch.nn.Module):
                sub.lin_edge.weight.mul_(1e-3)
    return model


def hetero_conv_model(store: GraphStore) -> UserHeteroModel:
    """The user's seeded HeteroConv stack (tests' ``FraudHeteroConv``: GATConv on payments
    reading their amounts, SAGEConv on device use, learned device embeddings) as a worker
    loads it, embedding named; its edge-feature maps scaled down as ``node_recipe``'s are."""
    torch.manual_seed(0)
    devices = store.schema.node_type("device").num_nodes
    module = user_models.FraudHeteroConv(devices=devices, hidden=8, classes=2, edge_dim=2)
    with torch.no_grad():
        for sub in module.modules():
            if isinstance(getattr(sub, "lin_edge", None), torch.nn.Module):
                sub.lin_edge.weight.mul_(1e-3)
    return UserHeteroModel(module, store.schema.target, embedding="head", hops=2).eval()
