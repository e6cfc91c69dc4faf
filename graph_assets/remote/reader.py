"""`RemoteStore`: a graph loaded into Redis, read in batches.

Each batched read is one pipelined round (the cluster client writes to every shard it needs,
then reads their replies), never one per node, and costs one MGET per group of blocks it
touches (graph_assets.remote.layout; on a single Redis one MGET): in-lists of many nodes,
feature rows of many nodes of one type, edge-feature rows by edge ID, degrees, labels,
external IDs of indices, lookups of external IDs (two rounds: the found rows' IDs are
checked). Decoded block fields stay in a bounded LRU cache until an update drops their blocks.
Every value is verified before it is decoded (its checksum, size and pointers, finite
features): a lost one raises RemoteDataLost, any other RemoteDataCorrupt, each naming its key.
The reads and their meanings are the memory-mapped store's
(`graph_assets.graph_view.GraphView`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
from redis.cluster import RedisCluster

from graph_assets.graph_view import InLists
from graph_assets.live.redis_log import shown_url
from graph_assets.remote.allocator import FreedBuffers
from graph_assets.remote.cache import BlockCache, Segments
from graph_assets.remote.connect import Client, connect, execute, guarded
from graph_assets.remote.errors import RemoteDataCorrupt, RemoteDataLost, RemoteGraphError
from graph_assets.remote.id_cache import IdCache
from graph_assets.remote.layout import (
    ADJ,
    DEG,
    LABELS,
    Adjacency,
    Keys,
    RemoteLayout,
    check_prefix,
    edge_features_field,
    features_field,
    id_shards,
    ids_field,
    key_array,
    unsealed,
)
from graph_assets.remote.loader import COMPLETE
from graph_assets.schema import GraphSchema
from graph_assets.stored.store import (
    IdKind,
    MetaFigures,
    StoreMeta,
    UpdateLogMeta,
    check_edge_ids,
    node_key,
    removed_ids_file,
)

_MB = 1 << 20
_DEGREE_SCAN = 1 << 16  # nodes per read when the largest out-degree is looked for
BlockField = tuple[int, str]  # (block, field)


@dataclass(frozen=True)
class _BlockLists:
    """The in-lists of some blocks: each block's pointers (``ptr``), in-edges' sources
    (``src``) and relations (``rel``, None on a graph of one relation)."""

    ptr: Segments
    src: Segments
    rel: Segments | None


@dataclass
class RemoteCounters:
    """What a store's reads cost so far: pipelined rounds and the commands they carried, value
    bytes received, block fields found in or missing from the cache, and seconds spent waiting
    for Redis."""

    round_trips: int = 0
    commands: int = 0
    bytes_read: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    id_hits: int = 0
    id_misses: int = 0
    read_seconds: float = 0.0


def open_remote_store(
    url: str,
    prefix: str,
    expected_checksum: str,
    *,
    cache_mb: float,
    timeout_ms: int,
    environ: Mapping[str, str] | None = None,
) -> RemoteStore:
    """The graph loaded under ``prefix`` at ``url`` (a Redis Cluster or a single Redis), after
    checking that it is the graph of ``expected_checksum``, completely loaded, in a layout this
    version reads. RemoteGraphError (one line) when it is not, RemoteUnavailable when Redis
    does not answer within ``timeout_ms``."""
    shown = shown_url(url)
    try:
        keys = Keys(check_prefix(prefix))
    except ValueError as error:
        raise RemoteGraphError(str(error)) from None
    client = connect(url, timeout_ms, environ)
    try:
        layout = _checked_layout(client, keys, shown, expected_checksum)
        keys = layout.keys(keys.prefix)
        pipe = client.pipeline(transaction=False)
        for part in range(layout.edge_start_parts):
            pipe.get(keys.edge_starts(part))
        values = execute(client, pipe, shown)
        parts = []
        for part, value in enumerate(values):
            key = keys.edge_starts(part)
            if value is None:
                raise RemoteDataLost(_lost(shown, keys, f"key {key}"), key)
            body = unsealed(value)
            if body is None:
                what = "a value that fails its checksum"
                raise RemoteDataCorrupt(_corrupt(shown, keys, key, what), key)
            parts.append(np.frombuffer(body, dtype="<i8"))
        edge_starts = np.concatenate(parts)
        if len(edge_starts) != layout.num_blocks + 1:
            key = keys.edge_starts(0)
            what = f"{len(edge_starts)} block edges, the layout says {layout.num_blocks + 1}"
            raise RemoteDataCorrupt(_corrupt(shown, keys, key, what), key)
        cache, ids = budgeted_caches(int(cache_mb * _MB))
        return RemoteStore(client, keys, layout, edge_starts, cache, shown, ids)
    except BaseException:
        client.close()
        raise


def budgeted_caches(budget_bytes: int) -> tuple[BlockCache, IdCache]:
    """A worker's caches within ``budget_bytes`` (``remote_cache_mb``) in all: an eighth for
    ID lookups, the rest for the block cache's arrays, which the graph's blocks and the
    precomputed rows share (they take up to twice the rows held, so it holds half of it)."""
    ids = budget_bytes // 8
    return BlockCache((budget_bytes - ids) // 2), IdCache(ids)


def _checked_layout(client: Client, keys: Keys, shown: str, expected: str) -> RemoteLayout:
    where = f"{shown} prefix {keys.prefix!r}"
    record = guarded(shown, lambda: client.hgetall(keys.graph))
    if not record:
        raise RemoteGraphError(
            f"{where} holds no graph: load it with `python -m graph_assets load-redis --store "
            f"STORE --url {shown} --prefix {keys.prefix}`"
        )
    try:
        layout = RemoteLayout.from_json(record[b"layout"])
    except (KeyError, ValueError) as error:
        raise RemoteGraphError(f"{where}: {error}") from None
    if layout.checksum != expected:
        raise RemoteGraphError(
            f"{where} holds graph {layout.checksum[:12]}, expected {expected[:12]}: load the "
            "expected store there, or point at the prefix that holds it"
        )
    if record.get(b"state") != COMPLETE:
        done = guarded(shown, lambda: client.hlen(keys.done))
        raise RemoteGraphError(
            f"{where}: the load is not finished ({done} chunks so far): run `python -m "
            "graph_assets load-redis` with the same store, URL and prefix again"
        )
    return layout


def _lost(shown: str, keys: Keys, what: str) -> str:
    return (
        f"{shown} prefix {keys.prefix!r} lost {what} (evicted or deleted: Redis must run with "
        "maxmemory-policy noeviction); run `python -m graph_assets load-redis` again to "
        "restore it"
    )


def _corrupt(shown: str, keys: Keys, key: str, what: str) -> str:
    return (
        f"{shown} prefix {keys.prefix!r}: key {key} holds {what} (was it overwritten?); run "
        "`python -m graph_assets load-redis` again to restore it"
    )


class RemoteStore(MetaFigures):
    """A graph in Redis, read in pipelined batches through a bounded block cache; use
    `open_remote_store` to get one. Global node indices and edge IDs are the store's."""

    def __init__(
        self,
        client: Client,
        keys: Keys,
        layout: RemoteLayout,
        edge_starts: np.ndarray,
        cache: BlockCache,
        shown: str,
        ids: IdCache | None = None,
    ) -> None:
        self.client = client
        self.keys = keys
        self.layout = layout
        self.edge_starts = edge_starts  # [blocks + 1]: each block's first edge ID, then E
        self.cache = cache
        self.ids = ids if ids is not None else IdCache(0)
        self.shown = shown
        self._counters = RemoteCounters()
        self.freed = FreedBuffers()  # the reads' raw values, handed back once decoded
        self._largest_out: int | None = None

    @property
    def meta(self) -> StoreMeta:
        return self.layout.meta

    @property
    def schema(self) -> GraphSchema:
        return self.layout.schema

    @property
    def update_log(self) -> UpdateLogMeta | None:
        """Where the loaded store's updates continue in its lineage's log (its meta.json's, so
        live updates over Redis share the log of the same store served from its directory)."""
        return self.meta.get("update_log")

    @property
    def log_base(self) -> str:
        """The checksum naming the lineage's update log, as on the store itself."""
        lineage = self.update_log
        return lineage["base"] if lineage is not None else self.checksum

    @property
    def folded_seq(self) -> int:
        """Seq of the last update record folded into the loaded store (live updates continue
        after it, as on the store itself)."""
        lineage = self.update_log
        return lineage["seq"] if lineage is not None else 0

    def was_removed(self, node_id: int | str, node_type: str | None = None) -> bool:
        """Whether an update removed ``node_id`` before the store was compacted. The removed
        IDs of a compacted store are not loaded into Redis: a store that has some is refused
        here (RemoteGraphError) rather than let ``add_node`` reuse one."""
        t = 0 if node_type is None else self.schema.type_index(node_type)
        entry = self.meta["files"].get(removed_ids_file(t))
        if entry is not None and entry["shape"][0] > 0:
            raise RemoteGraphError(
                f"{self.shown} prefix {self.keys.prefix!r}: the store was compacted after "
                "node removals, whose IDs are not in Redis; serve it from its directory"
            )
        return False

    @property
    def edge_feature_dim(self) -> int:
        """Features per edge, shared by every relation (ValueError when they differ)."""
        widths = {r.edge_feature_dim for r in self.schema.relations}
        if len(widths) > 1:
            raise ValueError(
                "the relations of this graph have different edge features; ask the schema "
                "for each relation's"
            )
        return widths.pop() if widths else 0

    @property
    def counters(self) -> RemoteCounters:
        """A snapshot of what the reads so far cost."""
        return dataclasses.replace(self._counters)

    def close(self) -> None:
        self.client.close()

    def invalidate(self, nodes: np.ndarray) -> None:
        """Drops the cached blocks of ``nodes`` (an update changed them): their next read goes
        to Redis."""
        blocks = np.unique(np.asarray(nodes, dtype=np.int64) // self.layout.block_size)
        self.cache.drop_blocks(blocks)

    def types_of(self, nodes: np.ndarray) -> np.ndarray:
        return self.schema.types_of(nodes)

    @property
    def cache_bytes(self) -> int:
        """Bytes the worker's caches of this graph take: the block cache's arrays and indices
        and the ID lookups (at most ``cache_mb`` in all)."""
        return self.cache.footprint + self.ids.nbytes

    def lookup(self, ids: Sequence[int | str], node_type: str | None = None) -> np.ndarray:
        """Global indices (int64) of external ``ids`` of ``node_type`` (default: the target
        type), -1 for an ID the type lacks, as `GraphStore.lookup` matches them; found ones
        are cached (the graph in Redis never changes under a worker), the rest in two rounds
        (the map, then the found rows' stored IDs: RemoteDataCorrupt for an entry that points
        at another node's row)."""
        t = 0 if node_type is None else self.schema.type_index(node_type)
        kind = self.schema.node_types[t]
        keys = [node_key(cast(IdKind, kind.id_kind), x) for x in ids]
        usable = [i for i, key in enumerate(keys) if key is not None]
        wanted = [key for key in keys if key is not None]
        found = np.full(len(keys), -1, dtype=np.int64)
        if not wanted:
            return found
        cached = self.ids.get(t, wanted)
        missing = np.flatnonzero(cached < 0)
        self._counters.id_hits += len(wanted) - len(missing)
        self._counters.id_misses += len(missing)
        if len(missing):
            asked = [wanted[p] for p in missing.tolist()]
            fetched = self._fetched_ids(t, asked)
            self.ids.put(t, asked, fetched)
            cached[missing] = fetched
        found[usable] = cached
        return found

    def _fetched_ids(self, t: int, wanted: list[int | bytes]) -> np.ndarray:
        """Global indices of canonical keys ``wanted`` of type ``t`` from Redis, each checked
        against the external ID its row holds (`_check_id_rows`): two rounds."""
        kind = self.schema.node_types[t]
        found = np.full(len(wanted), -1, dtype=np.int64)
        array = key_array(wanted, self.layout.id_dtypes[t])
        shards = id_shards(array, self.layout.id_shards[t])
        names = [key if isinstance(key, bytes) else str(key).encode("ascii") for key in wanted]
        groups: dict[int, list[int]] = {}
        for position, shard in enumerate(shards.tolist()):
            groups.setdefault(shard, []).append(position)
        replies = self._round(
            lambda pipe: [
                pipe.hmget(self.keys.id_shard(t, shard), [names[p] for p in members])
                for shard, members in groups.items()
            ]
        )
        for shard, members, values in zip(groups, groups.values(), replies, strict=True):
            for position, value in zip(members, values, strict=True):
                if value is None:
                    continue
                index = int(value) if value.isdigit() else -1
                if not 0 <= index < kind.num_nodes:
                    key = self.keys.id_shard(t, shard)
                    shown_id = _shown_id(wanted[position])
                    what = f"{value[:40]!r} for ID {shown_id}, not a row of {kind.name!r}"
                    raise RemoteDataCorrupt(_corrupt(self.shown, self.keys, key, what), key)
                found[position] = index + kind.offset
        self._check_id_rows(t, array, found, shards)
        return found

    def _check_id_rows(
        self, t: int, asked: np.ndarray, found: np.ndarray, shards: np.ndarray
    ) -> None:
        """Refuses an ID-map entry that points at a row holding another external ID (an entry
        overwritten with another node's index would answer for that node under the asked ID).
        The rows' blocks are read with their in-lists, in one round: sampling the found nodes
        reads those next, from the cache."""
        hits = np.flatnonzero(found >= 0)
        if not len(hits):
            return
        nodes = found[hits]
        blocks, inverse = np.unique(nodes // self.layout.block_size, return_inverse=True)
        fetched = self._fetch({ids_field(t): blocks, ADJ: blocks})
        (rows,) = fetched[ids_field(t)]
        stored = self._gather(nodes, blocks, inverse, rows, node_type=t)
        wrong = np.flatnonzero(stored != asked[hits])
        if len(wrong):
            at = int(hits[wrong[0]])
            key = self.keys.id_shard(t, int(shards[at]))
            what = (
                f"ID {_shown_id(asked[at].item())} -> node {int(found[at])}, whose row holds "
                f"ID {_shown_id(stored[wrong[0]].item())}"
            )
            raise RemoteDataCorrupt(_corrupt(self.shown, self.keys, key, what), key)

    def feature_rows(self, nodes: np.ndarray) -> np.ndarray:
        """float32 ``[len(nodes), F]`` feature rows of global ``nodes``, all of one type."""
        nodes = self._checked(nodes)
        t = self._one_type(nodes)
        width = self.schema.node_types[t].feature_dim
        if not width or not len(nodes):
            return np.zeros((len(nodes), width), dtype=np.float32)
        return self._rows(nodes, features_field(t), node_type=t)

    def external_ids(self, nodes: np.ndarray) -> list[int | str]:
        """External IDs of global ``nodes`` (ints or strs, as the input had them); one round
        for every type among them."""
        nodes = self._checked(nodes)
        types = self.types_of(nodes)
        present = _distinct(types).tolist()
        bs = self.layout.block_size
        split = {t: np.unique(nodes[types == t] // bs, return_inverse=True) for t in present}
        fetched = self._fetch({ids_field(t): blocks for t, (blocks, _) in split.items()})
        values: list[Any] = [None] * len(nodes)
        for t, (blocks, inverse) in split.items():
            where = np.flatnonzero(types == t)
            (rows,) = fetched[ids_field(t)]
            ids = self._gather(nodes[where], blocks, inverse, rows, node_type=t).tolist()
            if self.schema.node_types[t].id_kind == "str":
                ids = [value.decode("utf-8") for value in ids]
            for position, value in zip(where.tolist(), ids, strict=True):
                values[position] = value
        return values

    def degree_rows(self, nodes: np.ndarray) -> np.ndarray:
        """int64 full-graph in-degrees of global ``nodes``, self-loops not counted."""
        degrees = self._degrees(nodes)
        return degrees[:, 0] - degrees[:, 2]

    def in_degree_rows(self, nodes: np.ndarray) -> np.ndarray:
        """int64 in-degrees of global ``nodes``, every stored in-edge counted."""
        return self._degrees(nodes)[:, 0].copy()

    def out_degree_rows(self, nodes: np.ndarray) -> np.ndarray:
        """int64 full-graph out-degrees of global ``nodes``, self-loops not counted (the
        loader stores each node's out-degree and self-loops in its degree row)."""
        degrees = self._degrees(nodes)
        return degrees[:, 1] - degrees[:, 2]

    def largest_out_degree(self) -> int:
        """The largest ``out_degree_rows`` of any node (0 without edges): read once, in
        blocks of nodes, on first use (only a ChebConv without normalisation and without
        ``lambda_max`` asks), then kept: the stored graph never changes."""
        if self._largest_out is None:
            largest = 0
            for start in range(0, self.num_nodes, _DEGREE_SCAN):
                nodes = np.arange(start, min(self.num_nodes, start + _DEGREE_SCAN))
                largest = max(largest, int(self.out_degree_rows(nodes).max()))
            self._largest_out = largest
        return self._largest_out

    def label_rows(self, nodes: np.ndarray) -> np.ndarray:
        """int64 class indices of target-type ``nodes`` (-1: unlabelled)."""
        nodes = self._checked(nodes)
        targets = self.schema.target_type.num_nodes
        if len(nodes) and nodes.max() >= targets:
            raise ValueError(
                f"labels are the target type's, global indices [0, {targets}); got up to "
                f"{nodes.max()}"
            )
        if not len(nodes):
            return np.empty(0, dtype=np.int64)
        return self._rows(nodes, LABELS)

    def in_lists(self, nodes: np.ndarray) -> InLists:
        """The in-edge lists of global ``nodes`` with their edge IDs and relations, as the
        store's CSC arrays hold them; one round for all of them."""
        nodes = self._checked(nodes)
        if not len(nodes):
            empty = np.empty(0, dtype=np.int64)
            return InLists(np.zeros(1, dtype=np.int64), empty, empty, empty)
        blocks, inverse = np.unique(nodes // self.layout.block_size, return_inverse=True)
        lists = self._block_lists(blocks)
        ptr = lists.ptr
        at = ptr.start[inverse] + nodes - blocks[inverse] * self.layout.block_size
        starts, ends = ptr.rows[at], ptr.rows[at + 1]
        counts = ends - starts
        indptr = np.zeros(len(nodes) + 1, dtype=np.int64)
        np.cumsum(counts, out=indptr[1:])
        edge_ids = np.arange(indptr[-1], dtype=np.int64) + np.repeat(starts - indptr[:-1], counts)
        first = ptr.rows[ptr.start[inverse]]  # each node's block's first edge ID
        # An edge's row in a part (sources, relations) of its block: its ID past the block's
        # first, counted from the block's start in that part.
        src = lists.src
        sources = src.rows[edge_ids + np.repeat(src.start[inverse] - first, counts)]
        relations = np.zeros(len(edge_ids), dtype=np.int64)
        if lists.rel is not None:
            rel = lists.rel
            relations = rel.rows[edge_ids + np.repeat(rel.start[inverse] - first, counts)]
        return InLists(
            indptr=indptr,
            indices=sources.astype(np.int64),
            edge_ids=edge_ids,
            relations=relations.astype(np.int64, copy=False),
        )

    def edge_relations(self, edge_ids: np.ndarray) -> np.ndarray:
        """The relation index (int64) of each edge by ID."""
        edge_ids = self._checked_edges(edge_ids)
        if not self.layout.several_relations or not len(edge_ids):
            return np.zeros(len(edge_ids), dtype=np.int64)
        blocks, inverse, local = self._edge_blocks(edge_ids)
        rel = self._block_lists(blocks).rel
        assert rel is not None
        return rel.rows[rel.start[inverse] + local].astype(np.int64)

    def edge_feature_rows(self, edge_ids: np.ndarray) -> np.ndarray:
        """float32 ``[len(edge_ids), D]`` features of edges by ID (CSC position), all of one
        relation (ValueError otherwise): one round, two on a graph of several relations when
        the edges' blocks are not cached (`in_lists` caches them)."""
        edge_ids = self._checked_edges(edge_ids)
        relations = self.schema.relations
        if not len(edge_ids):
            return np.zeros((0, relations[0].edge_feature_dim), dtype=np.float32)
        blocks, inverse, local = self._edge_blocks(edge_ids)
        relation, row, counts = 0, local, None
        if self.layout.several_relations:
            lists = self._block_lists(blocks)
            assert lists.rel is not None
            rel = lists.rel.compacted()  # only these blocks' edges
            at = rel.start[inverse] + local
            relation = int(rel.rows[at[0]])
            if (rel.rows[at] != relation).any():
                raise ValueError("edge features of several relations have several widths")
            # A block's table of a relation holds the block's edges of that relation in CSC
            # order: an edge's row is the number of them before it in its block.
            before = np.concatenate([[0], np.cumsum(rel.rows == relation)])
            row = before[at] - before[rel.start[inverse]]
            counts = np.diff(before[np.append(rel.start, len(rel.rows))])  # per block
        width = relations[relation].edge_feature_dim
        if not width:
            return np.zeros((len(edge_ids), 0), dtype=np.float32)
        field = edge_features_field(relation)
        (table,) = self._fetch({field: blocks})[field]
        self._check_rows(blocks, field, table.count, counts)
        return table.rows[table.start[inverse] + row]

    def prefetch(self, nodes: np.ndarray, edge_ids: np.ndarray) -> None:
        """Fetches into the cache, in one round, what gathering an ego-graph's inputs reads:
        the feature rows and degrees of ``nodes`` and the features of ``edge_ids``, so that
        the ``feature_rows``, ``degree_rows`` and ``edge_feature_rows`` calls that follow
        (one per node type and relation) cost no round trip of their own. The edges' relations
        are read from their blocks' in-lists, which sampling them cached."""
        nodes, edge_ids = self._checked(nodes), self._checked_edges(edge_ids)
        bs = self.layout.block_size
        blocks = _distinct(nodes // bs)
        wanted = {DEG: blocks}
        for t, kind in enumerate(self.schema.node_types):
            if kind.feature_dim:  # the blocks holding nodes of the type
                low = np.maximum(blocks * bs, kind.offset)
                wanted[features_field(t)] = blocks[low < np.minimum((blocks + 1) * bs, kind.stop)]
        wide = [r.edge_feature_dim > 0 for r in self.schema.relations]
        if len(edge_ids) and any(wide):
            edge_blocks, inverse, _ = self._edge_blocks(edge_ids)
            owner = edge_blocks[inverse]
            relations = self.edge_relations(edge_ids)
            for r in _distinct(relations).tolist():
                if wide[r]:
                    wanted[edge_features_field(r)] = _distinct(owner[relations == r])
        self._fetch(wanted)

    def _block_lists(self, blocks: np.ndarray) -> _BlockLists:
        """The in-lists of ``blocks`` (unique, at least one); one round for those not cached."""
        parts = self._fetch({ADJ: blocks})[ADJ]
        return _BlockLists(parts[0], parts[1], parts[2] if len(parts) > 2 else None)

    def _edge_blocks(self, edge_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The blocks holding ``edge_ids`` (unique), each edge's block among them, and its
        position among its block's in-edges."""
        owner = np.searchsorted(self.edge_starts, edge_ids, side="right") - 1
        blocks, inverse = np.unique(owner, return_inverse=True)
        return blocks, inverse, edge_ids - self.edge_starts[owner]

    def _degrees(self, nodes: np.ndarray) -> np.ndarray:
        nodes = self._checked(nodes)
        if not len(nodes):
            return np.empty((0, 3), dtype=np.int64)
        return self._rows(nodes, DEG)

    def _checked(self, nodes: np.ndarray) -> np.ndarray:
        nodes = np.asarray(nodes, dtype=np.int64).reshape(-1)
        if len(nodes) and (nodes.min() < 0 or nodes.max() >= self.num_nodes):
            raise ValueError(
                f"internal indices must be in [0, {self.num_nodes}), got values from "
                f"{nodes.min()} to {nodes.max()}; map external IDs with lookup() first"
            )
        return nodes

    def _checked_edges(self, edge_ids: np.ndarray) -> np.ndarray:
        edge_ids = np.asarray(edge_ids)
        if edge_ids.size:
            check_edge_ids(edge_ids, self.num_edges, "CSC positions")
        return edge_ids.astype(np.int64)

    def _one_type(self, nodes: np.ndarray) -> int:
        if len(self.schema.node_types) == 1 or not len(nodes):
            return 0
        types = self.types_of(nodes)
        if (types != types[0]).any():
            raise ValueError("feature rows of nodes of several types have several widths")
        return int(types[0])

    def _rows(self, nodes: np.ndarray, field: str, node_type: int | None = None) -> np.ndarray:
        """The rows of ``nodes`` (at least one) in ``field`` of their blocks; one round for
        the blocks not cached."""
        blocks, inverse = np.unique(nodes // self.layout.block_size, return_inverse=True)
        (rows,) = self._fetch({field: blocks})[field]
        return self._gather(nodes, blocks, inverse, rows, node_type)

    def _gather(
        self,
        nodes: np.ndarray,
        blocks: np.ndarray,
        inverse: np.ndarray,
        rows: Segments,
        node_type: int | None,
    ) -> np.ndarray:
        """The rows of ``nodes`` (each in ``blocks[inverse]``) among ``rows`` of ``blocks``
        (``node_type``'s rows for a per-type field: a block's rows of a type start at the
        type's first node in it)."""
        first = blocks * self.layout.block_size
        if node_type is not None:
            first = np.maximum(first, self.schema.node_types[node_type].offset)
        return rows.rows[rows.start[inverse] + nodes - first[inverse]]

    def _fetch(self, wanted: Mapping[str, np.ndarray]) -> dict[str, tuple[Segments, ...]]:
        """Each field's decoded rows of its blocks (unique, at least one), in order, per part
        (an in-list's pointers, sources and relations; one part otherwise): from the cache,
        the rest in one round."""
        found: dict[str, tuple[np.ndarray, tuple[Segments, ...]]] = {}
        missing: list[BlockField] = []
        for field, blocks in wanted.items():
            if len(blocks):
                found[field] = self.cache.lookup(field, blocks)
                missing += [(b, field) for b in blocks[~found[field][0]].tolist()]
        self._counters.cache_hits += sum(int(held.sum()) for held, _ in found.values())
        self._counters.cache_misses += len(missing)
        values = self.block_values(missing) if missing else []
        result: dict[str, tuple[Segments, ...]] = {}
        taken = 0
        for field, (held, parts) in found.items():
            if held.all():
                result[field] = parts
                continue
            absent = wanted[field][~held]
            new = self._decoded(field, absent, values[taken : taken + len(absent)])
            taken += len(absent)
            self.cache.put(field, absent, new)
            if held.any():
                new = tuple(
                    old.compacted().taking(n, held) for old, n in zip(parts, new, strict=True)
                )
            result[field] = new
        del values  # decoded: the raw values are freed here
        self.freed.release()
        return result

    def _decoded(
        self, field: str, blocks: np.ndarray, values: Sequence[bytes | None]
    ) -> tuple[Segments, ...]:
        """The parts of ``field`` of ``blocks`` in their ``values``. A lost value
        (RemoteDataLost), or one that fails its checksum, has the wrong length, pointers that
        do not span the block's edges or a non-finite feature (RemoteDataCorrupt), was evicted
        or overwritten by someone else: refused rather than answered from."""
        raws: list[memoryview] = []
        for block, value in zip(blocks.tolist(), values, strict=True):
            body = None if value is None else unsealed(value)
            if body is None:
                key = self.keys.block(block, field)
                if value is None:
                    raise RemoteDataLost(_lost(self.shown, self.keys, f"key {key}"), key)
                raise self._corrupt(block, field, "a value that fails its checksum")
            raws.append(body)
        sizes = np.fromiter(map(len, raws), dtype=np.int64, count=len(raws))
        edges = self.edge_starts[blocks + 1] - self.edge_starts[blocks]
        form = self.layout.fields[field]
        row_bytes = form.dtype.itemsize * (form.columns or 1)
        torn = np.flatnonzero(sizes % row_bytes)
        if len(torn):
            what = f"{sizes[torn[0]]} bytes, not whole rows"
            raise self._corrupt(int(blocks[torn[0]]), field, what)
        rows = sizes // row_bytes
        self._check_rows(blocks, field, rows, self.layout.rows_of(field, blocks, edges))
        if field != ADJ:
            flat = np.frombuffer(b"".join(raws), dtype=form.dtype)
            if form.columns is not None:
                flat = flat.reshape(-1, form.columns)
            starts = np.cumsum(rows) - rows
            if form.dtype.kind == "f" and not np.isfinite(flat).all():
                # A store holds finite features only (its writer refuses others).
                row = int(np.flatnonzero(~np.isfinite(flat).reshape(len(flat), -1).all(1))[0])
                at = int(np.searchsorted(starts, row, side="right")) - 1
                what = f"a non-finite value in row {row - int(starts[at])}"
                raise self._corrupt(int(blocks[at]), field, what)
            return (Segments(flat, starts, rows),)
        first_nodes = blocks * self.layout.block_size
        nodes = np.minimum(first_nodes + self.layout.block_size, self.num_nodes) - first_nodes
        lists = [
            Adjacency.decode(raw, n, e, self.layout)
            for raw, n, e in zip(raws, nodes.tolist(), edges.tolist(), strict=True)
        ]
        ptr = Segments.of([part.ptr for part in lists])
        first, last = ptr.rows[ptr.start], ptr.rows[ptr.start + nodes]
        shifted = np.flatnonzero(
            (first != self.edge_starts[blocks]) | (last != self.edge_starts[blocks + 1])
        )
        if len(shifted):
            what = "pointers outside its edges"
            raise self._corrupt(int(blocks[shifted[0]]), field, what)
        src = Segments.of([part.src for part in lists])
        if not self.layout.several_relations:
            return ptr, src
        return ptr, src, Segments.of([cast(np.ndarray, part.rel) for part in lists])

    def _check_rows(
        self, blocks: np.ndarray, field: str, found: np.ndarray, expected: np.ndarray | None
    ) -> None:
        """Refuses the first of ``blocks`` whose ``field`` holds other than ``expected`` rows
        (bytes of an in-list; None: any number)."""
        if expected is None:
            return
        wrong = np.flatnonzero(found != expected)
        if len(wrong):
            unit = "bytes" if field == ADJ else "rows"
            what = f"{found[wrong[0]]} {unit}, the layout says {expected[wrong[0]]}"
            raise self._corrupt(int(blocks[wrong[0]]), field, what)

    def _corrupt(self, block: int, field: str, what: str) -> RemoteDataCorrupt:
        key = self.keys.block(block, field)
        return RemoteDataCorrupt(_corrupt(self.shown, self.keys, key, what), key)

    def block_values(self, requests: Sequence[BlockField]) -> list[bytes | None]:
        """The raw values of ``requests`` in one round: an MGET per group of blocks on a
        cluster (a command's keys must share a slot), one MGET on a single Redis."""
        if not isinstance(self.client, RedisCluster):
            names = [self.keys.block(*request) for request in requests]
            (reply,) = self._round(lambda pipe: [pipe.execute_command("MGET", *names)])
            return cast(list[bytes | None], reply)
        groups: dict[int, list[int]] = {}
        for position, (block, _) in enumerate(requests):
            groups.setdefault(self.keys.group(block), []).append(position)
        replies = self._round(
            lambda pipe: [
                pipe.execute_command("MGET", *(self.keys.block(*requests[p]) for p in members))
                for members in groups.values()
            ]
        )
        values: list[bytes | None] = [None] * len(requests)
        for members, reply in zip(groups.values(), replies, strict=True):
            for position, value in zip(members, reply, strict=True):
                values[position] = value
        return values

    def _round(self, queue: Callable[[Any], object]) -> list[Any]:
        """One pipelined round trip: ``queue(pipeline)`` adds the commands; their replies."""
        pipe = self.client.pipeline(transaction=False)
        queue(pipe)
        self._counters.commands += len(pipe)
        started = time.perf_counter()
        try:
            replies = execute(self.client, pipe, self.shown)
        finally:
            self._counters.round_trips += 1
            self._counters.read_seconds += time.perf_counter() - started
        received = sum(_reply_bytes(reply) for reply in replies)
        self._counters.bytes_read += received
        self.freed.received(received)
        return replies


def _distinct(keys: np.ndarray) -> np.ndarray:
    """The distinct ``keys``, ascending: what `np.unique` answers, by one sort (numpy 2.4's
    unique without ``return_inverse`` hashes, about 8x slower on a few thousand IDs)."""
    ordered = np.sort(keys)
    first = np.empty(len(ordered), dtype=bool)
    first[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
    return ordered[first]


def _shown_id(value: int | bytes) -> str:
    """An external ID as requests write it (a string ID's UTF-8 bytes decoded)."""
    return repr(value.decode("utf-8", "replace") if isinstance(value, bytes) else value)


def _reply_bytes(reply: object) -> int:
    if isinstance(reply, bytes):
        return len(reply)
    if isinstance(reply, list):
        return sum(_reply_bytes(item) for item in reply)
    return 0
