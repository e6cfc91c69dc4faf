"""The built-in recipes on a heterogeneous graph: ``sage``, ``gat``, ``gcn``, ``gin`` (one layer
per relation, summed per destination type), ``rgcn`` and ``hgt``; node classifiers of their
``target`` type, and the encoders of link predictors (``model.hetero_link``), which output the
rows of both ends of a relation (``HeteroSpec.outputs``).

Each type's input is projected to ``hidden_dim`` first: a Linear for a type with features, a
learned embedding per node (indexed by ``n_id``) for a featureless one, so every layer after it
reads one width. The per-relation stacks are what ``to_hetero`` of a small homogeneous model
builds, written with PyG's ``HeteroConv`` because ``to_hetero`` refuses two things these graphs
have: a node type no relation points to (its second layer has no input for it) and ``GCNConv``
on a relation between two types (GCNConv takes no ``(source, destination)`` pair). Each layer
also maps every type's own rows (a root Linear), which keeps those types' rows alive.

A node type's modules are stored under `module_key`: its name, unless torch's ``ModuleDict``
cannot hold that name (``a.b``, ``items``). Every recipe takes and returns the graph's own
names, and ``HeteroConv`` is keyed by the graph's own edge types (PyG escapes them itself), so
explanations find each relation's layer by its name.

Exactness on a sampled ego-graph: every layer here aggregates per destination (mean, sum,
softmax over a destination's in-edges, per relation or over all), which the full in-edge lists
of the rows a seed reads give exactly, except ``gcn``, which also weighs a message by its
source's in-degree: it needs the boundary hop (``ServingNeeds.boundary_degrees``).
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.nn import (
    GATConv,
    GINConv,
    GINEConv,
    HeteroConv,
    HGTConv,
    MessagePassing,
    RGCNConv,
    SAGEConv,
)
from torch_geometric.nn.dense import Linear
from torch_geometric.nn.models import MLP
from torch_geometric.typing import EdgeType
from torch_geometric.utils import scatter

from model.config import Setting
from model.served import ServingNeeds
from model.served_hetero import HeteroNodeModel
from model.typed_batch import HeteroInput
from model.user_model import EdgeInput

# torch.nn.ModuleDict refuses a key that is one of its attributes (instance ones included).
_MODULE_DICT_ATTRIBUTES = frozenset(dir(torch.nn.ModuleDict()))


def module_key(node_type: str) -> str:
    """The key of ``node_type``'s modules in a recipe's ``ModuleDict``s, hence in its
    state_dict.

    The name itself wherever torch's ``ModuleDict`` takes it, so the keys of archives built
    before stay as they were. A name with a dot, or one that is a ``ModuleDict`` attribute
    (``items``, ``keys``), cannot be a key: it is keyed ``t__<its UTF-8 in hex>``, which no
    type can be named (names hold no ``__``).
    """
    if "." in node_type or node_type in _MODULE_DICT_ATTRIBUTES:
        return f"t__{node_type.encode().hex()}"
    return node_type


def _keyed_edge(edge_type: EdgeType) -> EdgeType:
    """``edge_type`` with its end types' `module_key`s."""
    src, relation, dst = edge_type
    return (module_key(src), relation, module_key(dst))


class HeteroArch(Setting):
    """The message-passing recipe on a heterogeneous graph."""

    SAGE = "sage"
    GAT = "gat"
    GCN = "gcn"
    GIN = "gin"
    RGCN = "rgcn"
    HGT = "hgt"

    @classmethod
    def setting(cls) -> str:
        return "arch"


@dataclass(frozen=True, kw_only=True)
class HeteroSpec:
    """A heterogeneous graph's shape and a recipe's sizes.

    Attributes:
        node_types, edge_types: the graph's metadata (PyG's ``HeteroData.metadata()``).
        in_dims: feature width of each node type; 0 for a featureless type.
        num_nodes: node count of each featureless type (its embedding table's rows).
        edge_dims: edge feature width of each relation that has edge features (``gat`` and
            ``gin`` read them; the others read none).
        target: the node type answered for.
        outputs: the node types whose rows the model outputs (a link encoder's relation ends);
            empty (default): the target only.
        num_classes: output width (a link encoder's: the embedding width).
        hidden_dim: width of every hidden layer (64); ``heads`` attention heads (2) for
            ``gat`` and ``hgt`` share it.
        num_layers: message-passing layers = hops of the ego-graph (2).
        dropout: between layers, in training only (0.0).
    """

    node_types: tuple[str, ...]
    edge_types: tuple[EdgeType, ...]
    in_dims: Mapping[str, int]
    num_nodes: Mapping[str, int] = field(default_factory=dict)
    edge_dims: Mapping[EdgeType, int] = field(default_factory=dict)
    target: str
    outputs: tuple[str, ...] = ()
    num_classes: int
    hidden_dim: int = 64
    num_layers: int = 2
    heads: int = 2
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if self.target not in self.node_types:
            raise ValueError(f"target {self.target!r} is not a node type of {self.node_types}")
        if not any(dst == self.target for _, _, dst in self.edge_types):
            raise ValueError(f"no relation points to the target type {self.target!r}")
        unknown_outputs = [key for key in self.outputs if key not in self.node_types]
        if unknown_outputs:
            raise ValueError(f"outputs {unknown_outputs} are not node types of {self.node_types}")
        for key in self.node_types:
            if self.in_dims.get(key, 0) == 0 and self.num_nodes.get(key, 0) <= 0:
                raise ValueError(
                    f"node type {key!r} has no features: give its node count in num_nodes "
                    "(each node gets a learned embedding)"
                )
        unknown = sorted(str(key) for key in self.edge_dims if key not in self.edge_types)
        if unknown:
            raise ValueError(f"edge_dims names relation(s) not in edge_types: {unknown}")
        if self.num_layers < 1 or self.hidden_dim % self.heads:
            raise ValueError(
                f"num_layers must be >= 1 and hidden_dim a multiple of heads; got "
                f"num_layers={self.num_layers}, hidden_dim={self.hidden_dim}, heads={self.heads}"
            )

    @property
    def output_types(self) -> tuple[str, ...]:
        """The node types the last layer computes: ``outputs``, else the target."""
        return self.outputs or (self.target,)


class HeteroRecipe(HeteroNodeModel):
    """A recipe: :meth:`forward_types` gives the rows of every output type from one forward;
    as a node model it answers its target's."""

    def forward_types(self, inputs: HeteroInput) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """``(output, embedding)`` rows of each of ``spec.output_types``."""
        raise NotImplementedError

    def forward_with_embedding(self, inputs: HeteroInput) -> tuple[Tensor, Tensor]:
        out, embedding = self.forward_types(inputs)
        return out[self.target], embedding[self.target]


def build_hetero_model(arch: str | HeteroArch, spec: HeteroSpec) -> HeteroRecipe:
    """The untrained recipe ``arch`` for the graph and sizes of ``spec``."""
    arch = HeteroArch.parse(arch)
    if arch is HeteroArch.RGCN:
        return HeteroRGCN(spec)
    if arch is HeteroArch.HGT:
        return HeteroHGT(spec)
    return RelationStack(arch, spec)


class TypeEncoder(torch.nn.Module):
    """Each type's rows at ``hidden_dim``: a Linear of its features, or a featureless type's
    learned embedding of its ``n_id``."""

    def __init__(self, spec: HeteroSpec) -> None:
        super().__init__()
        self.lins = torch.nn.ModuleDict()
        self.embeddings = torch.nn.ModuleDict()
        self.types = {module_key(key): key for key in spec.node_types}
        for key in spec.node_types:
            width = spec.in_dims.get(key, 0)
            if width:
                self.lins[module_key(key)] = Linear(width, spec.hidden_dim)
            else:
                self.embeddings[module_key(key)] = torch.nn.Embedding(
                    spec.num_nodes[key], spec.hidden_dim
                )

    def forward(self, inputs: HeteroInput) -> dict[str, Tensor]:
        out = {}
        for key, lin in self.lins.items():
            out[self.types[key]] = lin(inputs.x_dict[self.types[key]])
        for key, emb in self.embeddings.items():
            out[self.types[key]] = emb(inputs.n_id_dict[self.types[key]])
        return out


class DegreeGCNConv(MessagePassing):
    """``GCNConv(add_self_loops=False)`` that also runs on a relation between two types:
    edge ``j -> i`` weighs ``deg(j)^-1/2 deg(i)^-1/2``, ``deg`` a node's in-degree over all
    relations (on a one-type graph exactly GCNConv's). The weights come in as
    ``inv_sqrt_degree`` per side, computed once per forward."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__(aggr="add")
        self.lin = Linear(in_channels, out_channels, bias=False, weight_initializer="glorot")
        self.bias = torch.nn.Parameter(torch.zeros(out_channels))

    def forward(
        self,
        x: Tensor | tuple[Tensor, Tensor],
        edge_index: Tensor,
        inv_sqrt_degree: Tensor | tuple[Tensor, Tensor],
    ) -> Tensor:
        x_src, x_dst = x if isinstance(x, tuple) else (x, x)
        norm_src, norm_dst = (
            inv_sqrt_degree if isinstance(inv_sqrt_degree, tuple) else (inv_sqrt_degree,) * 2
        )
        weight = norm_src[edge_index[0]] * norm_dst[edge_index[1]]
        out = self.propagate(
            edge_index,
            x=self.lin(x_src),
            weight=weight,
            size=(x_src.size(0), x_dst.size(0)),
        )
        return out + self.bias

    def message(self, x_j: Tensor, weight: Tensor) -> Tensor:
        return weight.unsqueeze(-1) * x_j


def inv_sqrt_in_degree(inputs: HeteroInput) -> dict[str, Tensor]:
    """``deg^-1/2`` of each row's in-degree over all relations (0 where it has none, as
    PyG's ``gcn_norm``)."""
    degree = {
        key: torch.zeros(n_id.numel(), device=n_id.device) for key, n_id in inputs.n_id_dict.items()
    }
    for (_, _, dst), edge_index in inputs.edge_index_dict.items():
        # index_add_, not bincount: bincount sizes its output by the data, a host read that no
        # CUDA graph captures (handler.gpu.captured_forward).
        ones = torch.ones(edge_index.size(1), device=edge_index.device)
        degree[dst].index_add_(0, edge_index[1], ones)
    return {key: deg.rsqrt().masked_fill_(deg == 0, 0.0) for key, deg in degree.items()}


class RelationStack(HeteroRecipe):
    """``num_layers`` layers of one conv per relation (``sage``, ``gat``, ``gcn``, ``gin``),
    summed per destination type, plus a root Linear per type; ReLU and dropout between layers.
    The last layer computes the output types only. Embedding: their input of the last layer."""

    def __init__(self, arch: HeteroArch, spec: HeteroSpec) -> None:
        super().__init__()
        hashed = [key for key in spec.node_types if "#" in key]
        hashed += [relation for _, relation, _ in spec.edge_types if "#" in relation]
        if hashed:
            raise ValueError(
                f"--arch {arch.value} cannot train on the name {hashed[0]!r}: PyG's HeteroConv "
                "reads '#' in a type or relation name back as '.'; rename it, or use --arch "
                "rgcn or hgt"
            )
        self.arch, self.target, self.dropout = arch, spec.target, spec.dropout
        self.hops = spec.num_layers
        self.outputs = spec.output_types
        reads_edges = arch in (HeteroArch.GAT, HeteroArch.GIN) and any(spec.edge_dims.values())
        self.serving_needs = ServingNeeds(
            edge_input=EdgeInput.EDGE_ATTR if reads_edges else EdgeInput.NONE,
            boundary_degrees=arch is HeteroArch.GCN,
        )
        self.encoder = TypeEncoder(spec)
        self.convs = torch.nn.ModuleList()
        self.roots = torch.nn.ModuleList()
        hidden = spec.hidden_dim
        for layer in range(spec.num_layers):
            last = layer == spec.num_layers - 1
            out = spec.num_classes if last else hidden
            types = spec.output_types if last else spec.node_types
            relations = [key for key in spec.edge_types if key[2] in types]
            convs = {
                key: _relation_conv(arch, spec, hidden, out, last, spec.edge_dims.get(key))
                for key in relations
            }
            with warnings.catch_warnings():  # of types no relation updates: the roots do
                warnings.filterwarnings("ignore", "There exist node types")
                self.convs.append(HeteroConv(convs, aggr="sum"))
            self.roots.append(
                torch.nn.ModuleDict({module_key(key): Linear(hidden, out) for key in types})
            )

    def _by_name(self, roots: torch.nn.Module) -> dict[str, torch.nn.Module]:
        """A layer's root Linears by node type name (they are stored under `module_key`)."""
        assert isinstance(roots, torch.nn.ModuleDict)
        return {self.encoder.types[key]: root for key, root in roots.items()}

    def forward_types(self, inputs: HeteroInput) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        if inputs.num_sampled_nodes_dict is not None and self.arch is not HeteroArch.GCN:
            return self._trimmed(inputs)
        x = self.encoder(inputs)
        extra: dict[str, Any] = {}
        if self.arch is HeteroArch.GCN:
            extra["inv_sqrt_degree_dict"] = inv_sqrt_in_degree(inputs)
        elif self.serving_needs.edge_input is EdgeInput.EDGE_ATTR:
            extra["edge_attr_dict"] = inputs.edge_attr_dict
        for layer, (conv, stored) in enumerate(zip(self.convs, self.roots, strict=True)):
            embedding = {key: x[key] for key in self.outputs}
            messages = conv(x, inputs.edge_index_dict, **extra)
            roots = self._by_name(stored)
            x = {
                key: roots[key](x[key]) + messages[key] if key in messages else roots[key](x[key])
                for key in roots
            }
            if layer < len(self.convs) - 1:
                x = {
                    key: F.dropout(value.relu(), self.dropout, self.training)
                    for key, value in x.items()
                }
        return x, embedding

    def _trimmed(self, inputs: HeteroInput) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """The same layers on a sampled ego-graph, each computing only the rows a seed's
        answer reads (PyG's ``trim_to_layer``): layer ``l`` of ``L`` reads the rows within
        ``L - l`` hops and computes those within ``L - l - 1``, from the edges into them (rows
        and edges are in hop order, so each is a prefix of its type's or relation's)."""
        nodes, edges = inputs.num_sampled_nodes_dict, inputs.num_sampled_edges_dict
        assert nodes is not None and edges is not None
        within = {key: list(itertools.accumulate(counts)) for key, counts in nodes.items()}
        edges_within = {key: list(itertools.accumulate(counts)) for key, counts in edges.items()}
        x = self.encoder(inputs)
        layers = len(self.convs)
        for layer, (conv, stored) in enumerate(zip(self.convs, self.roots, strict=True)):
            depth = layers - layer - 1  # the hop of the deepest row this layer computes
            embedding = {key: x[key][: within[key][depth]] for key in self.outputs}
            roots = self._by_name(stored)
            assert isinstance(conv, HeteroConv)
            x_dst = {key: x[key][: within[key][depth]] for key in roots}
            into = {
                triple: inputs.edge_index_dict[triple][:, : edges_within[triple][depth]]
                for triple, _conv in conv.convs.items()
            }
            if self.arch is HeteroArch.SAGE:
                x = _sage_layer(conv, roots, x, x_dst, into)
            else:
                x = self._summed_layer(
                    conv, roots, x, x_dst, into, inputs, within, edges_within, depth
                )
            if layer < layers - 1:
                x = {
                    key: F.dropout(value.relu(), self.dropout, self.training)
                    for key, value in x.items()
                }
        return x, embedding

    def _summed_layer(
        self,
        conv: HeteroConv,
        roots: dict[str, torch.nn.Module],
        x: dict[str, Tensor],
        x_dst: dict[str, Tensor],
        edges: dict[EdgeType, Tensor],
        inputs: HeteroInput,
        within: dict[str, list[int]],
        edges_within: dict[EdgeType, list[int]],
        depth: int,
    ) -> dict[str, Tensor]:
        """Each relation's conv on its trimmed edges, summed per destination as HeteroConv
        sums them, plus the root as the whole-graph pass adds it."""
        reads_edges = self.serving_needs.edge_input is EdgeInput.EDGE_ATTR
        messages: dict[str, list[Tensor]] = {}
        for triple, relation_conv in conv.convs.items():
            src, _, dst = triple
            kwargs = {}
            if reads_edges and triple in inputs.edge_attr_dict:
                kwargs["edge_attr"] = inputs.edge_attr_dict[triple][: edges_within[triple][depth]]
            sources = x[src][: within[src][depth + 1]]
            message = relation_conv((sources, x_dst[dst]), edges[triple], **kwargs)
            messages.setdefault(dst, []).append(message)
        return {
            key: root(x_dst[key]) + torch.stack(messages[key]).sum(dim=0)
            if key in messages
            else root(x_dst[key])
            for key, root in roots.items()
        }


def _sage_layer(
    conv: HeteroConv,
    roots: dict[str, torch.nn.Module],
    x: dict[str, Tensor],
    x_dst: dict[str, Tensor],
    edges: dict[EdgeType, Tensor],
) -> dict[str, Tensor]:
    """A layer of ``SAGEConv`` per relation summed per destination, plus its root, as one
    matrix product per destination type: each relation's mean of its sources (SAGEConv's own
    aggregation) and the destination's rows side by side, times the relations' ``lin_l``
    weights and the sum of their ``lin_r`` and the root's. The per-relation sum up to float
    rounding, in a few operations instead of five per relation (the served path's cost)."""
    out = {}
    for key, root in roots.items():
        parts, weights = [], []
        own, bias = root.weight, root.bias
        assert isinstance(bias, Tensor)
        for triple, relation_conv in conv.convs.items():
            src, _, dst = triple
            if dst != key:
                continue
            source, target = edges[triple]
            rows = x[src].index_select(0, source)
            parts.append(scatter(rows, target, 0, x_dst[key].size(0), reduce="mean"))
            weights.append(relation_conv.lin_l.weight)
            own = own + relation_conv.lin_r.weight
            bias = bias + relation_conv.lin_l.bias
        parts.append(x_dst[key])
        weights.append(own)
        out[key] = F.linear(torch.cat(parts, dim=1), torch.cat(weights, dim=1), bias)
    return out


def _relation_conv(
    arch: HeteroArch, spec: HeteroSpec, hidden: int, out: int, last: bool, edge_dim: int | None
) -> MessagePassing:
    """One relation's conv from ``hidden``-wide rows to ``out`` (``edge_dim``: its edge
    features, read by ``gat`` and ``gin``)."""
    if arch is HeteroArch.SAGE:
        return SAGEConv((hidden, hidden), out)
    if arch is HeteroArch.GCN:
        return DegreeGCNConv(hidden, out)
    if arch is HeteroArch.GAT:
        heads = spec.heads
        return GATConv(
            (hidden, hidden),
            out if last else out // heads,
            heads=heads,
            concat=not last,
            add_self_loops=False,
            edge_dim=edge_dim or None,
        )
    mlp = MLP([hidden, hidden, out], norm=None)
    return GINEConv(mlp, edge_dim=edge_dim) if edge_dim else GINConv(mlp)


class HeteroRGCN(HeteroRecipe):
    """R-GCN (``RGCNConv``, mean per relation, root weight) on the graph's homogeneous form,
    rows of each type in ``node_types`` order; ReLU and dropout between layers. Embedding: the
    output types' input of the last layer."""

    def __init__(self, spec: HeteroSpec) -> None:
        super().__init__()
        self.target, self.dropout = spec.target, spec.dropout
        self.hops = spec.num_layers
        self.outputs = spec.output_types
        self.node_types, self.edge_types = spec.node_types, spec.edge_types
        self.serving_needs = ServingNeeds()
        self.encoder = TypeEncoder(spec)
        sizes = [spec.hidden_dim] * spec.num_layers + [spec.num_classes]
        self.convs = torch.nn.ModuleList(
            RGCNConv(sizes[i], sizes[i + 1], len(spec.edge_types), aggr="mean")
            for i in range(spec.num_layers)
        )

    def forward_types(self, inputs: HeteroInput) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        x_dict = self.encoder(inputs)
        counts = [x_dict[key].size(0) for key in self.node_types]
        starts = dict(zip(self.node_types, itertools.accumulate([0, *counts[:-1]]), strict=True))
        x = torch.cat([x_dict[key] for key in self.node_types])
        edge_index = torch.cat(
            [
                inputs.edge_index_dict[key]
                + torch.tensor([[starts[key[0]]], [starts[key[2]]]], device=x.device)
                for key in self.edge_types
            ],
            dim=1,
        )
        edge_type = torch.cat(
            [
                torch.full((inputs.edge_index_dict[key].size(1),), i, device=x.device)
                for i, key in enumerate(self.edge_types)
            ]
        )
        for conv in self.convs[:-1]:
            x = F.dropout(conv(x, edge_index, edge_type).relu(), self.dropout, self.training)
        out = self.convs[-1](x, edge_index, edge_type)
        rows = {key: slice(starts[key], starts[key] + x_dict[key].size(0)) for key in self.outputs}
        return (
            {key: out[part] for key, part in rows.items()},
            {key: x[part] for key, part in rows.items()},
        )


class HeteroHGT(HeteroRecipe):
    """HGT (``HGTConv``) layers, then a Linear to classes on the output types' rows. A type
    no relation points to keeps its rows between layers (HGTConv returns none for it).
    Embedding: the output types' last hidden rows (the Linear's input)."""

    def __init__(self, spec: HeteroSpec) -> None:
        super().__init__()
        self.target, self.dropout = spec.target, spec.dropout
        self.hops = spec.num_layers
        self.outputs = spec.output_types
        self.serving_needs = ServingNeeds()
        self.encoder = TypeEncoder(spec)
        # HGTConv keys its own ModuleDicts by node type: it sees the types' module_keys.
        metadata = (
            [module_key(key) for key in spec.node_types],
            [_keyed_edge(key) for key in spec.edge_types],
        )
        self.convs = torch.nn.ModuleList(
            HGTConv(spec.hidden_dim, spec.hidden_dim, metadata, heads=spec.heads)
            for _ in range(spec.num_layers)
        )
        self.head = Linear(spec.hidden_dim, spec.num_classes)

    def forward_types(self, inputs: HeteroInput) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        x = {module_key(key): value for key, value in self.encoder(inputs).items()}
        edge_index = {_keyed_edge(key): value for key, value in inputs.edge_index_dict.items()}
        for conv in self.convs:
            out = conv(x, edge_index)
            x = {
                key: F.dropout(out[key], self.dropout, self.training)
                if out.get(key) is not None
                else value
                for key, value in x.items()
            }
        return {key: self.head(x[module_key(key)]) for key in self.outputs}, {
            key: x[module_key(key)] for key in self.outputs
        }
