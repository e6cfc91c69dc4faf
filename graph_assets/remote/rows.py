"""A precomputed archive's rows (``model.precompute``) kept in Redis beside the graph they were
computed from, so workers of an archive served from Redis need no whole-graph array.

Several archives (a node and a link model, or two versions) may keep rows beside one graph:
each build's rows are named by its ``rows_id`` (a digest of their ``meta.json``). Keys follow
the graph's layout (``graph_assets.remote.layout``): the rows of array ``a`` of the nodes of
block ``b`` are the value ``{group tag}:b<b>:p<id>.<a>`` (float32, every column), and the
block's out-lists (which rows an update reaches; the graph's, shared by every build)
``{group tag}:b<b>:out`` (int64: the block's ``n + 1`` pointers, then its out-neighbours), each
value followed by its checksum as the graph's are (``layout.sealed``). A
read of any number of nodes is one MGET per group of blocks, in one pipelined round
(``RemoteStore.block_values``). The rows' ``meta.json`` sits at ``{NAME}:precomputed:<id>``,
written last: a worker reads its archive's there.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from graph_assets.remote.cache import Segments
from graph_assets.remote.connect import Client, execute
from graph_assets.remote.errors import RemoteDataCorrupt, RemoteDataLost
from graph_assets.remote.layout import CHUNK_BYTES, Keys, sealed, unsealed
from graph_assets.remote.reader import RemoteStore

OUT_FIELD = "out"


def rows_id(meta: dict[str, Any]) -> str:
    """What names one build's rows: a digest of their meta (weights, graph, time, files)."""
    return hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()[:16]


def rows_field(rows: str, array: int) -> str:
    return f"p{rows}.{array}"


def meta_key(keys: Keys, rows: str) -> str:
    return f"{{{keys.prefix}}}:precomputed:{rows}"


def load_rows(
    client: Client,
    keys: Keys,
    block_size: int,
    arrays: Sequence[np.ndarray],
    out_indptr: np.ndarray,
    out_indices: np.ndarray,
    meta: dict[str, Any],
    shown: str,
) -> int:
    """Writes ``arrays`` (named by ``rows_id(meta)``) and the out-lists by blocks in pipelined
    rounds of about ``CHUNK_BYTES``, then ``meta`` (the record a worker reads); returns the
    bytes written."""
    name = rows_id(meta)
    rows = len(arrays[0])
    nodes = len(out_indptr) - 1
    written = 0
    pending: list[tuple[str, bytes]] = []

    def flush() -> None:
        pipe = client.pipeline(transaction=False)
        for key, value in pending:
            pipe.set(key, value)
        execute(client, pipe, shown)
        pending.clear()

    size = 0

    def add(key: str, value: bytes) -> None:
        nonlocal size
        value = sealed(value)
        pending.append((key, value))
        size += len(value)

    for block in range(-(-max(rows, nodes) // block_size)):
        first = block * block_size
        for index, array in enumerate(arrays):
            if first < rows:
                part = np.ascontiguousarray(array[first : first + block_size], dtype="<f4")
                add(keys.block(block, rows_field(name, index)), part.tobytes())
        if first < nodes:
            ptr = np.asarray(out_indptr[first : min(first + block_size, nodes) + 1], dtype="<i8")
            out = np.asarray(out_indices[ptr[0] : ptr[-1]], dtype="<i8")
            add(keys.block(block, OUT_FIELD), (ptr - ptr[0]).tobytes() + out.tobytes())
        if size >= CHUNK_BYTES:
            written, size = written + size, 0
            flush()
    if pending:
        written += size
        flush()
    pipe = client.pipeline(transaction=False)
    pipe.set(meta_key(keys, name), json.dumps(meta, sort_keys=True))
    execute(client, pipe, shown)
    return written


def read_meta(store: RemoteStore, rows: str) -> dict[str, Any] | None:
    """The meta of the rows ``rows`` loaded beside ``store``'s graph; None when there are none."""
    pipe = store.client.pipeline(transaction=False)
    pipe.get(meta_key(store.keys, rows))
    (raw,) = execute(store.client, pipe, store.shown)
    return None if raw is None else cast(dict[str, Any], json.loads(raw))


class RemoteRows:
    """Rows of ``widths`` arrays of ``count`` nodes and every node's out-list, read from the
    cluster in one round per read through the graph's block cache, so that one budget
    (``remote_cache_mb``) bounds both (the stored rows never change: an update's refreshed rows
    live in the worker, ``handler.graph.precomputed``)."""

    def __init__(self, store: RemoteStore, rows: str, widths: Sequence[int], count: int) -> None:
        self.store = store
        self.rows = rows
        self.widths = tuple(widths)
        self.count = count
        self.cache = store.cache

    def read(self, array: int, nodes: np.ndarray) -> np.ndarray:
        """float32 rows of array ``array`` of ``nodes`` (each below ``count``)."""
        nodes = np.asarray(nodes, dtype=np.int64)
        width = self.widths[array]
        if nodes.size == 0:
            return np.zeros((0, width), dtype=np.float32)
        bs = self.store.layout.block_size
        blocks, inverse = np.unique(nodes // bs, return_inverse=True)
        (rows,) = self._fetch(rows_field(self.rows, array), blocks)
        return np.array(rows.rows[rows.start[inverse] + nodes - blocks[inverse] * bs])

    def every_row(self, array: int) -> np.ndarray:
        """Every node's rows of ``array`` (a link archive's top-k table), in one round."""
        return self.read(array, np.arange(self.count, dtype=np.int64))

    def out_neighbours(self, nodes: np.ndarray) -> np.ndarray:
        """The out-neighbours of ``nodes`` (graph nodes), end to end, in one round."""
        nodes = np.asarray(nodes, dtype=np.int64)
        if nodes.size == 0:
            return np.zeros(0, dtype=np.int64)
        bs = self.store.layout.block_size
        blocks, inverse = np.unique(nodes // bs, return_inverse=True)
        ptr, out = self._fetch(OUT_FIELD, blocks)
        at = ptr.start[inverse] + nodes - blocks[inverse] * bs
        starts = out.start[inverse] + ptr.rows[at]
        counts = ptr.rows[at + 1] - ptr.rows[at]
        ends = np.cumsum(counts)
        flat = np.repeat(starts - (ends - counts), counts) + np.arange(int(ends[-1]))
        return np.asarray(out.rows[flat], dtype=np.int64)

    def _fetch(self, field: str, blocks: np.ndarray) -> tuple[Segments, ...]:
        """``field``'s decoded parts of ``blocks`` (unique, ascending): cached, the rest in
        one round."""
        held, parts = self.cache.lookup(field, blocks)
        if held.all():
            return parts
        absent = blocks[~held]
        values = self.store.block_values([(int(b), field) for b in absent.tolist()])
        new = self._decoded(field, absent, values)
        self.cache.put(field, absent, new)
        del values  # decoded: the raw values are freed here
        self.store.freed.release()
        if held.any():
            return tuple(old.compacted().taking(n, held) for old, n in zip(parts, new, strict=True))
        return new

    def _decoded(
        self, field: str, blocks: np.ndarray, values: Sequence[bytes | None]
    ) -> tuple[Segments, ...]:
        """The parts of ``field`` of ``blocks`` in their ``values``: a lost value
        (RemoteDataLost), or one that fails its checksum or holds a non-finite row
        (RemoteDataCorrupt), is refused rather than served."""
        raws: list[memoryview] = []
        for block, value in zip(blocks.tolist(), values, strict=True):
            body = None if value is None else unsealed(value)
            if body is None:
                what = "is missing (evicted or deleted?)" if value is None else "fails its checksum"
                raise self._refused(block, field, what, lost=value is None)
            raws.append(body)
        if field != OUT_FIELD:
            width = self.widths[int(field.rsplit(".", 1)[1])]
            parts = [np.frombuffer(raw, dtype="<f4").reshape(-1, width) for raw in raws]
            for block, part in zip(blocks.tolist(), parts, strict=True):
                if not np.isfinite(part).all():
                    raise self._refused(block, field, "holds a non-finite value", lost=False)
            return (Segments.of(parts),)
        bs = self.store.layout.block_size
        num_nodes = self.store.num_nodes
        ptrs, outs = [], []
        for block, raw in zip(blocks.tolist(), raws, strict=True):
            n = min(bs, num_nodes - block * bs) + 1
            flat = np.frombuffer(raw, dtype="<i8")
            ptrs.append(flat[:n])
            outs.append(flat[n:])
        return Segments.of(ptrs), Segments.of(outs)

    def _refused(
        self, block: int, field: str, what: str, lost: bool
    ) -> RemoteDataLost | RemoteDataCorrupt:
        key = self.store.keys.block(block, field)
        message = (
            f"{self.store.shown}: the precomputed rows' key {key} {what}; rebuild the archive "
            "with ./build_mar.sh --precompute to load them again"
        )
        return RemoteDataLost(message, key) if lost else RemoteDataCorrupt(message, key)
