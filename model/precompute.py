"""Every node's representation, computed once at build time and served as is.

``./build_mar.sh --precompute`` stores one of two things in the archive's ``precomputed/``
(memory-mapped and checksummed like the graph), whichever :func:`plan_for` finds for the model:

- **Per-layer rows** (``layers`` mode), for a stack of message-passing layers that compute by
  rows: the presets, and a user's ``torch_geometric.nn.models`` ``BasicGNN`` whose layers run
  bipartite (``model.trimmed.trims_by_rows``), that needs no boundary degrees and reads edge
  features, if at all, as ``edge_attr``. The model runs one layer at a time over the whole
  graph (PyG's layer-wise ``BasicGNN.inference``): layer ``l`` of all nodes from layer ``l-1``
  of all nodes, in chunks of consecutive destination nodes whose in-edges fit a budget, so
  memory stays bounded whatever the graph's size. ``layer_<l>.npy``, float32 ``[N, d_l]`` for
  ``l = 1..L``: what layer ``l`` hands the next one (after the activation and norm);
  ``layer_<L>.npy`` is the model's output. Layer 0 is the graph's features. A row is
  recomputed with :func:`layer_rows` (``model.trimmed.gnn_layer``) from its in-neighbours' rows
  one layer below, here and when a live update refreshes the rows it reaches
  (``handler.graph.precomputed``): one rule, so a refreshed row equals a rebuilt one.
- **Every node's output** (``output`` mode), for any other model (custom modules, jumping
  knowledge, degree-normalising layers, PNA, a user's link model's ``encode``, every model of a
  graph of several node types): ``output.npy``, float32 ``[N, C]``, the model's own forward on
  the whole graph when it is small, else on each chunk's whole in-neighbourhood
  (``model.in_closure``), the rule live updates recompute outputs with. On a graph of one type
  ``N`` counts every node. On a typed graph the rows are those of the types answers read (a
  node model's target, a link model's two ends, ``Plan.types``), at their global indices
  (``N``: up to the last of them; rows of other types stay zero), each from its
  in-neighbourhood over every relation, split by type as a typed ego-graph is
  (``model.typed_rows``): a link model's rows are ``encode``'s of the node's type.

Beside them: ``out_indptr.npy`` / ``out_indices.npy``, the graph's edges grouped by source
(CSR), which an update follows to find the rows it reaches; ``meta.json``: format version,
mode, hops, the graph's checksum, the weights' sha256, dims, the files.

For an archive served from a graph in Redis, :func:`load_to_redis` loads the written rows and
out-lists beside the graph (``graph_assets.remote.rows``) and the archive keeps only
``meta.json``; :class:`Precomputed`'s reads (``read``, ``out_neighbours``, ``every_row``) go
there, one round per read, instead of to the memory maps.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from graph_assets.durable import fsync_path
from graph_assets.errors import StoreError
from graph_assets.remote.location import parse_location
from graph_assets.remote.reader import RemoteStore, open_remote_store
from graph_assets.remote.rows import RemoteRows, load_rows, read_meta, rows_id
from graph_assets.schema import GraphSchema
from graph_assets.stored.store import GraphStore, file_digests, open_recorded_array
from model.export import WEIGHTS_FILE
from model.in_closure import (
    Closure,
    OutDegrees,
    closure_chunks,
    closure_forward,
    in_closure,
    store_in_edges,
    typed_closure_forward,
)
from model.link_assets import out_csr
from model.served.contract import Mode, Plan, served
from model.user_model import EdgeInput

PRECOMPUTED_DIR = "precomputed"
FORMAT_VERSION = 1
META_FILE = "meta.json"
OUT_FILES = ("out_indptr.npy", "out_indices.npy")
OUTPUT_FILE = "output.npy"
# In-edges per chunk: the chunk's gathered input rows are at most this many, times the width.
# An output-mode build runs the whole graph's forward at once up to this many edges.
CHUNK_EDGES = 1 << 21
CHUNK_NODES = 1 << 18
_REBUILD = "rebuild the archive with ./build_mar.sh --precompute"


def plan_for(model: torch.nn.Module) -> Plan:
    """The model's plan (the contract's ``precompute_plan``): per-layer rows for a stack of
    by-rows layers (the presets, a link preset's encoder, a user's qualifying ``BasicGNN``),
    every node's output for any other node model and every node's embedding (``encode``) for
    a user's link model and any typed graph's link model. ValueError, one line, for a model
    whose rows are not precomputed."""
    plan = served(model).precompute_plan()
    if plan is None:
        raise ValueError(f"{type(model).__name__} has no node-level rows to precompute")
    return plan


def check_plan(precomputed: Precomputed, model: torch.nn.Module) -> Plan:
    """The model's plan, which must be the one the rows were built with (StoreError, one
    line ending in the rebuild command, otherwise)."""
    plan = plan_for(model)
    if plan.types and plan.types != precomputed.node_types:
        raise StoreError(
            f"{precomputed.path}: holds rows of {', '.join(precomputed.node_types)} nodes, the "
            f"archive's model reads {', '.join(plan.types)} nodes; {_REBUILD}"
        )
    if plan.mode is not precomputed.mode or plan.arrays != precomputed.num_layers:
        raise StoreError(
            f"{precomputed.path}: holds {_stored(precomputed.mode, precomputed.num_layers)}, "
            f"the archive's model needs {_stored(plan.mode, plan.arrays)}; {_REBUILD}"
        )
    return plan


def _stored(mode: Mode, arrays: int) -> str:
    return f"{arrays} layers' rows" if mode is Mode.LAYERS else "every node's output"


def layer_file(layer: int) -> str:
    return f"layer_{layer}.npy"


def weights_digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@dataclass(frozen=True)
class LocalGraph:
    """Some destination nodes' whole in-neighbourhoods with local rows: the destinations are
    rows ``0..rows-1`` of ``nodes`` (global indices), in order, the other sources follow."""

    nodes: np.ndarray
    edge_index: torch.Tensor
    rows: int


def range_in_neighbourhoods(indptr: np.ndarray, indices: np.ndarray, a: int, b: int) -> LocalGraph:
    """The in-neighbourhoods of nodes ``a..b-1`` of a CSC graph, edges in CSC order (edge IDs
    ``indptr[a]..indptr[b]-1``). Sources are numbered through a mask over all nodes, in
    O(nodes + edges): no sort of the chunk's edges."""
    start, end = int(indptr[a]), int(indptr[b])
    src = np.asarray(indices[start:end], dtype=np.int64)
    dst = np.repeat(np.arange(b - a, dtype=np.int64), np.diff(np.asarray(indptr[a : b + 1])))
    seen = np.zeros(len(indptr) - 1, dtype=bool)
    seen[src] = True
    seen[a:b] = False
    others = np.flatnonzero(seen)
    local_of = np.empty(len(indptr) - 1, dtype=np.int64)
    local_of[a:b] = np.arange(b - a)
    local_of[others] = np.arange(b - a, b - a + len(others))
    local = local_of[src]
    nodes = np.concatenate((np.arange(a, b, dtype=np.int64), others))
    edge_index = torch.from_numpy(np.stack((local, dst)))
    return LocalGraph(nodes=nodes, edge_index=edge_index, rows=b - a)


def chunks(indptr: np.ndarray, chunk_edges: int, chunk_nodes: int) -> Iterator[tuple[int, int]]:
    """Consecutive node ranges holding at most ``chunk_edges`` in-edges (or one node) and at
    most ``chunk_nodes`` nodes."""
    n = len(indptr) - 1
    a = 0
    while a < n:
        b = int(np.searchsorted(indptr, int(indptr[a]) + chunk_edges, side="right")) - 1
        b = min(max(b, a + 1), a + chunk_nodes, n)
        yield a, b
        a = b


def layer_rows(
    plan: Plan,
    index: int,
    graph: LocalGraph,
    below: np.ndarray,
    degree: np.ndarray | None,
    edge_attr: np.ndarray | None = None,
) -> np.ndarray:
    """Layer ``index`` (0-based) of ``plan``'s layers for the destinations of ``graph``;
    ``below``: the layer's input rows of ``graph.nodes``; ``degree``: their full-graph
    in-degrees (GCN); ``edge_attr``: the features of ``graph``'s edges (layers that read
    them)."""
    stack = plan.stack
    assert stack is not None, "layer rows are per-layer mode's"
    device = next(stack.parameters()).device
    x = torch.from_numpy(np.ascontiguousarray(below, dtype=np.float32)).to(device)
    deg = None if degree is None else torch.from_numpy(np.asarray(degree, dtype=np.float32))
    attr = None
    if plan.edge_attr and edge_attr is not None:
        attr = torch.from_numpy(np.ascontiguousarray(edge_attr, dtype=np.float32)).to(device)
    with torch.inference_mode():
        out = stack.layer(
            index,
            x,
            graph.edge_index.to(device),
            graph.rows,
            degree=None if deg is None else deg.to(device),
            edge_attr=attr,
        )
        return out.float().cpu().numpy()


def precompute(
    model: torch.nn.Module,
    store: GraphStore,
    out_dir: Path,
    weights_sha256: str,
    chunk_edges: int = CHUNK_EDGES,
    progress: bool = True,
) -> dict[str, Any]:
    """Writes ``out_dir`` (the archive's ``precomputed/``); returns its meta.json content."""
    model.eval()
    plan = plan_for(model)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if plan.mode is Mode.LAYERS:
        names, dims = _precompute_layers(plan, store, out, chunk_edges, progress)
    else:
        names, dims = _precompute_output(model, plan, store, out, chunk_edges, progress)
    out_indptr, out_indices = out_csr(store)
    for name, array in zip(OUT_FILES, (out_indptr, out_indices), strict=True):
        np.save(out / name, array, allow_pickle=False)
    files = {}
    for name in [*names, *OUT_FILES]:
        fsync_path(out / name)
        array = np.load(out / name, mmap_mode="r", allow_pickle=False)
        files[name] = {
            "dtype": array.dtype.str,
            "shape": list(array.shape),
            "bytes": (out / name).stat().st_size,
            **file_digests(out / name),
        }
    meta = {
        "format_version": FORMAT_VERSION,
        "mode": plan.mode.value,
        "hops": plan.hops,
        "graph_checksum": store.checksum,
        "weights_sha256": weights_sha256,
        "node_types": list(plan.types or (store.schema.target,)),
        "num_layers": len(dims),
        "dims": dims,
        "built_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "files": files,
    }
    (out / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def _precompute_layers(
    plan: Plan, store: GraphStore, out: Path, chunk_edges: int, progress: bool
) -> tuple[list[str], list[int]]:
    """``layer_<l>.npy`` for every layer, one layer over all nodes at a time."""
    n = store.num_nodes
    indptr, indices = np.asarray(store.indptr), np.asarray(store.indices)
    degree = store.degree_rows(np.arange(n)) if plan.degree else None
    edge_features = store.edge_features if plan.edge_attr else None
    below: np.ndarray = np.asarray(store.features)
    names, dims = [], []
    for index in range(plan.hops):
        name = layer_file(index + 1)
        width = _layer_width(plan, index, below, store.edge_feature_dim)
        rows = np.lib.format.open_memmap(out / name, mode="w+", dtype=np.float32, shape=(n, width))
        bar = tqdm(
            total=store.num_edges,
            desc=f"precompute layer {index + 1}",
            disable=None if progress else True,  # None: off when stderr is not a terminal
        )
        for a, b in chunks(indptr, chunk_edges, CHUNK_NODES):
            graph = range_in_neighbourhoods(indptr, indices, a, b)
            local_degree = None if degree is None else degree[graph.nodes]
            attr = None
            if edge_features is not None:
                attr = np.array(edge_features[int(indptr[a]) : int(indptr[b])])
            rows[a:b] = layer_rows(
                plan, index, graph, np.take(below, graph.nodes, axis=0), local_degree, attr
            )
            bar.update(int(indptr[b] - indptr[a]))
        bar.close()
        rows.flush()
        del rows
        below = np.load(out / name, mmap_mode="r", allow_pickle=False)
        names.append(name)
        dims.append(width)
    return names, dims


def _layer_width(plan: Plan, index: int, below: np.ndarray, edge_dim: int) -> int:
    """Output width of layer ``index``, from one node's forward (no edges)."""
    graph = LocalGraph(
        nodes=np.zeros(1, dtype=np.int64),
        edge_index=torch.empty(2, 0, dtype=torch.int64),
        rows=1,
    )
    degree = np.zeros(1) if plan.degree else None
    attr = np.zeros((0, edge_dim), dtype=np.float32)
    return int(layer_rows(plan, index, graph, np.array(below[:1]), degree, attr).shape[1])


def _precompute_output(
    model: torch.nn.Module,
    plan: Plan,
    store: GraphStore,
    out: Path,
    chunk_edges: int,
    progress: bool,
) -> tuple[list[str], list[int]]:
    """``output.npy``: for each stored type (:attr:`Plan.types`, or the one type), the forward
    of its nodes on every in-edge they read when the graph has at most ``chunk_edges`` edges,
    else chunks of consecutive nodes, each on its whole in-neighbourhood with the in-edges of
    its ``hops``-hop nodes too (``model.in_closure``: exact whether or not the model reads its
    sources' degrees, so the stored rows do not depend on that being detected), each
    neighbourhood within ``chunk_edges`` edges unless one node's alone is larger."""
    schema = store.schema
    types = plan.types or (schema.target,)
    read, levels = store_in_edges(store), plan.hops + 1
    stored: np.memmap | None = None
    total = sum(schema.node_type(name).num_nodes for name in types)
    bar = tqdm(total=total, desc="precompute outputs", disable=None if progress else True)
    for name in types:
        node_type = schema.node_type(name)
        seeds = np.arange(node_type.offset, node_type.stop, dtype=np.int64)
        parts: Iterator[Closure] = (
            iter([in_closure(read, seeds, levels)])
            if store.num_edges <= chunk_edges
            else closure_chunks(read, seeds, levels, chunk_edges)
        )
        for closure in parts:
            rows = _closure_rows(model, name, closure, store)
            if stored is None:
                shape = (stored_rows(schema, types), rows.shape[1])
                stored = np.lib.format.open_memmap(
                    out / OUTPUT_FILE, mode="w+", dtype=np.float32, shape=shape
                )
            first = int(closure.nodes[0])  # the seeds are consecutive nodes
            stored[first : first + closure.seeds] = rows
            bar.update(closure.seeds)
    bar.close()
    assert stored is not None
    width = int(stored.shape[1])
    stored.flush()
    del stored
    return [OUTPUT_FILE], [width]


def _closure_rows(
    model: torch.nn.Module, node_type: str, closure: Closure, store: GraphStore
) -> np.ndarray:
    """The seeds' output rows (of ``node_type``) of the model's own forward on ``closure`` of
    the stored graph (a typed graph's model on the closure split by type)."""
    contract = served(model)
    if contract.typed:
        rows, _ = typed_closure_forward(contract.rows_of(node_type), closure, store.schema, store)
        return rows
    x = np.take(store.features, closure.nodes, axis=0)
    reads_edges = contract.serving_needs.edge_input is not EdgeInput.NONE
    attr = store.edge_feature_rows(closure.edge_ids) if reads_edges else None
    rows, _ = closure_forward(model, closure, x, attr, degrees=OutDegrees.of(store))
    return rows


def stored_rows(schema: GraphSchema, types: Sequence[str]) -> int:
    """Rows of every stored array: the global indices up to the last node of the stored
    ``types`` (a graph of one type: every node; a typed node model's target, the first
    indices: its nodes)."""
    return max(schema.node_type(name).stop for name in types)


@dataclass(frozen=True, eq=False)
class Precomputed:
    """Opened ``precomputed/`` (read-only memory maps): ``layers[l - 1]`` is layer ``l``, or
    in output mode ``layers[0]`` is every node's output."""

    path: Path
    meta: dict[str, Any]
    layers: list[np.ndarray]
    out_indptr: np.ndarray
    out_indices: np.ndarray
    # Rows kept in Redis beside a graph served from there (then ``layers`` and the out-lists
    # are empty): every read below goes to it instead.
    remote: RemoteRows | None = None

    @property
    def num_layers(self) -> int:
        return len(self.meta["dims"]) if self.remote is not None else len(self.layers)

    @property
    def count(self) -> int:
        """Rows per array: nodes up to the last of the stored types."""
        return self.remote.count if self.remote is not None else int(self.layers[0].shape[0])

    def width(self, array: int) -> int:
        """Columns of array ``array`` (0: layer 1, or the output)."""
        if self.remote is not None:
            return self.remote.widths[array]
        return int(self.layers[array].shape[1])

    def read(self, array: int, nodes: np.ndarray) -> np.ndarray:
        """float32 rows of array ``array`` of ``nodes`` (each below ``count``), in one read."""
        if self.remote is not None:
            return self.remote.read(array, nodes)
        return np.take(self.layers[array], nodes, axis=0)

    def every_row(self, array: int) -> np.ndarray:
        """Every node's rows of array ``array`` (a link archive's top-k table)."""
        if self.remote is not None:
            return self.remote.every_row(array)
        return self.layers[array]

    def out_neighbours(self, nodes: np.ndarray) -> np.ndarray:
        """The stored graph's out-neighbours of ``nodes`` (graph nodes), end to end."""
        if self.remote is not None:
            return self.remote.out_neighbours(nodes)
        indptr = self.out_indptr
        starts, ends = indptr[nodes].astype(np.int64), indptr[nodes + 1].astype(np.int64)
        counts = ends - starts
        total = int(counts.sum())
        offsets = np.repeat(starts - np.cumsum(counts) + counts, counts)
        return np.asarray(self.out_indices[offsets + np.arange(total)], dtype=np.int64)

    @property
    def mode(self) -> Mode:
        return Mode(self.meta.get("mode", Mode.LAYERS.value))

    @property
    def hops(self) -> int:
        """The receptive field the rows were built with (meta.json's ``hops``)."""
        return int(self.meta["hops"])

    @property
    def node_types(self) -> tuple[str, ...]:
        """The node types whose rows are stored (meta.json's ``node_types``)."""
        return tuple(self.meta["node_types"])


def open_archive_precomputed(
    model_dir: Path,
    store: GraphStore | RemoteStore,
    verify_checksum: bool = True,
) -> Precomputed | None:
    """The archive's ``precomputed/``, checked against its graph and ``model.pt``; None for an
    archive built without ``--precompute``. For a graph in Redis, the rows loaded beside it
    (read through the graph's block cache)."""
    path = Path(model_dir) / PRECOMPUTED_DIR
    if not path.is_dir():
        return None
    weights = weights_digest(Path(model_dir) / WEIGHTS_FILE)
    if isinstance(store, RemoteStore):
        return open_remote_precomputed(path, store, weights)
    return open_precomputed(path, store, weights, verify_checksum)


def open_remote_precomputed(path: Path, store: RemoteStore, weights_sha256: str) -> Precomputed:
    """The rows loaded into Redis beside ``store``'s graph by the archive's build
    (``load_to_redis``), refused (StoreError, one line) unless they are there, recorded with
    the archive's ``path/meta.json``."""
    meta_path = Path(path) / META_FILE
    meta = _checked_meta(meta_path, store.checksum, weights_sha256)
    name = rows_id(meta)
    if read_meta(store, name) != meta:
        raise StoreError(
            f"{store.shown} prefix {store.keys.prefix!r} holds no precomputed rows {name} of "
            f"this archive (built at {meta.get('built_at')}; deleted or evicted?); {_REBUILD} "
            "to load them"
        )
    count = stored_rows(store.schema, meta["node_types"])
    remote = RemoteRows(store, name, [int(d) for d in meta["dims"]], count)
    empty = np.zeros(0, dtype=np.int64)
    return Precomputed(Path(path), meta, [], empty, empty, remote=remote)


def load_to_redis(path: Path, location: str, checksum: str, timeout_ms: int = 10_000) -> str:
    """Loads ``path`` (a written ``precomputed/``) beside the graph of ``checksum`` at
    ``location`` (``redis://host:port/NAME``), meta last; returns the summary line."""
    meta = json.loads((Path(path) / META_FILE).read_text())
    names = (
        [OUTPUT_FILE]
        if meta["mode"] == Mode.OUTPUT.value
        else [layer_file(i + 1) for i in range(int(meta["num_layers"]))]
    )
    arrays = {
        name: np.load(Path(path) / name, mmap_mode="r", allow_pickle=False)
        for name in [*names, *OUT_FILES]
    }
    where = parse_location(location)
    store = open_remote_store(where.url, where.prefix, checksum, cache_mb=0, timeout_ms=timeout_ms)
    try:
        started = time.perf_counter()
        written = load_rows(
            store.client,
            store.keys,
            store.layout.block_size,
            [arrays[name] for name in names],
            arrays[OUT_FILES[0]],
            arrays[OUT_FILES[1]],
            meta,
            store.shown,
        )
    finally:
        store.close()
    return (
        f"  loaded the rows {rows_id(meta)} into {store.shown} prefix {where.prefix!r}: "
        f"{written / 2**20:.1f} MiB in {time.perf_counter() - started:.1f} s"
    )


def _checked_meta(meta_path: Path, checksum: str, weights_sha256: str) -> dict[str, Any]:
    """``meta_path``'s content, refused (StoreError, one line) unless it is this format's, of
    the graph ``checksum`` and the weights ``weights_sha256``."""
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError) as error:
        raise StoreError(f"{meta_path}: cannot read it ({error}); {_REBUILD}") from error
    if not isinstance(meta, dict) or meta.get("format_version") != FORMAT_VERSION:
        raise StoreError(f"{meta_path}: not format version {FORMAT_VERSION}; {_REBUILD}")
    if meta.get("graph_checksum") != checksum:
        raise StoreError(
            f"{meta_path}: computed from graph {meta.get('graph_checksum')}, the archive's graph "
            f"is {checksum}; {_REBUILD}"
        )
    if meta.get("weights_sha256") != weights_sha256:
        raise StoreError(
            f"{meta_path}: computed with other weights than the archive's model.pt; {_REBUILD}"
        )
    return meta


def open_precomputed(
    path: Path, store: GraphStore, weights_sha256: str, verify_checksum: bool = True
) -> Precomputed:
    """Opens and checks ``path`` against the graph and the weights it was computed from;
    StoreError (one line, ending in the rebuild command) if anything is off."""
    path = Path(path)
    meta_path = path / META_FILE
    meta = _checked_meta(meta_path, store.checksum, weights_sha256)
    mode = meta.get("mode", Mode.LAYERS.value)
    if mode not in {m.value for m in Mode}:
        raise StoreError(
            f"{meta_path}: mode must be 'layers' or 'output', got {mode!r}; {_REBUILD}"
        )
    if mode == Mode.OUTPUT.value:
        names = [OUTPUT_FILE]
    else:
        names = [layer_file(i + 1) for i in range(int(meta["num_layers"]))]
    files = meta.get("files", {})
    if sorted(files) != sorted([*names, *OUT_FILES]):
        raise StoreError(f"{meta_path}: files must list {[*names, *OUT_FILES]}; {_REBUILD}")
    arrays = {
        name: open_recorded_array(path / name, files[name], _REBUILD, verify_checksum)
        for name in files
    }
    schema, n = store.schema, store.num_nodes
    types = meta.setdefault("node_types", [schema.target])  # archives before typed graphs
    if not isinstance(types, list) or not types or not set(types) <= set(schema.node_type_names):
        raise StoreError(
            f"{meta_path}: node_types must list node types of the graph "
            f"({', '.join(schema.node_type_names)}), got {types!r}; {_REBUILD}"
        )
    rows = stored_rows(schema, types)
    for name in names:
        if arrays[name].ndim != 2 or arrays[name].shape[0] != rows:
            raise StoreError(
                f"{path / name}: not one row per node of {', '.join(types)} ({rows} rows); "
                f"{_REBUILD}"
            )
    if not isinstance(meta.get("hops"), int) or meta["hops"] < 1:
        raise StoreError(f"{meta_path}: hops must be a whole number >= 1; {_REBUILD}")
    if arrays["out_indptr.npy"].shape != (n + 1,) or arrays["out_indices.npy"].shape != (
        store.num_edges,
    ):
        raise StoreError(f"{path}: the out-neighbour lists do not fit the graph; {_REBUILD}")
    return Precomputed(
        path=path,
        meta=meta,
        layers=[arrays[name] for name in names],
        out_indptr=arrays["out_indptr.npy"],
        out_indices=arrays["out_indices.npy"],
    )
