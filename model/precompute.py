"""Every node's representation at every layer, computed once at build time and served as is.

``./build_mar.sh --precompute`` runs the model's layers over the whole stored graph one layer
at a time (PyG's layer-wise ``BasicGNN.inference``): layer ``l`` of all nodes is computed from
layer ``l-1`` of all nodes, in chunks of consecutive destination nodes whose in-edges fit a
budget, so memory stays bounded whatever the graph's size. The results go to the archive's
``precomputed/``, memory-mapped and checksummed like the graph:

- ``layer_<l>.npy``, float32 ``[N, d_l]`` for ``l = 1..L``: what layer ``l`` hands the next one
  (after the activation); ``layer_<L>.npy`` is the model's output (logits, or a link
  encoder's embeddings). Layer 0 is the graph's features.
- ``out_indptr.npy`` / ``out_indices.npy``: the graph's edges grouped by source (CSR), which
  an update follows to find the rows it reaches;
- ``meta.json``: format version, the graph's checksum, the weights' sha256, dims, the files.

A row is recomputed with :meth:`NodeClassifier.layer` from its in-neighbours' rows one layer
below, both here and when a live update refreshes the rows it reaches
(``handler.core.precomputed``): one rule, so a refreshed row equals a rebuilt one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from graph_assets.durable import fsync_path
from graph_assets.errors import StoreError
from graph_assets.store import GraphStore, file_digests, open_recorded_array
from model.architectures import GCN, NodeClassifier
from model.export import WEIGHTS_FILE
from model.link import LinkPredictor
from model.link_assets import out_csr

PRECOMPUTED_DIR = "precomputed"
FORMAT_VERSION = 1
META_FILE = "meta.json"
OUT_FILES = ("out_indptr.npy", "out_indices.npy")
# In-edges per chunk: the chunk's gathered input rows are at most this many, times the width.
CHUNK_EDGES = 1 << 21
CHUNK_NODES = 1 << 18
_REBUILD = "rebuild the archive with ./build_mar.sh --precompute"


def layer_file(layer: int) -> str:
    return f"layer_{layer}.npy"


def node_level(model: torch.nn.Module) -> NodeClassifier:
    """The layers a precomputed archive stores: a node classifier's, a link predictor's
    encoder's."""
    if isinstance(model, LinkPredictor):
        return model.encoder
    if isinstance(model, NodeClassifier):
        return model
    raise TypeError(f"{type(model).__name__} has no node-level layers to precompute")


def needs_degree(model: NodeClassifier) -> bool:
    """GCN normalises by full-graph degrees: its layers read them, and a changed degree
    reaches the node's out-neighbours."""
    return isinstance(model, GCN)


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
    """The in-neighbourhoods of nodes ``a..b-1`` of a CSC graph. Sources are numbered through
    a mask over all nodes, in O(nodes + edges): no sort of the chunk's edges."""
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
    model: NodeClassifier,
    index: int,
    graph: LocalGraph,
    below: np.ndarray,
    degree: np.ndarray | None,
) -> np.ndarray:
    """Layer ``index`` (0-based) for the destinations of ``graph``; ``below``: the layer's
    input rows of ``graph.nodes``; ``degree``: their full-graph in-degrees (GCN)."""
    device = next(model.parameters()).device
    x = torch.from_numpy(np.ascontiguousarray(below, dtype=np.float32)).to(device)
    deg = None if degree is None else torch.from_numpy(np.asarray(degree, dtype=np.float32))
    with torch.inference_mode():
        out = model.layer(
            index,
            x,
            graph.edge_index.to(device),
            graph.rows,
            degree=None if deg is None else deg.to(device),
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
    layers = node_level(model).eval()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    n = store.num_nodes
    indptr, indices = np.asarray(store.indptr), np.asarray(store.indices)
    degree = store.degree_rows(np.arange(n)) if needs_degree(layers) else None
    below: np.ndarray = np.asarray(store.features)
    dims = []
    for index in range(layers.gnn.num_layers):
        name = layer_file(index + 1)
        width = _layer_width(layers, index, below)
        rows = np.lib.format.open_memmap(out / name, mode="w+", dtype=np.float32, shape=(n, width))
        bar = tqdm(
            total=store.num_edges,
            desc=f"precompute layer {index + 1}",
            disable=None if progress else True,  # None: off when stderr is not a terminal
        )
        for a, b in chunks(indptr, chunk_edges, CHUNK_NODES):
            graph = range_in_neighbourhoods(indptr, indices, a, b)
            local_degree = None if degree is None else degree[graph.nodes]
            rows[a:b] = layer_rows(
                layers, index, graph, np.take(below, graph.nodes, axis=0), local_degree
            )
            bar.update(int(indptr[b] - indptr[a]))
        bar.close()
        rows.flush()
        del rows
        below = np.load(out / name, mmap_mode="r", allow_pickle=False)
        dims.append(width)
    out_indptr, out_indices = out_csr(store)
    for name, array in zip(OUT_FILES, (out_indptr, out_indices), strict=True):
        np.save(out / name, array, allow_pickle=False)
    names = [layer_file(i + 1) for i in range(len(dims))] + list(OUT_FILES)
    files = {}
    for name in names:
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
        "graph_checksum": store.checksum,
        "weights_sha256": weights_sha256,
        "num_layers": len(dims),
        "dims": dims,
        "built_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "files": files,
    }
    (out / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def _layer_width(model: NodeClassifier, index: int, below: np.ndarray) -> int:
    """Output width of layer ``index``, from one node's forward (no edges)."""
    graph = LocalGraph(
        nodes=np.zeros(1, dtype=np.int64),
        edge_index=torch.empty(2, 0, dtype=torch.int64),
        rows=1,
    )
    degree = np.zeros(1) if needs_degree(model) else None
    return int(layer_rows(model, index, graph, np.array(below[:1]), degree).shape[1])


@dataclass(frozen=True, eq=False)
class Precomputed:
    """Opened ``precomputed/`` (read-only memory maps): ``layers[l - 1]`` is layer ``l``."""

    path: Path
    meta: dict[str, Any]
    layers: list[np.ndarray]
    out_indptr: np.ndarray
    out_indices: np.ndarray

    @property
    def num_layers(self) -> int:
        return len(self.layers)


def open_archive_precomputed(
    model_dir: Path, store: GraphStore, verify_checksum: bool = True
) -> Precomputed | None:
    """The archive's ``precomputed/``, checked against its graph and ``model.pt``; None for an
    archive built without ``--precompute``."""
    path = Path(model_dir) / PRECOMPUTED_DIR
    if not path.is_dir():
        return None
    weights = weights_digest(Path(model_dir) / WEIGHTS_FILE)
    return open_precomputed(path, store, weights, verify_checksum)


def open_precomputed(
    path: Path, store: GraphStore, weights_sha256: str, verify_checksum: bool = True
) -> Precomputed:
    """Opens and checks ``path`` against the graph and the weights it was computed from;
    StoreError (one line, ending in the rebuild command) if anything is off."""
    path = Path(path)
    meta_path = path / META_FILE
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError) as error:
        raise StoreError(f"{meta_path}: cannot read it ({error}); {_REBUILD}") from error
    if not isinstance(meta, dict) or meta.get("format_version") != FORMAT_VERSION:
        raise StoreError(f"{meta_path}: not format version {FORMAT_VERSION}; {_REBUILD}")
    if meta.get("graph_checksum") != store.checksum:
        raise StoreError(
            f"{meta_path}: computed from graph {meta.get('graph_checksum')}, the archive's graph "
            f"is {store.checksum}; {_REBUILD}"
        )
    if meta.get("weights_sha256") != weights_sha256:
        raise StoreError(
            f"{meta_path}: computed with other weights than the archive's model.pt; {_REBUILD}"
        )
    names = [layer_file(i + 1) for i in range(int(meta["num_layers"]))]
    files = meta.get("files", {})
    if sorted(files) != sorted([*names, *OUT_FILES]):
        raise StoreError(f"{meta_path}: files must list {[*names, *OUT_FILES]}; {_REBUILD}")
    arrays = {
        name: open_recorded_array(path / name, files[name], _REBUILD, verify_checksum)
        for name in files
    }
    n = store.num_nodes
    for name in names:
        if arrays[name].ndim != 2 or arrays[name].shape[0] != n:
            raise StoreError(f"{path / name}: not one row per node of the graph; {_REBUILD}")
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
