"""Copying a store into Redis (a cluster or a single server) in pipelined chunks, resumably.

A load is a fixed list of chunks (each block chunk: a run of blocks; each ID chunk: a run of
one node type's IDs; each edge-starts chunk: a part of the table of each block's first edge ID).
Each chunk is written in one pipelined round, then recorded in ``{NAME}:done`` with the sha256
of what it wrote; every block value carries its own checksum (``layout.sealed``), which readers
verify. A second run writes only the chunks not recorded; a run that finds them all
recorded reads every chunk back, checks it against its sha256, and writes again any that
differs (a key evicted or overwritten). The graph is marked complete when every chunk is in.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

import numpy as np
from tqdm import tqdm

from graph_assets.remote.connect import Client, guarded
from graph_assets.remote.errors import RemoteGraphError
from graph_assets.remote.layout import (
    ADJ,
    DEFAULT_BLOCK_SIZE,
    DEG,
    EDGE_STARTS_PER_KEY,
    LABELS,
    Adjacency,
    Keys,
    RemoteLayout,
    check_prefix,
    edge_features_field,
    features_field,
    id_fields,
    id_shards,
    ids_field,
    sealed,
)
from graph_assets.stored.store import GraphStore

COMPLETE, LOADING = b"complete", b"loading"  # the graph record's ``state``


@dataclass(frozen=True)
class Entry:
    """One value a chunk writes: ``key`` (a string value), or ``field`` of hash ``key``."""

    key: str
    value: bytes
    field: bytes | None = None


@dataclass(frozen=True)
class Chunk:
    """One pipelined round of a load: ``kind`` over ``[start, stop)`` (blocks, a node type's
    ID positions, or edge-starts parts), ``rows`` the nodes and edges, or IDs, it carries."""

    kind: Literal["blocks", "ids", "edge_starts"]
    start: int
    stop: int
    rows: int
    node_type: int = 0

    @property
    def name(self) -> str:
        """How ``{NAME}:done`` records it."""
        if self.kind == "ids":
            return f"i{self.node_type}.{self.start}"
        return f"{'b' if self.kind == 'blocks' else 's'}{self.start}"


@dataclass
class LoadReport:
    """What a load did.

    Attributes:
        chunks: chunks of the whole load.
        written: chunks this run wrote (missing ones, or ones that failed verification).
        already: chunks an earlier run had written.
        verified: chunks read back and checked (a run that found the load complete).
        repaired: names of verified chunks that differed from the store and were rewritten.
        rows: nodes, edges and IDs this run wrote; ``bytes`` their values' size.
        seconds: how long this run took.
        complete: whether every chunk is in (the graph can be served).
    """

    chunks: int
    written: int = 0
    already: int = 0
    verified: int = 0
    repaired: list[str] = field(default_factory=list)
    rows: int = 0
    bytes: int = 0
    seconds: float = 0.0
    complete: bool = False


def load_store(
    store: GraphStore,
    client: Client,
    prefix: str,
    *,
    shown_url: str,
    block_size: int = DEFAULT_BLOCK_SIZE,
    max_chunks: int | None = None,
) -> LoadReport:
    """Loads ``store`` under ``prefix`` (``shown_url`` names the server in messages), continuing
    an earlier load of the same store, or verifying a finished one. ``max_chunks`` stops after
    that many chunks (a later run continues). RemoteGraphError when the prefix holds another
    graph or layout; RemoteUnavailable when Redis fails (rerun to continue)."""
    started = time.perf_counter()
    layout = RemoteLayout.of_store(store, block_size)
    keys = layout.keys(check_prefix(prefix))
    writer = _Writer(store, layout, keys, client, shown_url)
    chunks = plan(store, layout)
    done = writer.start()
    report = LoadReport(chunks=len(chunks))
    todo = [chunk for chunk in chunks if chunk.name.encode() not in done]
    report.already = len(chunks) - len(todo)
    if todo:
        writer.write(todo[:max_chunks], chunks, report)
        report.complete = report.written == len(todo)
    else:
        writer.verify(chunks, done, report)
        report.complete = True
    if report.complete:
        guarded(shown_url, lambda: client.hset(keys.graph, "state", COMPLETE))
    report.seconds = time.perf_counter() - started
    return report


def plan(store: GraphStore, layout: RemoteLayout) -> list[Chunk]:
    """Every chunk of a load of ``store`` in ``layout``, in the order a load writes them."""
    chunks = [Chunk("edge_starts", p, p + 1, 0) for p in range(layout.edge_start_parts)]
    for first in range(0, layout.num_blocks, layout.chunk_blocks):
        last = min(first + layout.chunk_blocks, layout.num_blocks)
        start, stop = first * layout.block_size, layout.block_nodes(last - 1)[1]
        edges = int(store.indptr[stop]) - int(store.indptr[start])
        chunks.append(Chunk("blocks", first, last, stop - start + edges))
    for t, node_type in enumerate(layout.schema.node_types):
        for first in range(0, node_type.num_nodes, layout.ids_per_chunk):
            last = min(first + layout.ids_per_chunk, node_type.num_nodes)
            chunks.append(Chunk("ids", first, last, last - first, node_type=t))
    return chunks


def digest(entries: Sequence[Entry]) -> bytes:
    """The sha256 (hex) of a chunk's entries, as ``{NAME}:done`` records it."""
    hasher = hashlib.sha256()
    for entry in entries:
        hasher.update(entry.key.encode())
        hasher.update(b"\0" if entry.field is None else b"\1" + entry.field)
        hasher.update(len(entry.value).to_bytes(8, "little"))
        hasher.update(entry.value)
    return hasher.hexdigest().encode("ascii")


@dataclass
class _Writer:
    store: GraphStore
    layout: RemoteLayout
    keys: Keys
    client: Client
    shown: str

    def start(self) -> dict[bytes, bytes]:
        """Records the graph under the prefix (or checks that the graph recorded there is this
        one, in this layout) and returns the chunks already done."""
        recorded = self._call(lambda: self.client.hgetall(self.keys.graph))
        if recorded:
            self._check_same(recorded)
        else:
            record = {"layout": self.layout.to_json(), "state": LOADING}
            self._call(lambda: self.client.hset(self.keys.graph, mapping=record))  # type: ignore[arg-type]
        return dict(self._call(lambda: self.client.hgetall(self.keys.done)))

    def _check_same(self, recorded: dict[bytes, bytes]) -> None:
        where = f"{self.shown} prefix {self.keys.prefix!r}"
        try:
            theirs = RemoteLayout.from_json(recorded[b"layout"])
        except (KeyError, ValueError) as error:
            raise RemoteGraphError(f"{where} holds something else: {error}") from None
        if theirs.checksum != self.layout.checksum:
            raise RemoteGraphError(
                f"{where} holds graph {theirs.checksum[:12]}, not this store's "
                f"{self.layout.checksum[:12]}: load it under another --prefix"
            )
        if theirs.block_size != self.layout.block_size:
            raise RemoteGraphError(
                f"{where} holds this graph in blocks of {theirs.block_size} nodes, this load "
                f"asks for {self.layout.block_size}: load with block size {theirs.block_size} "
                "or under another prefix"
            )
        if theirs.to_json() != self.layout.to_json():
            raise RemoteGraphError(
                f"{where} holds this graph in another layout (loaded by another gnnserve "
                "version?): load it under another prefix"
            )

    def write(self, todo: Sequence[Chunk], chunks: Sequence[Chunk], report: LoadReport) -> None:
        """Writes ``todo``, each chunk then its record, under a progress bar over every row."""
        total = sum(chunk.rows for chunk in chunks)
        initial = total - sum(chunk.rows for chunk in todo)
        with _progress("loading", total, initial) as bar:
            for chunk in todo:
                entries = self.entries(chunk)
                self._write(entries)
                self._call(partial(self.client.hset, self.keys.done, chunk.name, digest(entries)))
                report.written += 1
                report.rows += chunk.rows
                report.bytes += sum(len(entry.value) for entry in entries)
                bar.update(chunk.rows)

    def verify(self, chunks: Sequence[Chunk], done: dict[bytes, bytes], report: LoadReport) -> None:
        """Reads every chunk back; one that differs from its recorded sha256 is written again."""
        total = sum(chunk.rows for chunk in chunks)
        with _progress("verifying", total, 0) as bar:
            for chunk in chunks:
                entries = self.entries(chunk)
                if digest(self._read(entries)) != done[chunk.name.encode()]:
                    self._write(entries)
                    report.repaired.append(chunk.name)
                    report.written += 1
                    report.rows += chunk.rows
                    report.bytes += sum(len(entry.value) for entry in entries)
                report.verified += 1
                bar.update(chunk.rows)

    def entries(self, chunk: Chunk) -> list[Entry]:
        """What ``chunk`` writes, built from the store."""
        if chunk.kind == "blocks":
            return [e for block in range(chunk.start, chunk.stop) for e in self._block(block)]
        if chunk.kind == "ids":
            return self._ids(chunk)
        starts = self._edge_starts()[chunk.start * EDGE_STARTS_PER_KEY :][:EDGE_STARTS_PER_KEY]
        value = sealed(starts.astype("<i8").tobytes())
        return [Entry(self.keys.edge_starts(chunk.start), value)]

    def _edge_starts(self) -> np.ndarray:
        """Each block's first edge ID, then the number of edges."""
        indptr, size = self.store.indptr, self.layout.block_size
        return np.concatenate([indptr[: self.layout.num_nodes : size], indptr[-1:]]).astype("<i8")

    def _block(self, block: int) -> Iterator[Entry]:
        store, layout, fields = self.store, self.layout, self.layout.fields
        start, stop = layout.block_nodes(block)

        def entry(name: str, array: np.ndarray) -> Entry:
            return Entry(self.keys.block(block, name), sealed(fields[name].encode(array)))

        ptr = np.asarray(store.indptr[start : stop + 1], dtype=np.int64)
        first, last = int(ptr[0]), int(ptr[-1])
        relations = None
        if layout.several_relations:
            assert store.edge_type is not None
            relations = np.asarray(store.edge_type[first:last])
        lists = Adjacency(ptr, np.asarray(store.indices[first:last]), relations)
        yield Entry(self.keys.block(block, ADJ), sealed(lists.encode(layout)))
        loops = store.self_loop_counts
        degrees = [store.in_degree[start:stop], store.out_degree[start:stop]]
        degrees.append(np.zeros(stop - start, np.int64) if loops is None else loops[start:stop])
        yield entry(DEG, np.stack(degrees, axis=1))
        targets = layout.schema.target_type.num_nodes  # the target type is first: offset 0
        if start < targets:
            yield entry(LABELS, store.labels[start : min(stop, targets)])
        for t, node_type in enumerate(layout.schema.node_types):
            low, high = layout.type_rows(block, t)
            if low >= high:
                continue
            local = slice(low - node_type.offset, high - node_type.offset)
            yield entry(ids_field(t), store.tables[t].ids[local])
            if node_type.feature_dim:
                yield entry(features_field(t), store.tables[t].features[local])
        for r, relation in enumerate(layout.schema.relations):
            if not relation.edge_feature_dim:
                continue
            table = store.edge_features_by_relation[r]
            if relations is None:
                chosen = table[first:last]
            else:
                assert store.edge_rows is not None
                rows = np.asarray(store.edge_rows[first:last])[relations == r]
                chosen = np.take(table, rows, axis=0)
            if len(chosen):
                yield entry(edge_features_field(r), chosen)

    def _ids(self, chunk: Chunk) -> list[Entry]:
        t = chunk.node_type
        ids = np.asarray(self.store.tables[t].ids[chunk.start : chunk.stop])
        shards = id_shards(ids, self.layout.id_shards[t])
        order = np.argsort(shards, kind="stable")
        names = id_fields(ids)
        return [
            Entry(
                self.keys.id_shard(t, int(shards[i])),
                str(chunk.start + int(i)).encode("ascii"),
                names[i],
            )
            for i in order.tolist()
        ]

    def _write(self, entries: Sequence[Entry]) -> None:
        """One pipelined round: a SET per string value, an HSET per hash."""
        pipe = self.client.pipeline(transaction=False)
        hashes: dict[str, dict[bytes, bytes]] = {}
        for entry in entries:
            if entry.field is None:
                pipe.set(entry.key, entry.value)
            else:
                hashes.setdefault(entry.key, {})[entry.field] = entry.value
        for key, mapping in hashes.items():
            pipe.hset(key, mapping=mapping)  # type: ignore[arg-type]
        self._call(pipe.execute)

    def _read(self, entries: Sequence[Entry]) -> list[Entry]:
        """``entries`` as Redis holds them now (a missing value reads as empty), one round: a
        GET per string value, an HMGET per hash."""
        pipe = self.client.pipeline(transaction=False)
        strings = [entry.key for entry in entries if entry.field is None]
        hashes: dict[str, list[bytes]] = {}
        for entry in entries:
            if entry.field is not None:
                hashes.setdefault(entry.key, []).append(entry.field)
        for key in strings:
            pipe.get(key)
        for key, names in hashes.items():
            pipe.hmget(key, names)
        replies = iter(self._call(pipe.execute))
        found: dict[tuple[str, bytes | None], bytes | None] = {}
        for key in strings:
            found[key, None] = next(replies)
        for key, names in hashes.items():
            values = next(replies)
            found.update(((key, name), value) for name, value in zip(names, values, strict=True))
        return [
            Entry(entry.key, found[entry.key, entry.field] or b"", entry.field) for entry in entries
        ]

    def _call(self, call: Any) -> Any:
        return guarded(self.shown, call)


def _progress(what: str, total: int, initial: int) -> tqdm:
    """A progress bar over rows, shown on a terminal only (``disable=None``)."""
    return tqdm(total=total, initial=initial, desc=what, unit="rows", unit_scale=True, disable=None)
