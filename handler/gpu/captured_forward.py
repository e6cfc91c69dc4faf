"""The node model's forward without launch overhead: one CUDA graph per bucket of padded
ego-graphs, replayed for every batch that pads to it.

On a few hundred rows a forward is many small kernels, each launched by the host (0.7 ms for
94 rows on an H200, most of it launches). Padded ego-graphs (handler.gpu.padding) come in few
shapes; for each shape (:class:`BucketKey`) the forward is captured once into a CUDA graph, at
its first use, and a later batch of that shape is copied into the graph's input buffers and
replayed as one launch. Graphs are kept in a bounded LRU sharing one memory pool. A typed
model (graphs of several node types) is the same mechanism on other inputs: its ego-graph is
padded per type and relation, its key is a :class:`TypedBucketKey`, its input buffers every
tensor of its ``HeteroInput`` (:meth:`CapturedForward.typed`).

A forward that cannot be captured (a user's model that reads a tensor on the host, an op
CUDA graphs do not support) is found when its capture raises: one warning, and that model
runs eager from then on, with the same answers. On a CPU the forward always runs eager, on the
same padded inputs.

Usage::

    forward = CapturedForward(model, device, enabled=True, max_graphs=64)
    padded = pad_subgraph(sub)                    # CPU; its tensors may be moved to device
    x, degree = ego.gather(padded.sub.node)       # padding rows: node -1, zeros
    edge_attr = ego.edge_features(padded.sub.edge)
    rows = forward(padded, x, degree, edge_attr)  # [num_seeds, C], the seeds' rows

    padded = pad_typed(store, view, sub)          # typed: handler.graph.typed_ego
    rows = forward.typed(padded, inputs)          # inputs: HeteroInput gathered for padded
"""

from __future__ import annotations

import dataclasses
import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from handler.gpu.padding import PaddedSubgraph
from model.typed_batch import HeteroInput

logger = logging.getLogger(__name__)
aten = torch.ops.aten

DEFAULT_MAX_GRAPHS = 64

Replay = Callable[[], Tensor]
"""Runs the captured forward again on its input buffers; returns its output buffer."""

Capture = Callable[[Callable[[], Tensor]], Replay]
"""Captures ``forward`` (a call of the model on the input buffers) and returns its replay;
raises when the forward cannot be captured."""

# Ops that make the host wait for a device's data: they read a value, or size their output
# by the data.
_READS = {
    aten._local_scalar_dense,
    aten.item,  # as inference mode dispatches it, undecomposed
    aten.is_nonzero,
    aten.equal,
    aten.allclose,
    aten.nonzero,
    aten.masked_select,
    aten.bincount,
    aten._unique,
    aten._unique2,
    aten.unique_dim,
    aten.unique_consecutive,
}
_INDEXING = {aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_}
_COPIES = {aten._to_copy, aten.copy_, aten.to}


Key = TypeVar("Key")  # of a per-type or per-relation dict


class HostRead(RuntimeError):
    """An op of the forward reads tensor data on the host (a sync): no CUDA graph can
    capture it."""


class HostReads(TorchDispatchMode):
    """Raises :class:`HostRead` at the first op that reads data of a ``device_type`` tensor on
    the host: a scalar read (``item``, ``int``, ``bool``, ``==`` of tensors), an output sized
    by the data (``nonzero``, boolean-mask indexing, ``bincount``, ``unique``,
    ``repeat_interleave`` without ``output_size``) or a copy between host and device.

    Run before a capture, it names the op instead of a failed capture; with ``"cpu"`` it
    checks on a CPU that a forward would be capturable on a GPU."""

    def __init__(self, device_type: str) -> None:
        super().__init__()
        self.device_type = device_type

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if self._reads(func, args, kwargs):
            raise HostRead(f"{func} reads tensor data on the host")
        return func(*args, **kwargs)

    def _reads(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, Tensor)]
        indices = [
            index
            for a in args
            if isinstance(a, list | tuple)
            for index in a
            if isinstance(index, Tensor)
        ]
        on_device = any(t.device.type == self.device_type for t in tensors + indices)
        packet = func.overloadpacket
        if packet in _COPIES:
            devices = {t.device for t in tensors}
            target = kwargs.get("device")
            if target is not None:
                devices.add(torch.device(target))
            return len({d.type for d in devices}) > 1 and on_device
        if not on_device:
            return False
        if packet in _READS:
            return True
        if packet is aten.repeat_interleave:
            return isinstance(args[0], Tensor) and kwargs.get("output_size") is None
        if packet in _INDEXING:
            return any(index.dtype in (torch.bool, torch.uint8) for index in indices)
        return False


@dataclass(frozen=True)
class BucketKey:
    """The shape of a forward: every input's size, so one captured graph replays for all
    batches of the key (``num_seeds`` is not part of it: the seeds' rows are read out).

    Attributes:
        level_sizes: padded rows per level.
        hop_edges: padded edges into each hop.
        feature_width: node feature columns; ``edge_width``: edge feature columns, ``-1``
            without edge features.
        degree: whether degrees are given; ``boundary``: the last level is the boundary's.
        dtypes: of the features, edge features and degrees.
    """

    level_sizes: tuple[int, ...]
    hop_edges: tuple[int, ...]
    feature_width: int
    edge_width: int
    degree: bool
    boundary: bool
    dtypes: tuple[str, ...]

    @classmethod
    def of(
        cls,
        padded: PaddedSubgraph,
        x: Tensor,
        degree: Tensor | None,
        edge_attr: Tensor | None,
    ) -> BucketKey:
        """The key of one padded batch (ValueError when the inputs do not fit it)."""
        sub = padded.sub
        edge_width = -1 if edge_attr is None else _width(edge_attr)
        if x.size(0) != sub.num_nodes or (degree is not None and degree.size(0) != x.size(0)):
            raise ValueError(
                f"x and degree need one row per row of the padded ego-graph ({sub.num_nodes}), "
                f"got {x.size(0)} and {None if degree is None else degree.size(0)}"
            )
        if edge_attr is not None and edge_attr.size(0) != sub.num_edges:
            raise ValueError(
                f"edge_attr needs one row per edge of the padded ego-graph ({sub.num_edges}), "
                f"got {edge_attr.size(0)}"
            )
        return cls(
            level_sizes=sub.level_sizes,
            hop_edges=padded.hop_edges,
            feature_width=_width(x),
            edge_width=edge_width,
            degree=degree is not None,
            boundary=sub.boundary,
            dtypes=tuple(str(t.dtype) for t in (x, edge_attr, degree) if t is not None),
        )


def _width(t: Tensor) -> int:
    return int(t.size(1)) if t.dim() > 1 else 1


@dataclass(frozen=True)
class TypedBucketKey:
    """The shape of a typed model's forward (a graph of several node types): the padded rows
    of each type per level, edges of each relation per hop, and every input tensor's shape and
    dtype, in :func:`_flatten`'s order.

    Attributes:
        type_rows: ``[levels][types]`` padded rows (:attr:`PaddedSubgraph.type_rows`).
        relation_edges: ``[hops][relations]`` padded edges.
        boundary: the last level is the boundary's.
        shapes: ``(name, shape, dtype)`` of each input tensor.
    """

    type_rows: tuple[tuple[int, ...], ...]
    relation_edges: tuple[tuple[int, ...], ...]
    boundary: bool
    shapes: tuple[tuple[str, tuple[int, ...], str], ...]

    @classmethod
    def of(cls, padded: PaddedSubgraph, inputs: HeteroInput) -> TypedBucketKey:
        """The key of one padded typed batch (ValueError when ``padded`` is a one-type one)."""
        if padded.types is None:
            raise ValueError("a typed forward needs an ego-graph padded with its row types")
        names, tensors = _flatten(inputs)
        return cls(
            type_rows=padded.type_rows,
            relation_edges=padded.relation_edges,
            boundary=padded.sub.boundary,
            shapes=tuple(
                (name, tuple(t.shape), str(t.dtype)) for name, t in zip(names, tensors, strict=True)
            ),
        )


Bucket = BucketKey | TypedBucketKey


def _flatten(inputs: HeteroInput) -> tuple[list[str], list[Tensor]]:
    """Every tensor of ``inputs`` and its name, in one fixed order (features, node indices,
    edges, edge features; each dict in its own order)."""
    parts: list[tuple[str, Mapping[Any, Tensor]]] = [
        ("x", inputs.x_dict),
        ("n_id", inputs.n_id_dict),
        ("edge_index", inputs.edge_index_dict),
        ("edge_attr", inputs.edge_attr_dict),
    ]
    names = [f"{name}[{key}]" for name, values in parts for key in values]
    return names, [t for _, values in parts for t in values.values()]


def _unflatten(inputs: HeteroInput, tensors: Sequence[Tensor | None]) -> HeteroInput:
    """``inputs`` with its tensors replaced by ``tensors`` (in :func:`_flatten`'s order)."""
    given = iter(tensors)

    def take(values: Mapping[Key, Tensor]) -> dict[Key, Tensor]:
        out = {}
        for key in values:
            tensor = next(given)
            assert tensor is not None
            out[key] = tensor
        return out

    return dataclasses.replace(
        inputs,
        x_dict=take(inputs.x_dict),
        n_id_dict=take(inputs.n_id_dict),
        edge_index_dict=take(inputs.edge_index_dict),
        edge_attr_dict=take(inputs.edge_attr_dict),
    )


@dataclass
class _Inputs:
    """The input buffers a captured graph reads (None for an input the model is not given):
    each batch is copied into them."""

    buffers: tuple[Tensor | None, ...]

    @classmethod
    def like(cls, device: torch.device, tensors: Sequence[Tensor | None]) -> _Inputs:
        return cls(
            tuple(None if t is None else torch.empty_like(t, device=device) for t in tensors)
        )

    def fill(self, tensors: Sequence[Tensor | None]) -> None:
        for buffer, value in zip(self.buffers, tensors, strict=True):
            if buffer is not None and value is not None:
                buffer.copy_(value, non_blocking=True)


@dataclass
class _Graph:
    inputs: _Inputs
    replay: Replay


def cuda_graph_capture(device: torch.device) -> Capture:
    """Captures on ``device`` into one memory pool shared by every graph it makes (they run
    one at a time, on one stream). As torch's docs ask: warm-up on a side stream (the first
    run under :class:`HostReads`, so a forward that syncs fails before any capture), then the
    capture, whose errors concern this thread only."""
    pool = torch.cuda.graph_pool_handle()

    def capture(forward: Callable[[], Tensor]) -> Replay:
        with torch.cuda.device(device):
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                with HostReads(device.type):
                    forward()
                forward()
            torch.cuda.current_stream(device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                out = forward()

        def replay() -> Tensor:
            graph.replay()
            return out

        return replay

    return capture


class CapturedForward:
    """``model``'s forward on padded ego-graphs, captured per :class:`BucketKey` on a CUDA
    ``device`` (eager on a CPU, when ``enabled`` is False, or after a capture failed).

    ``max_graphs`` (default 64) bounds the graphs kept: the least recently used one is
    dropped, its memory going back to the shared pool. ``capture`` replaces the CUDA capture
    (tests inject one on a CPU)."""

    def __init__(
        self,
        model: torch.nn.Module,
        device: torch.device,
        enabled: bool = True,
        max_graphs: int = DEFAULT_MAX_GRAPHS,
        capture: Capture | None = None,
    ) -> None:
        if max_graphs < 1:
            raise ValueError(f"max_graphs must be at least 1, got {max_graphs}")
        self.model = model
        self.device = device
        self.max_graphs = max_graphs
        if capture is None and device.type == "cuda":
            capture = cuda_graph_capture(device)
        self._capture = capture if enabled else None
        self._graphs: OrderedDict[Bucket, _Graph] = OrderedDict()
        # Graphs captured so far, dropped ones included: more than the buckets a workload
        # has means max_graphs is too small for it (each capture costs milliseconds).
        self.captures = 0
        # Why the forward runs eager (None while it is captured).
        self.eager_reason: str | None = None
        if self._capture is None:
            self.eager_reason = "disabled" if not enabled else f"no CUDA graphs on {device}"

    @property
    def keys(self) -> list[Bucket]:
        """The buckets with a captured graph, least recently used first."""
        return list(self._graphs)

    def __call__(
        self,
        padded: PaddedSubgraph,
        x: Tensor,
        degree: Tensor | None = None,
        edge_attr: Tensor | None = None,
    ) -> Tensor:
        """The seeds' rows ``[num_seeds, C]`` (a tensor of their own, on the device) of the
        model on ``padded`` (CPU or device tensors), ``x``, ``degree`` and ``edge_attr``
        gathered for its rows and edges."""
        key = BucketKey.of(padded, x, degree, edge_attr)

        def forward(tensors: Sequence[Tensor | None]) -> Tensor:
            x, edge_index, degree, edge_attr = tensors
            assert x is not None and edge_index is not None
            out: Tensor = self.model(
                x,
                edge_index,
                degree=degree,
                level_sizes=padded.sub.level_sizes,
                edge_attr=edge_attr,
                hop_edges=padded.hop_edges,
            )
            return out

        tensors = (x, padded.sub.edge_index, degree, edge_attr)
        return self._run(key, padded.sub.num_seeds, tensors, forward)

    def typed(self, padded: PaddedSubgraph, inputs: HeteroInput) -> Tensor:
        """The seeds' rows ``[num_seeds, C]`` of a typed model (``HeteroNodeModel``: its
        rows are its target type's, the seeds their first) on ``padded`` (padded with its row
        types), ``inputs`` built from it on the device: captured per :class:`TypedBucketKey`
        as the one-type forward is per :class:`BucketKey`."""
        key = TypedBucketKey.of(padded, inputs)

        def forward(tensors: Sequence[Tensor | None]) -> Tensor:
            out: Tensor = self.model(_unflatten(inputs, tensors))
            return out

        return self._run(key, padded.sub.num_seeds, _flatten(inputs)[1], forward)

    def _run(
        self,
        key: Bucket,
        seeds: int,
        tensors: Sequence[Tensor | None],
        forward: Callable[[Sequence[Tensor | None]], Tensor],
    ) -> Tensor:
        """The first ``seeds`` rows of ``forward`` on ``tensors``: replayed from ``key``'s
        graph (captured now on its first use), eager on the device when none can be."""
        with torch.inference_mode():
            if self._capture is None:
                return self._eager(tensors, forward)[:seeds]
            graph = self._graphs.get(key)
            if graph is not None:
                self._graphs.move_to_end(key)
            else:
                try:
                    graph = self._new_graph(key, tensors, forward)
                except Exception as error:
                    # The eager forward raises the model's own error for an input it refuses.
                    rows = self._eager(tensors, forward)[:seeds]
                    self._give_up(error)
                    return rows
            graph.inputs.fill(tensors)
            # A copy: the next replay writes over the output buffer.
            return graph.replay()[:seeds].clone()

    def _eager(
        self,
        tensors: Sequence[Tensor | None],
        forward: Callable[[Sequence[Tensor | None]], Tensor],
    ) -> Tensor:
        return forward(
            [None if t is None else t.to(self.device, non_blocking=True) for t in tensors]
        )

    def _new_graph(
        self,
        key: Bucket,
        tensors: Sequence[Tensor | None],
        forward: Callable[[Sequence[Tensor | None]], Tensor],
    ) -> _Graph:
        """The graph of ``key``, captured on input buffers shaped like this batch's; the least
        recently used graph is dropped beyond ``max_graphs``."""
        assert self._capture is not None
        inputs = _Inputs.like(self.device, tensors)
        inputs.fill(tensors)
        graph = _Graph(inputs, self._capture(lambda: forward(inputs.buffers)))
        self.captures += 1
        self._graphs[key] = graph
        if len(self._graphs) > self.max_graphs:
            self._graphs.popitem(last=False)
        return graph

    def _give_up(self, error: Exception) -> None:
        """Eager from now on, said once."""
        self._capture = None
        self._graphs.clear()
        self.eager_reason = f"capture failed: {type(error).__name__}: {error}"
        logger.warning(
            "%s runs eager from now on: its forward could not be captured into a CUDA graph (%s)",
            type(self.model).__name__,
            self.eager_reason,
        )
