"""The store format (version 2) and `open_store`, which memory-maps a store after checking it.

A store is one directory of ``.npy`` arrays plus ``meta.json`` (docs/architecture.md has the
table). Every check a server needs happens here, at open time, so a bad store refuses to load
with a message that says how to fix it instead of failing mid-request. Version 2 added edge
features; a version 1 store (written before) still opens, as a graph without edge features.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal, NotRequired, TypedDict, cast

import blake3
import numpy as np

from graph_assets.errors import StoreError

FORMAT_VERSION = 2
# Versions open_store reads: 1 is 2 without edge features (no edge_features.npy, no meta keys).
READABLE_VERSIONS = (1, 2)
META_FILE = "meta.json"
EDGE_FEATURES_FILE = "edge_features.npy"
# Sorted by name: the combined checksum hashes the files' digests in this order.
ARRAY_FILES = (
    EDGE_FEATURES_FILE,
    "features.npy",
    "ids.npy",
    "in_degree.npy",
    "indices.npy",
    "indptr.npy",
    "labels.npy",
    "out_degree.npy",
)
_V1_ARRAY_FILES = tuple(name for name in ARRAY_FILES if name != EDGE_FEATURES_FILE)
# Only in a compacted store (one whose meta.json has "update_log"): the IDs updates removed.
REMOVED_IDS_FILE = "removed_ids.npy"
REBUILD_HINT = (
    "rebuild the store with `python -m graph_assets build --graph DIR --out STORE` "
    "(or `python -m graph_assets synthetic ...`)"
)

_HASH_BLOCK_BYTES = 8 << 20
_SCAN_BLOCK = 1 << 22  # elements per pass over a memory-mapped array: bounded temporaries
_INT64 = np.dtype("<i8")
_INDEX_DTYPES = (np.dtype("<i4"), _INT64)
# Canonical decimal form of an int, as str(int) writes it: no sign on zero, no leading zeros.
_CANONICAL_INT = re.compile(r"0|-?[1-9][0-9]*")
_INT64_MIN, _INT64_MAX = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)
_CHECKSUM = re.compile(r"[0-9a-f]{64}")

IdKind = Literal["int", "str"]


class FileMeta(TypedDict):
    """What meta.json records about one array file."""

    dtype: str  # numpy dtype string, e.g. "<f4", "|S12"
    shape: list[int]
    bytes: int
    sha256: str  # what the store's checksum is made of: its identity
    blake3: NotRequired[str]  # what a worker re-hashes at start (stores written before: sha256)


class StoreStats(TypedDict):
    """What the build kept and dropped; ``input_edges`` counts edges after ``--undirected``
    added the reverses, and ``num_edges = input_edges - self_loops_dropped -
    duplicate_edges_dropped``. A duplicate edge repeats an earlier edge's ``(src, dst)``; a
    repeated self-loop counts as both. The ``_kept`` counts are absent in version 1 stores,
    which kept neither."""

    input_edges: int
    self_loops_dropped: int
    duplicate_edges_dropped: int
    self_loops_kept: NotRequired[int]
    duplicate_edges_kept: NotRequired[int]
    undirected: bool


class UpdateLogMeta(TypedDict):
    """Where a compacted store's updates continue: the log in ``<state_dir>/<base>/`` after the
    record of ``seq``, which ends at byte ``offset`` (records up to it are folded in)."""

    base: str  # checksum of the lineage's first store, whose state directory holds the log
    seq: int
    offset: int


class StoreMeta(TypedDict):
    """The content of meta.json (format version 2); ``update_log`` only in a compacted store,
    the edge feature keys not in a version 1 store."""

    format_version: int
    num_nodes: int
    num_edges: int
    feature_dim: int
    edge_feature_dim: NotRequired[int]
    edge_feature_names: NotRequired[list[str]]
    num_classes: int
    class_names: list[str] | None
    id_kind: IdKind
    files: dict[str, FileMeta]
    checksum: str
    stats: StoreStats
    update_log: NotRequired[UpdateLogMeta]


def index_dtype(count: int) -> np.dtype[Any]:
    """The dtype that indexes ``count`` items: int32 while it fits (half the memory), else int64."""
    return np.dtype("<i4") if count < 2**31 else _INT64


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in blocks so a large feature matrix is never held in memory."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_HASH_BLOCK_BYTES):
            digest.update(block)
    return digest.hexdigest()


def blake3_file(path: Path) -> str:
    """Hex BLAKE3 of a file, memory-mapped and hashed on every core: about 4x sha256's speed
    here, which is what a worker that re-checks a 1 GB store at every start pays."""
    digest = blake3.blake3(max_threads=blake3.blake3.AUTO)
    digest.update_mmap(path)
    return digest.hexdigest()


class FileDigests(TypedDict):
    sha256: str
    blake3: str


def file_digests(path: Path) -> FileDigests:
    """The digests meta.json records for a file: sha256 (the store's identity) and blake3 (what
    opening it re-checks)."""
    return {"sha256": sha256_file(path), "blake3": blake3_file(path)}


def digest_mismatch(file: Path, entry: Mapping[str, Any]) -> str | None:
    """None when ``file`` hashes to what its meta.json entry records, else what differs. Checks
    BLAKE3 where the entry has it (the fast one), sha256 in entries written before it."""
    algorithm = "blake3" if "blake3" in entry else "sha256"
    digest = blake3_file(file) if algorithm == "blake3" else sha256_file(file)
    if digest == entry[algorithm]:
        return None
    return f"{file} has {algorithm} {digest}, meta.json says {entry[algorithm]}"


def combined_checksum(
    file_sha256: Mapping[str, str], update_log: UpdateLogMeta | None = None
) -> str:
    """One digest naming the whole graph: sha256 over the files' hex digests in name order,
    then a compacted store's ``update_log`` entry (so where its updates continue is covered)."""
    joined = "".join(file_sha256[name] for name in sorted(file_sha256))
    if update_log is not None:
        joined += json.dumps(update_log, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(joined.encode("ascii")).hexdigest()


def store_files(meta: Mapping[str, Any]) -> tuple[str, ...]:
    """The array files a store with this meta.json has, in name order."""
    arrays = _V1_ARRAY_FILES if meta.get("format_version") == 1 else ARRAY_FILES
    if "update_log" not in meta:
        return arrays
    return tuple(sorted((*arrays, REMOVED_IDS_FILE)))


_SELF_LOOP_BLOCK = 1 << 16  # nodes per block when counting self-loops


@dataclass(frozen=True, eq=False)
class GraphStore:
    """An opened store; use `open_store` to get one.

    The arrays are read-only memory maps, so every worker serving the graph shares one copy in
    the page cache. Internal node ``i`` is the node whose external ID is ``ids[i]``.

    Attributes:
        path: the store directory.
        meta: the content of meta.json.
        indptr: ``[N+1]`` int32/int64; the in-edges of node ``v`` are
            ``indices[indptr[v]:indptr[v+1]]`` (CSC).
        indices: ``[E]`` int32/int64 source node of each in-edge, ascending within a node.
        features: ``[N, F]`` float32 node features.
        labels: ``[N]`` int64 class index, -1 for an unlabelled node.
        in_degree: ``[N]`` int64 full-graph in-degree: every stored in-edge, self-loops and
            parallel edges included.
        out_degree: ``[N]`` int64 full-graph out-degree, counted the same way.
        ids: ``[N]`` sorted external IDs, int64 or UTF-8 bytes (``S<k>``).
        removed_ids: sorted external IDs that updates removed before the store was compacted,
            of ``ids``' kind; empty unless the store is compacted. They are never reused.
        edge_features: ``[E, D]`` float32; row ``p`` belongs to the in-edge at CSC position
            ``p`` (``indices[p]``), which is the edge's ID. ``[E, 0]`` without edge features.
    """

    path: Path
    meta: StoreMeta
    indptr: np.ndarray
    indices: np.ndarray
    features: np.ndarray
    labels: np.ndarray
    in_degree: np.ndarray
    out_degree: np.ndarray
    ids: np.ndarray
    removed_ids: np.ndarray
    edge_features: np.ndarray

    @property
    def num_nodes(self) -> int:
        return self.meta["num_nodes"]

    @property
    def num_edges(self) -> int:
        return self.meta["num_edges"]

    @property
    def feature_dim(self) -> int:
        return self.meta["feature_dim"]

    @property
    def edge_feature_dim(self) -> int:
        """Features per edge (0 when the graph has none, as in every version 1 store)."""
        return self.meta.get("edge_feature_dim", 0)

    @property
    def edge_feature_names(self) -> list[str]:
        """The edge feature column names in input file order (empty without edge features)."""
        return self.meta.get("edge_feature_names", [])

    @property
    def num_classes(self) -> int:
        """Number of classes (0 when the graph has no labels)."""
        return self.meta["num_classes"]

    @property
    def class_names(self) -> list[str] | None:
        """Name of each class index, or None when labels were given as integers."""
        return self.meta["class_names"]

    @property
    def id_kind(self) -> IdKind:
        return self.meta["id_kind"]

    @property
    def checksum(self) -> str:
        """Digest of all arrays: names this exact graph (e.g. to seed deterministic sampling)."""
        return self.meta["checksum"]

    @property
    def update_log(self) -> UpdateLogMeta | None:
        """Where a compacted store's updates continue in its lineage's log; None otherwise."""
        return self.meta.get("update_log")

    @property
    def log_base(self) -> str:
        """The checksum naming the state directory of this store's update log: the lineage's
        first store for a compacted store (one log per lineage), else its own."""
        lineage = self.update_log
        return lineage["base"] if lineage is not None else self.checksum

    @property
    def folded_seq(self) -> int:
        """Seq of the last update record folded into the arrays (0 for a store never updated)."""
        lineage = self.update_log
        return lineage["seq"] if lineage is not None else 0

    def lookup(self, ids: Sequence[int | str]) -> np.ndarray:
        """Internal indices (int64) of external ``ids``; -1 marks an ID the graph does not have.

        On an int store a str in canonical decimal form (``"42"``, not ``"042"``) finds node 42;
        on a str store an int finds the node whose ID is its decimal string. Anything else
        (bools, floats, other strings) is reported missing rather than raising, since callers
        turn -1 into "node not found".
        """
        return self._find(self.ids, ids)

    def was_removed(self, node_id: int | str) -> bool:
        """Whether an update removed ``node_id`` before this store was compacted: such an ID
        is refused by ``add_node``, as it was before compaction (IDs are not reused)."""
        return bool(self._find(self.removed_ids, [node_id])[0] >= 0)

    def _find(self, table: np.ndarray, ids: Sequence[int | str]) -> np.ndarray:
        """Positions of ``ids`` in the sorted ID array ``table``, -1 where absent."""
        if len(table) == 0:
            return np.full(len(ids), -1, dtype=np.int64)
        keys, usable = self._keys(ids, table.dtype)
        pos = np.searchsorted(table, keys)
        # Positions past the end and unusable keys both mean missing; clip only to compare safely.
        clipped = np.minimum(pos, len(table) - 1)
        found = usable & (pos < len(table)) & (table[clipped] == keys)
        return np.where(found, pos, -1).astype(np.int64)

    def _keys(
        self, ids: Sequence[int | str], dtype: np.dtype[Any]
    ) -> tuple[np.ndarray, np.ndarray]:
        """The query IDs as an array of ``dtype`` plus a mask of those that could match."""
        if self.id_kind == "int":
            ints = [_as_int_id(x) for x in ids]
            usable = np.array([v is not None for v in ints], dtype=bool)
            keys = np.array([0 if v is None else v for v in ints], dtype=np.int64)
            return keys, usable
        width = dtype.itemsize
        raw = [_as_str_id(x) for x in ids]
        # Longer keys would be truncated by the S<k> dtype and could falsely match a prefix.
        usable = np.array([b is not None and len(b) <= width for b in raw], dtype=bool)
        keys = np.array(
            [b if ok and b is not None else b"" for b, ok in zip(raw, usable, strict=True)],
            dtype=dtype,
        )
        return keys, usable

    def edge_index(self) -> np.ndarray:
        """All edges as int64 ``[2, E]`` (row 0 source, row 1 destination), in CSC order.

        This materialises the whole graph: meant for training and full-graph reference checks,
        not for serving.
        """
        dst = np.repeat(np.arange(self.num_nodes, dtype=np.int64), np.diff(self.indptr))
        return np.stack([np.asarray(self.indices, dtype=np.int64), dst])

    def feature_rows(self, nodes: np.ndarray) -> np.ndarray:
        """float32 feature rows of internal ``nodes`` (a copy). np.take, not fancy indexing or
        torch's index_select: about half their time on a memory map."""
        return np.take(self.features, nodes, axis=0).astype(np.float32, copy=False)

    def edge_feature_rows(self, edge_ids: np.ndarray) -> np.ndarray:
        """float32 ``[len(edge_ids), D]`` features of edges by ID (a copy). An edge's ID is its
        CSC position ``p``: the in-edge ``indices[p]`` of the node whose
        ``indptr[v]:indptr[v+1]`` holds ``p``. Without edge features the rows have no
        columns."""
        edge_ids = np.asarray(edge_ids)
        if edge_ids.size == 0:
            return np.empty((0, self.edge_feature_dim), dtype=np.float32)
        check_edge_ids(edge_ids, self.num_edges, "CSC positions")
        return np.take(self.edge_features, edge_ids, axis=0).astype(np.float32, copy=False)

    def degree_rows(self, nodes: np.ndarray) -> np.ndarray:
        """int64 full-graph in-degrees of internal ``nodes``, self-loops not counted: what GCN
        normalises by (PyG's ``add_remaining_self_loops`` replaces a node's self-loops by
        one of its own)."""
        degree = np.take(self.in_degree, nodes).astype(np.int64, copy=False)
        loops = self.self_loop_counts
        return degree if loops is None else degree - np.take(loops, nodes)

    @cached_property
    def self_loop_counts(self) -> np.ndarray | None:
        """int64 ``[N]`` self-loops of each node, counted once per store in blocks of nodes;
        None when the graph has none (a format 1 store never has)."""
        stats = self.meta.get("stats", {})
        if self.meta["format_version"] == 1 or stats.get("self_loops_kept", 1) == 0:
            return None
        counts = np.zeros(self.num_nodes, dtype=np.int64)
        indptr = self.indptr
        for start in range(0, self.num_nodes, _SELF_LOOP_BLOCK):
            stop = min(start + _SELF_LOOP_BLOCK, self.num_nodes)
            begin, end = int(indptr[start]), int(indptr[stop])
            dst = np.repeat(
                np.arange(start, stop, dtype=np.int64), np.diff(indptr[start : stop + 1])
            )
            loops = dst[np.asarray(self.indices[begin:end]) == dst]
            counts[start:stop] = np.bincount(loops - start, minlength=stop - start)
        return counts if counts.any() else None

    def external_ids(self, index: np.ndarray) -> list[int | str]:
        """External IDs of internal indices (Python ints or strs, as the input file had them)."""
        index = np.asarray(index)
        if index.size and (index.min() < 0 or index.max() >= self.num_nodes):
            raise ValueError(
                f"internal indices must be in [0, {self.num_nodes}), got values from "
                f"{index.min()} to {index.max()}; map external IDs with lookup() first"
            )
        values: list[Any] = self.ids[index].tolist()
        if self.id_kind == "int":
            return values
        return [v.decode("utf-8") for v in values]


def _as_int_id(x: object) -> int | None:
    """``x`` as an int64 node ID, or None when it cannot be one."""
    if isinstance(x, bool | np.bool_):
        return None
    if isinstance(x, int | np.integer) or (isinstance(x, str) and _CANONICAL_INT.fullmatch(x)):
        value = int(x)
        return value if _INT64_MIN <= value <= _INT64_MAX else None
    return None


def _as_str_id(x: object) -> bytes | None:
    """``x`` as the UTF-8 bytes of a string node ID, or None when it cannot be one."""
    if isinstance(x, bool | np.bool_):
        return None
    if isinstance(x, int | np.integer):
        return str(int(x)).encode("ascii")
    if not isinstance(x, str):
        return None
    try:
        encoded = x.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: no stored ID can equal them
        return None
    # Stored IDs are never empty and never hold NUL (S<k> would strip a trailing one).
    return encoded if encoded and b"\0" not in encoded else None


def open_store(path: Path, verify_checksum: bool = True) -> GraphStore:
    """Open the store at ``path`` after checking it; raise `StoreError` if anything is off.

    Checks the format version, that every file is present with the size, dtype and shape that
    meta.json records (and that the format requires), the CSC structure (``indptr`` starts at 0,
    never decreases, ends at E; ``indices`` in range), label range, sorted unique IDs and
    degrees. With ``verify_checksum`` (default) it also re-hashes every file, which reads the
    whole store once; turn it off only where the store was verified already.
    """
    path = Path(path)
    meta = read_meta(path)
    names = store_files(meta)
    for name in names:
        _check_size(path, name, meta["files"][name])
    if verify_checksum:
        _verify_checksums(path, meta)
    expected = _expected_layout(meta)
    arrays = {
        name: _load(path, name, meta["files"][name], expected[name], meta["format_version"])
        for name in names
    }
    _check_structure(path, meta, arrays)
    removed = arrays.get(REMOVED_IDS_FILE, np.empty(0, dtype=arrays["ids.npy"].dtype))
    no_edge_features = np.empty((meta["num_edges"], 0), dtype=np.float32)  # version 1
    return GraphStore(
        path=path,
        meta=meta,
        indptr=arrays["indptr.npy"],
        indices=arrays["indices.npy"],
        features=arrays["features.npy"],
        labels=arrays["labels.npy"],
        in_degree=arrays["in_degree.npy"],
        out_degree=arrays["out_degree.npy"],
        ids=arrays["ids.npy"],
        removed_ids=removed,
        edge_features=arrays.get(EDGE_FEATURES_FILE, no_edge_features),
    )


def read_meta(path: Path) -> StoreMeta:
    """meta.json of the store at ``path``, checked for version and field types."""
    meta_path = path / META_FILE
    if not meta_path.is_file():
        raise StoreError(
            f"{path} is not a graph store: expected {META_FILE} there, found none; {REBUILD_HINT}"
        )
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StoreError(f"{meta_path}: cannot read it as JSON ({exc}); {REBUILD_HINT}") from exc
    if not isinstance(meta, dict):
        raise StoreError(f"{meta_path}: expected a JSON object, found {type(meta).__name__}")
    version = meta.get("format_version")
    if isinstance(version, bool) or version not in READABLE_VERSIONS:
        readable = " and ".join(str(v) for v in READABLE_VERSIONS)
        raise StoreError(
            f"{meta_path}: format_version is {version!r}, this gnnserve reads versions "
            f"{readable}; {REBUILD_HINT} with this version"
        )
    _check_meta_fields(meta_path, meta)
    return cast(StoreMeta, meta)


def _check_meta_fields(meta_path: Path, meta: dict[str, Any]) -> None:
    """Types and ranges of meta.json's fields, so later code can trust them."""

    def bad(problem: str) -> StoreError:
        return StoreError(f"{meta_path}: {problem}; {REBUILD_HINT}")

    minimum = {"num_nodes": 1, "num_edges": 0, "feature_dim": 1, "num_classes": 0}
    for key, low in minimum.items():
        value = meta.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise bad(f"{key} must be an integer >= {low}, found {value!r}")
    names = meta.get("class_names")
    if names is not None and (
        not isinstance(names, list)
        or not all(isinstance(n, str) for n in names)
        or len(names) != meta["num_classes"]
    ):
        raise bad(f"class_names must be null or {meta['num_classes']} strings, found {names!r}")
    if meta.get("id_kind") not in ("int", "str"):
        raise bad(f"id_kind must be 'int' or 'str', found {meta.get('id_kind')!r}")
    if not isinstance(meta.get("checksum"), str):
        raise bad("checksum is missing")
    if not isinstance(meta.get("stats"), dict):
        raise bad("stats is missing")
    _check_edge_feature_fields(meta, bad)
    if "update_log" in meta:
        _check_update_log(meta["update_log"], bad)
    files = meta.get("files")
    names = list(store_files(meta))
    if not isinstance(files, dict) or sorted(files) != names:
        listed = sorted(files) if isinstance(files, dict) else files
        raise bad(f"files must list exactly {names}, found {listed!r}")
    for name, entry in files.items():
        if not (
            isinstance(entry, dict)
            and isinstance(entry.get("dtype"), str)
            and isinstance(entry.get("shape"), list)
            and all(isinstance(d, int) for d in entry["shape"])
            and isinstance(entry.get("bytes"), int)
            and isinstance(entry.get("sha256"), str)
            and isinstance(entry.get("blake3", ""), str)
        ):
            raise bad(f"files[{name!r}] must hold dtype, shape, bytes and sha256, found {entry!r}")


def _check_edge_feature_fields(meta: dict[str, Any], bad: Callable[[str], StoreError]) -> None:
    """Version 2: ``edge_feature_dim`` >= 0 and as many distinct names; version 1: neither."""
    keys = ("edge_feature_dim", "edge_feature_names")
    if meta["format_version"] == 1:
        present = [key for key in keys if key in meta]
        if present:
            raise bad(f"a format version 1 store has no edge features, found {present[0]}")
        return
    dim, names = meta.get("edge_feature_dim"), meta.get("edge_feature_names")
    if not isinstance(dim, int) or isinstance(dim, bool) or dim < 0:
        raise bad(f"edge_feature_dim must be an integer >= 0, found {dim!r}")
    if not (
        isinstance(names, list)
        and all(isinstance(name, str) for name in names)
        and len(names) == dim
        and len(set(names)) == dim
    ):
        raise bad(f"edge_feature_names must be {dim} distinct strings, found {names!r}")


def _check_update_log(entry: object, bad: Callable[[str], StoreError]) -> None:
    """A compacted store's ``update_log``: the lineage's checksum, a seq and a byte offset."""
    if not (
        isinstance(entry, dict)
        and sorted(entry) == ["base", "offset", "seq"]
        and isinstance(entry["base"], str)
        and _CHECKSUM.fullmatch(entry["base"])
        and all(
            isinstance(entry[key], int) and not isinstance(entry[key], bool) and entry[key] >= 0
            for key in ("seq", "offset")
        )
    ):
        raise bad(
            "update_log must hold base (a 64-digit hex checksum), seq and offset (integers "
            f">= 0), found {entry!r}"
        )


def _check_size(path: Path, name: str, entry: FileMeta) -> None:
    file = path / name
    if not file.is_file():
        raise StoreError(f"{file} is missing: the store is incomplete; {REBUILD_HINT}")
    size = file.stat().st_size
    if size != entry["bytes"]:
        raise StoreError(
            f"{file} is {size} bytes, meta.json says {entry['bytes']}: the file was truncated "
            f"or replaced; {REBUILD_HINT}"
        )


def _verify_checksums(path: Path, meta: StoreMeta) -> None:
    """Every file against its recorded digest, then the recorded sha256s against the checksum
    (which names the graph everywhere else: versions, logs, archives by reference)."""
    for name in store_files(meta):
        mismatch = digest_mismatch(path / name, meta["files"][name])
        if mismatch is not None:
            raise StoreError(f"{mismatch}: the file is corrupt or was changed; {REBUILD_HINT}")
    recorded = {name: entry["sha256"] for name, entry in meta["files"].items()}
    combined = combined_checksum(recorded, meta.get("update_log"))
    if combined != meta["checksum"]:
        raise StoreError(
            f"{path / META_FILE}: checksum is {meta['checksum']}, the files combine to "
            f"{combined}; {REBUILD_HINT}"
        )


def _expected_layout(meta: StoreMeta) -> dict[str, tuple[tuple[np.dtype[Any], ...], list[int]]]:
    """Allowed dtypes and the shape of each file, as the format defines them from meta's counts."""
    n, e, f = meta["num_nodes"], meta["num_edges"], meta["feature_dim"]
    if meta["id_kind"] == "int":
        id_dtypes: tuple[np.dtype[Any], ...] = (_INT64,)
    else:
        # Any width: S<k> is as wide as the longest ID. Checked by kind in _load.
        id_dtypes = (np.dtype("S1"),)
    layout = {
        "features.npy": ((np.dtype("<f4"),), [n, f]),
        "ids.npy": (id_dtypes, [n]),
        "in_degree.npy": ((_INT64,), [n]),
        "indices.npy": (_INDEX_DTYPES, [e]),
        "indptr.npy": (_INDEX_DTYPES, [n + 1]),
        "labels.npy": ((_INT64,), [n]),
        "out_degree.npy": ((_INT64,), [n]),
    }
    if EDGE_FEATURES_FILE in meta["files"]:
        layout[EDGE_FEATURES_FILE] = ((np.dtype("<f4"),), [e, meta.get("edge_feature_dim", 0)])
    if REMOVED_IDS_FILE in meta["files"]:  # 1-D, as long as meta.json records
        layout[REMOVED_IDS_FILE] = (id_dtypes, meta["files"][REMOVED_IDS_FILE]["shape"][:1])
    return layout


def open_recorded_array(
    file: Path, entry: Mapping[str, Any], rebuild: str, verify_checksum: bool = False
) -> np.ndarray:
    """A ``.npy`` file memory-mapped read-only (no pickle), checked against the dtype, shape
    and, if asked, the digest its meta.json recorded: the one way every store of this package
    and of model/ opens its arrays. StoreError names the file and ends with ``rebuild``."""
    mismatch = digest_mismatch(file, entry) if verify_checksum else None
    if mismatch is not None:
        raise StoreError(f"{mismatch}: the file is corrupt; {rebuild}")
    try:
        array = np.load(file, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise StoreError(f"{file}: cannot read it as a .npy array ({exc}); {rebuild}") from exc
    found = f"{array.dtype.str} {list(array.shape)}"
    recorded = f"{entry['dtype']} {entry['shape']}"
    if found != recorded:
        raise StoreError(
            f"{file} holds {found} (dtype, shape), meta.json says {recorded}: the files and "
            f"meta.json disagree; {rebuild}"
        )
    return array


def _load(
    path: Path,
    name: str,
    entry: FileMeta,
    expected: tuple[tuple[np.dtype[Any], ...], list[int]],
    version: int,
) -> np.ndarray:
    file = path / name
    array = open_recorded_array(file, entry, REBUILD_HINT)
    found = f"{array.dtype.str} {list(array.shape)}"
    dtypes, shape = expected
    if array.dtype.kind == "S" and dtypes[0].kind == "S":
        dtype_ok = array.dtype.itemsize >= 1
    else:
        dtype_ok = array.dtype in dtypes
    if not dtype_ok or list(array.shape) != shape:
        allowed = " or ".join("S<k>" if d.kind == "S" else d.str for d in dtypes)
        raise StoreError(
            f"{file} holds {found}, format version {version} needs {allowed} {shape}; "
            f"{REBUILD_HINT}"
        )
    return array


def _blocks(length: int) -> Iterator[tuple[int, int]]:
    for start in range(0, length, _SCAN_BLOCK):
        yield start, min(start + _SCAN_BLOCK, length)


def _check_structure(path: Path, meta: StoreMeta, arrays: dict[str, np.ndarray]) -> None:
    """The invariants the sampler and the model rely on, checked in bounded-memory passes."""
    n, e = meta["num_nodes"], meta["num_edges"]
    indptr, indices = arrays["indptr.npy"], arrays["indices.npy"]

    def bad(name: str, problem: str) -> StoreError:
        return StoreError(f"{path / name}: {problem}; {REBUILD_HINT}")

    if indptr[0] != 0 or indptr[-1] != e:
        raise bad(
            "indptr.npy",
            f"indptr must start at 0 and end at num_edges={e}, found {indptr[0]} .. {indptr[-1]}",
        )
    for start, stop in _blocks(n):
        counts = np.diff(indptr[start : stop + 1])
        drops = np.flatnonzero(counts < 0)
        if drops.size:
            v = start + int(drops[0])
            raise bad(
                "indptr.npy",
                f"indptr must never decrease, found indptr[{v}]={indptr[v]} > "
                f"indptr[{v + 1}]={indptr[v + 1]}",
            )
        if not np.array_equal(counts, arrays["in_degree.npy"][start:stop]):
            raise bad("in_degree.npy", "in_degree disagrees with indptr's in-edge counts")
        ids = arrays["ids.npy"][start : min(stop + 1, n)]
        if not np.all(ids[1:] > ids[:-1]):
            raise bad("ids.npy", "ids must be sorted ascending without duplicates")
    for start, stop in _blocks(e):
        block = indices[start:stop]
        if block.min() < 0 or block.max() >= n:
            raise bad(
                "indices.npy",
                f"source indices must be in [0, {n}), found values from {block.min()} to "
                f"{block.max()}",
            )
    if REMOVED_IDS_FILE in arrays:
        _check_removed_ids(path, arrays["ids.npy"], arrays[REMOVED_IDS_FILE])
    out_degree = np.bincount(indices, minlength=n)
    if not np.array_equal(out_degree, arrays["out_degree.npy"]):
        raise bad("out_degree.npy", "out_degree disagrees with the edges in indices.npy")
    labels, num_classes = arrays["labels.npy"], meta["num_classes"]
    for start, stop in _blocks(n):
        block = labels[start:stop]
        if block.min() < -1 or block.max() >= num_classes:
            raise bad(
                "labels.npy",
                f"labels must be -1 (unlabelled) or in [0, {num_classes}), found values from "
                f"{block.min()} to {block.max()}",
            )


def _check_removed_ids(path: Path, ids: np.ndarray, removed: np.ndarray) -> None:
    """Sorted, unique, and none of them a node of the store (a removed node is gone)."""
    file = path / REMOVED_IDS_FILE
    hint = "compact the source store again with `python -m graph_assets.compact`"
    if not np.all(removed[1:] > removed[:-1]):
        raise StoreError(f"{file}: removed IDs must be sorted ascending without duplicates; {hint}")
    if len(removed):
        pos = np.minimum(np.searchsorted(ids, removed), len(ids) - 1)
        both = removed[ids[pos] == removed]
        if len(both):
            raise StoreError(
                f"{file}: {len(both)} removed IDs are also nodes of the store (first: "
                f"{both[0]!r}); {hint}"
            )


def check_edge_ids(edge_ids: np.ndarray, count: int, what: str) -> None:
    """Edge IDs must be a 1-D integer array of values in ``[0, count)`` (``what`` they are)."""
    if edge_ids.ndim != 1 or edge_ids.dtype.kind not in "iu":
        raise ValueError(
            f"edge_ids must be a 1-D integer array, got dtype {edge_ids.dtype} shape "
            f"{edge_ids.shape}"
        )
    if edge_ids.min() < 0 or edge_ids.max() >= count:
        raise ValueError(
            f"edge IDs must be {what} in [0, {count}), got values from {edge_ids.min()} to "
            f"{edge_ids.max()}"
        )


def node_key(id_kind: IdKind, x: object) -> int | bytes | None:
    """The canonical key of an external ID in a store of ``id_kind`` (None: cannot be an ID)."""
    return _as_int_id(x) if id_kind == "int" else _as_str_id(x)
