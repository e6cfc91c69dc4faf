"""What a link archive carries besides the graph: candidate embeddings and out-neighbour lists.

``link/`` in the archive holds ``.npy`` arrays that load memory-mapped without pickle:

- ``embeddings.npy``, float32 ``[N, D]``: every node's embedding, from one full-graph forward
  pass at build time (on a graph of several node types, the rows of the predicted relation's
  two end types; other types' rows are zeros and never read);
- ``out_indptr.npy`` (int32/int64 ``[N+1]``) and ``out_indices.npy`` (int32/int64 ``[E]``): CSR,
  the out-neighbours of ``v`` are ``out_indices[out_indptr[v]:out_indptr[v+1]]``, ascending (on
  a typed graph over the predicted relation's edges only, ``E`` of them);
- ``meta.json``: format version, graph checksum, sizes, build time, the predicted relation
  (``target_edge_type``, typed graphs), and per file its dtype, shape and digests (sha256,
  blake3).

The embeddings are exactly as fresh as the archive: computed from the archive's graph when it
was built (``built_at``), and a worker refuses them if the graph's checksum differs. Top-k
requests search them; a changed graph needs a new archive.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch

from graph_assets.errors import StoreError
from graph_assets.remote import RemoteStore
from graph_assets.stored.store import GraphStore, file_digests, index_dtype, open_recorded_array
from model.served.contract import served
from model.typed_graph import whole_graph_input
from model.user_model import EdgeInput

LINK_DIR = "link"
_REBUILD = "rebuild the archive with ./build_mar.sh --task link"
FORMAT_VERSION = 1
META_FILE = "meta.json"
ARRAY_FILES = ("embeddings.npy", "out_indices.npy", "out_indptr.npy")


@dataclass(frozen=True, eq=False)
class LinkAssets:
    """Opened link assets (read-only memory maps); see the module docstring."""

    path: Path
    meta: dict[str, Any]
    embeddings: np.ndarray
    out_indptr: np.ndarray
    out_indices: np.ndarray

    @property
    def built_at(self) -> str:
        return str(self.meta["built_at"])


def out_csr(store: GraphStore, relation: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The store's edges (those of ``relation`` only, when given) grouped by source:
    ``(out_indptr, out_indices)``."""
    n = store.num_nodes
    sources = np.asarray(store.indices, dtype=np.int64)
    destinations = np.repeat(np.arange(n, dtype=np.int64), np.diff(store.indptr))
    if relation is not None and store.edge_type is not None:
        mine = np.asarray(store.edge_type) == relation
        sources, destinations = sources[mine], destinations[mine]
    # Stable, so CSC order keeps each source's destinations ascending; torch's radix sort of
    # integer keys is ~3x numpy's merge sort (1.4 s for 10M edges here).
    order = torch.sort(torch.from_numpy(sources), stable=True).indices.numpy()
    counts = np.bincount(sources, minlength=n)
    indptr = np.zeros(n + 1, dtype=index_dtype(store.num_edges))
    np.cumsum(counts, out=indptr[1:])
    return indptr, destinations[order].astype(index_dtype(n))


def full_graph_embeddings(model: torch.nn.Module, store: GraphStore) -> np.ndarray:
    """Every node's embedding from one forward pass of a link model (``model.link.LinkModel``,
    or on a typed graph ``model.hetero_link.HeteroLinkModel``: its ends' rows at their global
    indices) over the whole stored graph, with its edge features where the model reads them."""
    model.eval()
    contract = served(model)
    if contract.edge_type is not None:  # a typed graph's relation: its ends' rows
        inputs = whole_graph_input(store)
        table: np.ndarray | None = None
        with torch.no_grad():
            for key in dict.fromkeys((contract.edge_type[0], contract.edge_type[2])):
                rows = contract.rows_of(key)(inputs)
                if table is None:
                    table = np.zeros((store.num_nodes, rows.size(1)), dtype=np.float32)
                node_type = store.schema.node_type(key)
                table[node_type.offset : node_type.stop] = rows.float().numpy()
        assert table is not None
        return table
    x = torch.from_numpy(np.array(store.features, dtype=np.float32))
    edge_index = torch.from_numpy(store.edge_index())
    edges = {}
    if contract.serving_needs.edge_input is not EdgeInput.NONE:
        edges["edge_attr"] = torch.from_numpy(np.array(store.edge_features, dtype=np.float32))
    with torch.no_grad():
        return model(x, edge_index, **edges).float().numpy()


def write_link_assets(model: torch.nn.Module, store: GraphStore, out_dir: Path) -> dict[str, Any]:
    """Writes ``out_dir`` (the archive's ``link/``); returns its meta.json content."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    embeddings = full_graph_embeddings(model, store)
    relation = predicted_relation(model, store)
    indptr, indices = out_csr(store, relation)
    arrays = {"embeddings.npy": embeddings, "out_indptr.npy": indptr, "out_indices.npy": indices}
    files = {}
    for name, array in arrays.items():
        np.save(out / name, np.ascontiguousarray(array), allow_pickle=False)
        files[name] = {
            "dtype": array.dtype.str,
            "shape": list(array.shape),
            **file_digests(out / name),
        }
    meta = {
        "format_version": FORMAT_VERSION,
        "graph_checksum": store.checksum,
        "num_nodes": store.num_nodes,
        "num_edges": store.num_edges,
        "embedding_dim": int(embeddings.shape[1]),
        **(
            {} if relation is None else {"target_edge_type": store.schema.edge_type_names[relation]}
        ),
        "built_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "files": files,
    }
    (out / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def predicted_relation(model: torch.nn.Module, store: GraphStore) -> int | None:
    """Index of the relation a typed graph's link model predicts; None for a graph of one
    type (every edge counts)."""
    edge_type = served(model).edge_type
    if edge_type is None:
        return None
    return store.schema.relation_index("__".join(edge_type))


def open_link_assets(
    path: Path, store: GraphStore | RemoteStore, verify_checksum: bool = True
) -> LinkAssets:
    """Opens and checks ``path`` against the graph it was built from (mapped, or in Redis);
    StoreError if off."""
    path = Path(path)
    meta_path = path / META_FILE
    if not meta_path.is_file():
        raise StoreError(
            f"{meta_path} is missing: a link archive carries {LINK_DIR}/ with the candidate "
            "embeddings; rebuild it with ./build_mar.sh --task link"
        )
    meta = json.loads(meta_path.read_text())
    if meta.get("format_version") != FORMAT_VERSION:
        raise StoreError(
            f"{meta_path}: format_version {meta.get('format_version')!r}, this gnnserve reads "
            f"{FORMAT_VERSION}; rebuild the archive"
        )
    if meta.get("graph_checksum") != store.checksum:
        raise StoreError(
            f"{meta_path}: the embeddings were computed from graph {meta.get('graph_checksum')}, "
            f"the archive's graph is {store.checksum}; rebuild the archive so they match"
        )
    arrays = {
        name: open_recorded_array(path / name, meta["files"][name], _REBUILD, verify_checksum)
        for name in ARRAY_FILES
    }
    n = store.num_nodes
    if arrays["embeddings.npy"].shape[0] != n or arrays["out_indptr.npy"].shape != (n + 1,):
        raise StoreError(f"{path}: the arrays are not sized for the graph's {n} nodes")
    name = meta.get("target_edge_type")
    edges = store.num_edges
    if name is not None:
        try:
            edges = store.schema.relations[store.schema.relation_index(name)].num_edges
        except KeyError as error:
            raise StoreError(f"{meta_path}: {error.args[0]}; {_REBUILD}") from None
    if arrays["out_indices.npy"].shape != (edges,):
        raise StoreError(f"{path}: out_indices.npy does not hold the graph's {edges} edges")
    return LinkAssets(
        path=path,
        meta=meta,
        embeddings=arrays["embeddings.npy"],
        out_indptr=arrays["out_indptr.npy"],
        out_indices=arrays["out_indices.npy"],
    )
