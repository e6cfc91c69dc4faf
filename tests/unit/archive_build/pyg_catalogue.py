"""PyG's catalogue of node layers and models, as the conformance test serves them: every conv
layer of ``torch_geometric.nn.conv`` and every model of ``torch_geometric.nn.models`` whose
forward takes ``(x, edge_index[, edge_weight | edge_attr])``, with the arguments it is built
with, the edge input it reads and the verdict the build gives it (served exactly, or refused
and why). The table of docs/models.md is generated from it (``python -m
tests.unit.archive_build.pyg_catalogue``) and checked against it by the test.

It is also a model file: :class:`Catalogued` wraps a layer built with a module argument
(``GINConv(nn)``, ``DirGNNConv(conv)``), which ``--model-args`` (JSON) cannot carry.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor
from torch.nn import Linear, ReLU, Sequential
from torch_geometric.nn import conv as pyg_conv
from torch_geometric.nn import models as pyg_models

NODES, FEATURES, OUT, WEIGHT_DIM, ATTR_DIM = 36, 4, 4, 1, 3
HIDDEN = 8
DEG = "DEG"  # a --model-args value the test replaces with the graph's in-degree histogram
EXACT = "served exactly"
REFUSED = "refused"


@dataclass(frozen=True)
class Case:
    """One layer or model of the catalogue: how it is built and what the build does with it.

    Attributes:
        name: the row's name (the class, with the arguments that change the verdict).
        model_class: the dotted path ``--model-class`` gets, or ``Catalogued`` (this file).
        args: ``--model-args`` (``DEG``: the graph's in-degree histogram as a tensor).
        edge: ``--edge-input``: ``none``, ``edge_weight`` (one feature) or ``edge_attr``.
        verdict: ``EXACT`` or ``REFUSED``.
        why: what the table says (for a refusal: the part of the build's cause that names it).
    """

    name: str
    model_class: str
    args: dict[str, Any] = field(default_factory=dict)
    edge: str = "none"
    verdict: str = EXACT
    why: str = ""


CONV = "torch_geometric.nn.conv."
MODELS = "torch_geometric.nn.models."
F, H, C, A = FEATURES, HIDDEN, OUT, ATTR_DIM
IO = {"in_channels": F, "out_channels": C}
BASIC = {"in_channels": F, "hidden_channels": H, "num_layers": 2, "out_channels": C}
SOURCE_DEGREES = "normalises by source degrees: the deepest hop's degrees are the graph's"
GRAPH_NORM_WHY = "normalises over the whole graph"

CATALOGUE: tuple[Case, ...] = (
    Case("SimpleConv", CONV + "SimpleConv", {}, "edge_weight"),
    Case("GCNConv", CONV + "GCNConv", IO, "edge_weight", why=SOURCE_DEGREES),
    Case("SAGEConv", CONV + "SAGEConv", IO),
    Case("SAGEConv(in_channels=-1)", CONV + "SAGEConv", {**IO, "in_channels": -1},
         why="lazy: sized by a forward on a sample before its weights load"),
    Case("GraphConv", CONV + "GraphConv", IO, "edge_weight"),
    Case("GatedGraphConv", CONV + "GatedGraphConv", {"out_channels": H, "num_layers": 2},
         "edge_weight"),
    Case("ResGatedGraphConv", CONV + "ResGatedGraphConv", {**IO, "edge_dim": A}, "edge_attr"),
    Case("GATConv", CONV + "GATConv", {**IO, "heads": 2, "edge_dim": A}, "edge_attr"),
    Case("GATv2Conv", CONV + "GATv2Conv", {**IO, "heads": 2, "edge_dim": A}, "edge_attr"),
    Case("TransformerConv", CONV + "TransformerConv", {**IO, "heads": 2, "edge_dim": A},
         "edge_attr"),
    Case("AGNNConv", CONV + "AGNNConv", {}),
    Case("ChebConv(normalization=None)", CONV + "ChebConv", {**IO, "K": 3, "normalization": None},
         why=SOURCE_DEGREES),
    Case("ChebConv(normalization='sym')", CONV + "ChebConv", {**IO, "K": 3}, why=SOURCE_DEGREES),
    Case("ChebConv(normalization='rw')", CONV + "ChebConv", {**IO, "K": 3, "normalization": "rw"},
         why=SOURCE_DEGREES),
    Case("TAGConv", CONV + "TAGConv", {**IO, "K": 2}, "edge_weight", why=SOURCE_DEGREES),
    Case("GINConv", "Catalogued", {"case": "GINConv"}),
    Case("GINEConv", "Catalogued", {"case": "GINEConv"}, "edge_attr"),
    Case("ARMAConv", CONV + "ARMAConv", {**IO, "num_stacks": 2, "num_layers": 2},
         "edge_weight", why=SOURCE_DEGREES),
    Case("SGConv", CONV + "SGConv", {**IO, "K": 2}, "edge_weight", why=SOURCE_DEGREES),
    Case("SSGConv", CONV + "SSGConv", {**IO, "alpha": 0.1, "K": 2}, "edge_weight",
         why=SOURCE_DEGREES),
    Case("APPNP", CONV + "APPNP", {"K": 2, "alpha": 0.1}, "edge_weight", why=SOURCE_DEGREES),
    Case("MFConv", CONV + "MFConv", {**IO, "max_degree": 3}),
    Case("GMMConv", CONV + "GMMConv", {**IO, "dim": A, "kernel_size": 2}, "edge_attr"),
    Case("NNConv", "Catalogued", {"case": "NNConv"}, "edge_attr"),
    Case("CGConv", CONV + "CGConv", {"channels": F, "dim": A}, "edge_attr"),
    Case("EdgeConv", "Catalogued", {"case": "EdgeConv"}),
    Case("FeaStConv", CONV + "FeaStConv", {**IO, "heads": 2}),
    Case("LEConv", CONV + "LEConv", IO, "edge_weight"),
    Case("ClusterGCNConv", CONV + "ClusterGCNConv", IO, why=SOURCE_DEGREES),
    Case("GENConv", CONV + "GENConv", {**IO, "edge_dim": A}, "edge_attr"),
    Case("WLConvContinuous", CONV + "WLConvContinuous", {}, "edge_weight"),
    Case("FiLMConv", CONV + "FiLMConv", IO),
    Case("SuperGATConv", CONV + "SuperGATConv", {**IO, "heads": 2}),
    Case("EGConv", CONV + "EGConv", {"in_channels": F, "out_channels": H, "num_heads": 2,
         "num_bases": 2, "aggregators": ["symnorm", "max"]}, why=SOURCE_DEGREES),
    Case("PDNConv", CONV + "PDNConv", {**IO, "edge_dim": A, "hidden_channels": H}, "edge_attr",
         why=SOURCE_DEGREES),
    Case("GeneralConv", CONV + "GeneralConv", {**IO, "in_edge_channels": A}, "edge_attr"),
    Case("LGConv", CONV + "LGConv", {}, "edge_weight", why=SOURCE_DEGREES),
    Case("AntiSymmetricConv", CONV + "AntiSymmetricConv", {"in_channels": F, "num_iters": 2},
         why=SOURCE_DEGREES),
    Case("MixHopConv", CONV + "MixHopConv", {**IO, "powers": [0, 1, 2]}, "edge_weight",
         why=SOURCE_DEGREES),
    Case("PNAConv", CONV + "PNAConv", {**IO, "aggregators": ["mean", "max", "std"],
         "scalers": ["identity", "amplification"], "deg": DEG, "edge_dim": A}, "edge_attr"),
    Case("GPSConv", "Catalogued", {"case": "GPSConv"}, verdict=REFUSED,
         why="GPSConv at layer attends over every node of the graph"),
    Case("DirGNNConv", "Catalogued", {"case": "DirGNNConv"}, verdict=REFUSED,
         why="DirGNNConv at layer reads out-neighbours too"),
    Case("GCN", MODELS + "GCN", BASIC, "edge_weight", why=SOURCE_DEGREES),
    Case("GraphSAGE", MODELS + "GraphSAGE", BASIC),
    Case("GraphSAGE(in_channels=-1)", MODELS + "GraphSAGE", {**BASIC, "in_channels": -1},
         why="lazy: sized by a forward on a sample before its weights load"),
    Case("GIN", MODELS + "GIN", BASIC),
    Case("GAT", MODELS + "GAT", {**BASIC, "edge_dim": A}, "edge_attr"),
    Case("EdgeCNN", MODELS + "EdgeCNN", BASIC),
    Case("GraphSAGE(norm='batch_norm')", MODELS + "GraphSAGE", {**BASIC, "norm": "batch_norm"},
         why="running statistics in eval mode"),
    Case("GraphSAGE(norm='diff_group_norm')", MODELS + "GraphSAGE",
         {**BASIC, "norm": "diff_group_norm", "norm_kwargs": {"groups": 2}},
         why="running statistics in eval mode"),
    Case("GraphSAGE(norm='layer_norm', mode='node')", MODELS + "GraphSAGE",
         {**BASIC, "norm": "layer_norm", "norm_kwargs": {"mode": "node"}},
         why="normalises each node alone"),
    Case("GraphSAGE(norm='layer_norm')", MODELS + "GraphSAGE", {**BASIC, "norm": "layer_norm"},
         verdict=REFUSED, why="LayerNorm(mode='graph') at norms.0 " + GRAPH_NORM_WHY),
    Case("GraphSAGE(norm='graph_norm')", MODELS + "GraphSAGE", {**BASIC, "norm": "graph_norm"},
         verdict=REFUSED, why="GraphNorm at norms.0 " + GRAPH_NORM_WHY),
    Case("GraphSAGE(norm='instance_norm')", MODELS + "GraphSAGE",
         {**BASIC, "norm": "instance_norm"}, verdict=REFUSED,
         why="InstanceNorm(track_running_stats=False) at norms.0 " + GRAPH_NORM_WHY),
    Case("GraphSAGE(norm='pair_norm')", MODELS + "GraphSAGE", {**BASIC, "norm": "pair_norm"},
         verdict=REFUSED, why="PairNorm at norms.0 centres and scales over the whole graph"),
    Case("GraphUNet", MODELS + "GraphUNet",
         {"in_channels": F, "hidden_channels": H, "out_channels": C, "depth": 1},
         verdict=REFUSED,
         why="TopKPooling at pools.0 keeps the top-scoring nodes of the whole graph"),
    Case("RECT_L", MODELS + "RECT_L", {"in_channels": F, "hidden_channels": H}, "edge_weight",
         why=SOURCE_DEGREES),
    Case("LINKX", MODELS + "LINKX", {"num_nodes": NODES, **BASIC, "num_layers": 1},
         verdict=REFUSED, why="LINKX at the top indexes its weights by node ID"),
    Case("PNA", MODELS + "PNA", {**BASIC, "aggregators": ["mean", "max"],
         "scalers": ["identity", "attenuation"], "deg": DEG}),
    Case("PMLP", MODELS + "PMLP", BASIC, verdict=REFUSED,
         why="BatchNorm1d(track_running_stats=False) at norm normalises over every row"),
    Case("DeepGCNLayer", "Catalogued", {"case": "DeepGCNLayer"}, "edge_attr"),
)  # fmt: skip

# Catalogue members whose forward takes (x, edge_index, ...) but that this build cannot serve
# from a graph of one node type, and why (not parametrised: there is nothing to serve).
NOT_APPLICABLE: dict[str, str] = {
    "RGCNConv": "needs edge_type: a typed graph (see Typed graphs)",
    "FastRGCNConv": "needs edge_type: a typed graph (see Typed graphs)",
    "RGATConv": "needs edge_type: a typed graph (see Typed graphs)",
    "DNAConv": "takes every layer's representations, [N, L, C]",
    "WLConv": "takes categorical x and keeps a colour table between calls",
    "SplineConv": "needs pyg-lib",
    "PANConv": "needs torch-sparse",
    "MeshCNNConv": "takes a mesh's edge adjacency, not a graph's edges",
    "CuGraphSAGEConv": "needs cugraph",
    "CuGraphGATConv": "needs cugraph",
    "CuGraphRGCNConv": "needs cugraph and edge_type",
    "ARLinkPredictor": "its edge_index is the pairs to score; it encodes x alone",
    "NeuralFingerprint": "one row per graph: serve it with --task graph",
    "MetaLayer": "returns (x, edge_attr, u) from blocks of your own",
}


def applicable_classes() -> set[str]:
    """Names of the catalogue's members whose forward is ``(x, edge_index, ...)`` with every
    other parameter optional, plus ``DeepGCNLayer`` (``forward(*args)``, a node layer)."""
    found = {"DeepGCNLayer"}
    for package in (pyg_conv, pyg_models):
        for name in package.__all__:
            cls = getattr(package, name)
            if not (inspect.isclass(cls) and issubclass(cls, torch.nn.Module)):
                continue
            params = list(inspect.signature(cls.forward).parameters.values())[1:]
            names = [p.name for p in params[:2]]
            rest_optional = all(
                p.default is not inspect.Parameter.empty
                or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
                for p in params[2:]
            )
            if names == ["x", "edge_index"] and rest_optional:
                found.add(name)
    return found


def make(case: str) -> torch.nn.Module:
    """The layers :class:`Catalogued` wraps: those built with a module argument."""
    mlp = Sequential(Linear(F, H), ReLU(), Linear(H, C))
    if case == "GINConv":
        return pyg_conv.GINConv(mlp)
    if case == "GINEConv":
        return pyg_conv.GINEConv(mlp, edge_dim=A)
    if case == "NNConv":
        return pyg_conv.NNConv(F, C, Sequential(Linear(A, F * C)), aggr="mean")
    if case == "EdgeConv":
        return pyg_conv.EdgeConv(Sequential(Linear(2 * F, H), ReLU(), Linear(H, C)))
    if case == "DirGNNConv":
        return pyg_conv.DirGNNConv(pyg_conv.SAGEConv(F, C))
    if case == "GPSConv":
        return pyg_conv.GPSConv(F, pyg_conv.SAGEConv(F, F), heads=2)
    if case == "DeepGCNLayer":
        return _DeepGCN()
    raise ValueError(f"no catalogue layer {case!r}")


class _DeepGCN(torch.nn.Module):
    """PyG's DeepGCNLayer as its example uses it: a GENConv reading edge features, LayerNorm
    (torch's, per node) and ReLU in a res+ block, after a Linear to its width."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = Linear(F, H)
        conv = pyg_conv.GENConv(H, H, edge_dim=A)
        self.layer = pyg_models.DeepGCNLayer(conv, torch.nn.LayerNorm(H), ReLU(), block="res+")

    def forward(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor) -> Tensor:
        return self.layer(self.lin(x), edge_index, edge_attr)


class Catalogued(torch.nn.Module):
    """A catalogue layer that takes a module argument, called as PyG calls it."""

    def __init__(self, case: str) -> None:
        super().__init__()
        self.layer = make(case)

    def forward(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor | None = None) -> Tensor:
        if edge_attr is None:
            return self.layer(x, edge_index)
        return self.layer(x, edge_index, edge_attr)


def write_graph(directory: Path, edge_dim: int, seed: int = 3) -> Path:
    """nodes.csv and edges.csv of a small graph with a hub, self-loops, parallel edges, two
    isolated nodes and ``edge_dim`` positive edge features (weights in [0.5, 1.5])."""
    rng = np.random.default_rng(seed)
    nodes = pd.DataFrame(rng.normal(size=(NODES, F)), columns=[f"f{i}" for i in range(F)])
    nodes.insert(0, "id", [f"n{i}" for i in range(NODES)])
    nodes["label"] = [["a", "b"][i % 2] for i in range(NODES)]
    connected, count = NODES - 2, 120
    src = rng.integers(0, connected, count)
    dst = np.where(rng.random(count) < 0.2, 0, rng.integers(0, connected, count))
    src[:6] = dst[:6]  # self-loops
    src, dst = np.concatenate([src, src[10:20]]), np.concatenate([dst, dst[10:20]])  # parallel
    edges = pd.DataFrame({"src": [f"n{s}" for s in src], "dst": [f"n{d}" for d in dst]})
    for column in range(edge_dim):
        edges[f"e{column}"] = rng.uniform(0.5, 1.5, len(edges)).round(3)
    directory.mkdir(parents=True, exist_ok=True)
    nodes.to_csv(directory / "nodes.csv", index=False)
    edges.to_csv(directory / "edges.csv", index=False)
    return directory


def with_statistics(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """``module`` with non-trivial running statistics in every norm that keeps them (a fresh
    BatchNorm's mean 0 and variance 1 would hide a norm served with the wrong ones)."""
    generator = torch.Generator().manual_seed(seed)
    for sub in module.modules():
        mean, var = getattr(sub, "running_mean", None), getattr(sub, "running_var", None)
        if isinstance(mean, Tensor) and isinstance(var, Tensor):
            mean.copy_(torch.randn(mean.shape, generator=generator) * 0.5)
            var.copy_(torch.rand(var.shape, generator=generator) + 0.5)
    return module


def markdown_table() -> str:
    """The table docs/models.md carries: layer, what the build does, why."""
    rows = ["| Layer or model | Build | Why |", "| --- | --- | --- |"]
    rows += [f"| `{case.name}` | {case.verdict} | {case.why} |" for case in CATALOGUE]
    rows += [f"| `{name}` | not applicable | {why} |" for name, why in NOT_APPLICABLE.items()]
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
