"""Served models: the contract (``contract.py``), the one factory that builds every served
model (``factory.py``), and here the adapter of a user's node model and the rules the
adapters share.

A node model's forward on a graph of one type is ``forward(x, edge_index, degree=None,
level_sizes=None, edge_attr=None, hop_edges=None) -> rows`` on a sampled ego-graph (or the
whole graph when ``level_sizes`` is None), ``hop_edges`` being the edges into each hop as the
sampler knows them (None: counted from ``edge_index``, a read of its data on the host that a
CUDA graph cannot capture): the presets (``model.architectures``) implement it themselves; the
user's class gets it from :class:`UserNodeModel`, a thin adapter that calls PyG's own
signature, ``forward(x, edge_index)`` plus ``edge_attr`` or ``edge_weight`` where the model
takes them."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch_geometric.nn import MessagePassing
from torch_geometric.nn.models.basic_gnn import BasicGNN

from model.chebconv import chebconv_layers, graph_degrees, scales_by_largest_degree
from model.config import Task
from model.served.capture import with_input_of
from model.served.contract import Mode, OneNodeType, Plan, ServedModel, ServingNeeds, served
from model.trimmed import gnn_layer, known_hop_edges, trimmed_forward, trims_by_rows
from model.user_model import EdgeInput, Output, UserModelConfig

_METHOD = "method:"

# Layers that normalise a message by its source's degree (PyG's gcn_norm and the like): on an
# ego-graph the deepest hop's degrees must be the graph's (SampledSubgraph.boundary).
_SOURCE_DEGREE_LAYERS = (
    "GCNConv",
    "SGConv",
    "APPNP",
    "TAGConv",
    "ARMAConv",
    "GCN2Conv",
    "LGConv",
    "SSGConv",
    "FAConv",
    "ChebConv",
    "ClusterGCNConv",
    "MixHopConv",
)


def tell_largest_degree(model: torch.nn.Module, largest: Callable[[], int]) -> None:
    """Where ``model``'s ChebConv scales by the graph's largest out-degree
    (``ServingNeeds.largest_degree``), sets it to ``largest()`` of the graph version about to
    be read (asked only then: on a graph in Redis it is a read of every node's degrees)."""
    if serving_needs(model).largest_degree:
        told: Any = model  # UserNodeModel, UserLinkModel: their largest_degree
        told.largest_degree = largest()


def answer_rows(rows: Tensor, output: Output) -> Tensor:
    """The model's rows as answers carry them: softmax of logits, anything else as it is."""
    rows = rows.float()
    return torch.softmax(rows, dim=-1) if output is Output.LOGITS else rows


def serving_needs(model: torch.nn.Module) -> ServingNeeds:
    """What ``model`` declares it needs (the contract's ``serving_needs``, no default: a
    module outside the contract is a TypeError)."""
    return served(model).serving_needs


class UserAdapter(OneNodeType, torch.nn.Module):
    """The user's module behind the contract (its weights under ``module.``), with the build's
    settings; its hops are the config's ``num_layers``."""

    def __init__(self, module: torch.nn.Module, config: UserModelConfig) -> None:
        super().__init__()
        self.module = module
        self.config = config
        self.hops = config.num_layers


class UserNodeModel(UserAdapter):
    """The user's module behind the served-model contract (its weights under ``module.``)."""

    task = Task.NODE

    def __init__(self, module: torch.nn.Module, config: UserModelConfig) -> None:
        super().__init__(module, config)
        self.has_embedding = bool(config.embedding)
        self._chebconv = bool(chebconv_layers(module))
        self.serving_needs = ServingNeeds(
            output=config.output,
            edge_input=config.edge_input,
            boundary_degrees=config.boundary_degrees,
            out_degrees=self._chebconv,
            largest_degree=scales_by_largest_degree(module),
        )
        # The graph's largest out-degree (model.chebconv): the build's, then the served
        # graph version's, set before each forward (ServingNeeds.largest_degree).
        self.largest_degree = config.max_degree
        # The presets' fast path (bipartite layers, fewer rows each layer) where it applies.
        self._by_rows = (
            config.trim
            and isinstance(module, BasicGNN)
            and trims_by_rows(module)
            and config.edge_input is not EdgeInput.EDGE_WEIGHT
        )

    def forward(
        self,
        x: Tensor,
        edge_index: Tensor,
        degree: Tensor | None = None,
        level_sizes: Sequence[int] | None = None,
        edge_attr: Tensor | None = None,
        hop_edges: Sequence[int] | None = None,
    ) -> Tensor:
        """The module's rows; ``degree`` is not the user's business (boundary degrees come in
        the ego-graph's edges) except for ChebConv's Laplacian (``model.chebconv``),
        ``level_sizes`` (and ``hop_edges``) trim a ``BasicGNN`` layer by layer."""
        module = self.module
        if level_sizes is not None and self._by_rows:
            assert isinstance(module, BasicGNN)
            if len(level_sizes) > module.num_layers:  # every layer has a hop to read
                return trimmed_forward(module, x, edge_index, level_sizes, edge_attr, hop_edges)
        kwargs = edge_kwargs(self.config.edge_input, edge_attr)
        rows = x.size(0)
        if level_sizes is not None and self.config.trim:
            kwargs["num_sampled_nodes_per_hop"] = list(level_sizes)
            kwargs["num_sampled_edges_per_hop"] = known_hop_edges(
                edge_index, level_sizes, hop_edges
            )
            rows = level_sizes[0]  # trimmed: the seeds' rows come first, the rest may not
        with self.graph_degrees(degree):
            out = module(x, edge_index, **kwargs)
        if not isinstance(out, Tensor) or out.dim() != 2 or out.size(0) < rows:
            raise ValueError(
                f"{type(self.module).__name__}.forward must return one row per node, a "
                f"[{x.size(0)}, C] tensor; it returned {_shape(out)}"
            )
        return out

    def graph_degrees(self, degree: Tensor | None) -> AbstractContextManager[None]:
        """Where the module reads the graph's degrees rather than the ego-graph's (ChebConv's
        Laplacian, ``model.chebconv``), ``degree`` (one per row) within the block."""
        if degree is None or not self._chebconv:
            return nullcontext()
        return graph_degrees(self.module, degree, self.largest_degree)

    def forward_with_embedding(
        self,
        x: Tensor,
        edge_index: Tensor,
        degree: Tensor | None = None,
        edge_attr: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """``(output, embedding)`` per row of ``x`` from one forward pass: the input of the
        submodule the build named, or what the method named by ``--embedding-method``
        returns."""
        name = self.config.embedding
        if not name:
            raise ValueError(f"no embedding was named for {type(self.module).__name__}")
        if name.startswith(_METHOD):
            method = getattr(self.module, name.removeprefix(_METHOD))
            extra = edge_kwargs(self.config.edge_input, edge_attr)
            output = self(x, edge_index, degree=degree, edge_attr=edge_attr)
            with self.graph_degrees(degree):
                return output, method(x, edge_index, **extra)
        layer = self.module.get_submodule(name)
        return with_input_of(layer, lambda: self(x, edge_index, degree=degree, edge_attr=edge_attr))

    def layer(
        self,
        index: int,
        x: Tensor,
        edge_index: Tensor,
        rows: int,
        degree: Tensor | None = None,
        edge_attr: Tensor | None = None,
    ) -> Tensor:
        """Layer ``index`` of the module (a ``BasicGNN`` whose plan is per-layer rows) for the
        first ``rows`` rows of ``x``: the presets' rule, ``model.trimmed.gnn_layer``."""
        module = self.module
        assert isinstance(module, BasicGNN), "per-layer rows are a BasicGNN's"
        return gnn_layer(module, index, x, rows, edge_index, edge_attr)

    def precompute_plan(self) -> Plan:
        """Per-layer rows for a ``BasicGNN`` whose layers compute by rows, with no degree
        normalisation and edge features (if any) read as ``edge_attr``; every node's output
        otherwise."""
        module, config = self.module, self.config
        name = type(module).__name__
        why_not = not_by_layers(module, config.edge_input, config.boundary_degrees)
        if why_not is not None:
            return output_plan(name, why_not, config.num_layers, config.boundary_degrees)
        assert isinstance(module, BasicGNN)
        layers = module.num_layers
        edge_attr = config.edge_input is EdgeInput.EDGE_ATTR
        return Plan(
            mode=Mode.LAYERS,
            reason=(
                f"per-layer rows: {name} is a torch_geometric.nn.models model whose {layers} "
                "layers compute by rows, with no degree normalisation"
                + (" (their edge features read by edge ID)" if edge_attr else "")
            ),
            hops=layers,
            stack=self,
            edge_attr=edge_attr,
            stored_embedding=config.embedding == f"convs.{layers - 1}",
        )

    def rows_of(self, node_type: str) -> ServedModel:
        raise ValueError(f"{type(self.module).__name__} reads a graph of one node type")


def output_plan(name: str, why_not: str, hops: int, degree: bool) -> Plan:
    """Every node's output, recomputed from its whole in-neighbourhood (``model.in_closure``):
    the plan of a one-type model that is not a stack of by-rows layers."""
    return Plan(
        mode=Mode.OUTPUT,
        reason=(
            f"every node's output: {name} {why_not}; an update recomputes the outputs within "
            f"{hops} hops downstream of what it changed, each from its whole {hops}-hop "
            "in-neighbourhood"
        ),
        hops=hops,
        degree=degree,
    )


def not_by_layers(
    module: torch.nn.Module, edge_input: EdgeInput, boundary_degrees: bool
) -> str | None:
    """Why ``module`` is not stored layer by layer, or None when it is."""
    if not isinstance(module, BasicGNN):
        return "is not a torch_geometric.nn.models model (a stack of layers run one at a time)"
    if module.jk_mode is not None:
        return f"has jumping knowledge (jk={module.jk_mode!r}), which reads every layer's rows"
    kinds = ", ".join(sorted({type(conv).__name__ for conv in module.convs}))
    if boundary_degrees:
        return f"normalises messages by their sources' degrees ({kinds})"
    if not trims_by_rows(module):
        norms = ", ".join(sorted({type(norm).__name__ for norm in module.norms}))
        return (
            f"has layers ({kinds}; norms {norms}) that do not compute a destination's row "
            "from its in-neighbours' rows alone"
        )
    if edge_input is EdgeInput.EDGE_WEIGHT:
        return "reads its edge feature as edge_weight"
    return None


def edge_kwargs(edge_input: EdgeInput, edge_attr: Tensor | None) -> dict[str, Any]:
    """The forward's edge-feature keyword, if the model takes one."""
    if edge_input is EdgeInput.NONE or edge_attr is None:
        return {}
    if edge_input is EdgeInput.EDGE_WEIGHT:
        return {"edge_weight": edge_attr.reshape(-1)}
    return {"edge_attr": edge_attr}


def _shape(value: object) -> str:
    if isinstance(value, Tensor):
        return f"a tensor of shape {list(value.shape)}"
    return f"a {type(value).__name__}"


def choose_edge_input(
    module: torch.nn.Module, edge_dim: int, asked: str, method: str = "forward"
) -> EdgeInput:
    """``asked`` (``auto``, ``edge_attr``, ``edge_weight``, ``none``) checked against the
    model's ``method`` (``forward``; a link model's ``encode``) and the graph; ``auto``:
    ``edge_attr`` where the method takes it (a ``BasicGNN`` only when its layers use it), none
    where it takes no edge input. A method that takes only ``edge_weight`` on a graph with edge
    features is refused under ``auto``: whether it was trained with weights is the user's to
    say, and guessing either way would serve another model."""
    parameters = inspect.signature(getattr(module, method)).parameters
    takes_attr = "edge_attr" in parameters
    takes_weight = "edge_weight" in parameters
    if isinstance(module, BasicGNN) and method == "forward":  # edge_dim layers read them
        takes_attr = module.supports_edge_attr and any(
            getattr(conv, "edge_dim", None) for conv in module.convs
        )
        takes_weight = module.supports_edge_weight
    if asked == "none" or edge_dim == 0:
        if asked not in ("none", "auto"):
            raise ValueError(f"--edge-input {asked}: the graph has no edge features")
        return EdgeInput.NONE
    if asked == "auto":
        if takes_attr:
            return EdgeInput.EDGE_ATTR
        if takes_weight:
            raise ValueError(
                f"{type(module).__name__}.{method} takes edge_weight and the graph has "
                f"{edge_dim} edge feature(s): say whether the model was trained with them, "
                "--edge-input edge_weight (a graph with exactly one edge feature column) or "
                "--edge-input none"
            )
        return EdgeInput.NONE
    chosen = EdgeInput(asked)
    takes = takes_attr if chosen is EdgeInput.EDGE_ATTR else takes_weight
    if not takes:
        raise ValueError(f"--edge-input {asked}: {type(module).__name__}.{method} takes no {asked}")
    if chosen is EdgeInput.EDGE_WEIGHT and edge_dim != 1:
        raise ValueError(
            f"--edge-input edge_weight needs exactly one edge feature, the graph has {edge_dim}"
        )
    return chosen


@dataclass(frozen=True)
class Probe:
    """What one forward of the module on a small graph shows about it."""

    steps: int  # message-passing steps along the forward (propagate calls)
    last_layer: str  # name of the last message-passing module called ("" if none)
    out_dim: int
    source_degrees: bool  # a layer normalises by its sources' degrees


def probe(
    module: torch.nn.Module,
    in_dim: int,
    edge_dim: int,
    edge_input: EdgeInput,
    method: str = "forward",
) -> Probe:
    """Runs the module's ``method`` (``forward``; a link model's ``encode``) once on a small
    random graph, counting message-passing steps (``propagate`` calls: SGConv and APPNP make K
    of them) and noting the last layer called."""
    calls: list[str] = []
    names = {id(sub): name for name, sub in module.named_modules()}
    handles = []
    for sub in module.modules():
        if isinstance(sub, MessagePassing):
            name = names[id(sub)]
            handles.append(
                sub.register_propagate_forward_hook(
                    lambda _m, _inputs, _out, name=name: calls.append(name)
                )
            )
    generator = torch.Generator().manual_seed(0)
    nodes = 8
    edge_index = torch.tensor([[i for i in range(nodes)], [(i + 1) % nodes for i in range(nodes)]])
    x = torch.randn(nodes, in_dim, generator=generator)
    edge_attr = torch.rand(edge_index.size(1), max(edge_dim, 1), generator=generator)[:, :edge_dim]
    try:
        with torch.no_grad():
            call = module if method == "forward" else getattr(module, method)
            out = call(x, edge_index, **edge_kwargs(edge_input, edge_attr if edge_dim else None))
    except Exception as error:
        raise ValueError(
            f"{type(module).__name__}.{method}(x, edge_index"
            f"{', ' + edge_input.value if edge_input is not EdgeInput.NONE else ''}) failed on "
            f"a small graph with {in_dim} node features: {type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else ''}"
        ) from None
    finally:
        for handle in handles:
            handle.remove()
    if not isinstance(out, Tensor) or out.dim() != 2 or out.size(0) != nodes:
        raise ValueError(
            f"{type(module).__name__}.{method} must return one row per node ([N, C]); it "
            f"returned {_shape(out)}"
        )
    kinds = {type(sub).__name__ for sub in module.modules()}
    degrees = bool(kinds & set(_SOURCE_DEGREE_LAYERS))
    for sub in module.modules():  # GCNConv(normalize=False) reads no degree
        if type(sub).__name__ == "GCNConv" and not getattr(sub, "normalize", True):
            degrees = bool((kinds - {"GCNConv"}) & set(_SOURCE_DEGREE_LAYERS))
    return Probe(
        steps=len(calls),
        last_layer=calls[-1] if calls else "",
        out_dim=int(out.size(1)),
        source_degrees=degrees,
    )


def trims(module: torch.nn.Module) -> bool:
    """PyG's trim-to-layer applies: a ``BasicGNN`` without jumping knowledge (whose layers
    would need every hop's rows)."""
    return isinstance(module, BasicGNN) and module.jk_mode is None
