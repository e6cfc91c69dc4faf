"""Where a graph lives in Redis: the key of every piece and the format of every value, in one
place for the loader that writes them and the reader that reads them.

Nodes are grouped into blocks of ``block_size`` consecutive global indices, and blocks into
``slot_groups`` groups (block ``b`` in group ``b % slot_groups``), each group one hash tag whose
hash slot lies in its share of the cluster's 16384 slots, so the groups spread evenly over the
shards. Everything one sampling step reads of a block (its in-lists, its feature rows per node
type, its in-edges' relations and edge features per relation, its degrees, labels and external
IDs) is a key under its group's tag: a read of any number of blocks is one MGET per group it
touches (Redis costs per command far more than per key), all in one pipelined round. External
ID -> index maps are small hashes spread by a hash of the ID (``{NAME:m<type>:<shard>}``); the
record of the graph, the load's progress and each block's first edge ID sit under ``{NAME}``.
Values are raw little-endian arrays, each block value and edge-starts part followed by its
checksum (`sealed`), which every read verifies.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

import numpy as np
import xxhash
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from graph_assets.schema import GraphSchema
from graph_assets.stored.store import GraphStore, MetaFigures, StoreMeta, schema_of

# This layout's version, recorded with every loaded graph. 3: every block value carries a
# checksum; a graph loaded in 2 (no checksums) is refused with how to reload it.
REMOTE_FORMAT = 3
# The checksum after each value: xxh3-64 (8 bytes). A cold read verifies every value it
# receives, and xxh3 does it in about a tenth of the time of zlib.crc32 or blake3 (16 KiB:
# 0.3-1.2 us against 3-10 us on a shared 2-core machine; bench/experiments/block_checksum.py),
# so it costs a cold batch of the 10M-edge graph (102 MiB in 6,528 values) 2-9 ms where crc32
# would cost 20-90; a warm batch reads nothing and verifies nothing. It guards against
# accidents (a bad write, a value overwritten by another tool), not an attacker with write
# access to Redis, who could seal a value too.
CHECK_BYTES = 8
DEFAULT_BLOCK_SIZE = 32
# Hash tags the blocks are spread over: a batched read costs one MGET per group it touches, and
# the groups are the unit a cluster balances. 48 divides evenly over 2, 3, 4, 6, 8, 12, 16, 24
# and 48 primaries; fewer groups read faster (measured: bench/experiments/remote_reads.py).
SLOT_GROUPS = 48
# Redis keeps a hash of up to 128 short fields as a listpack (a few bytes per field instead of
# a hash table's ~60): about 64 IDs per shard keeps nearly every shard under that.
IDS_PER_SHARD = 64
IDS_PER_CHUNK = 1 << 14  # IDs written per pipelined round while loading
EDGE_STARTS_PER_KEY = 1 << 17  # each block's first edge ID, 1 MB per key
CHUNK_BYTES = 4 << 20  # about what one pipelined round of a load writes
_PREFIX = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")

# The fields of a block: its in-lists (``Adjacency``, one value: a hop reads it with one
# command per block), degrees (in, out, self-loops), labels (target type); per node type its
# features and IDs, per relation the features of the block's in-edges of that relation in CSC
# order. Redis's cost is per command more than per byte, so what is read together is one value.
ADJ, DEG, LABELS = "adj", "deg", "y"
DEGREE_COLUMNS = 3


def features_field(node_type: int) -> str:
    return f"x{node_type}"


def ids_field(node_type: int) -> str:
    return f"id{node_type}"


def edge_features_field(relation: int) -> str:
    return f"e{relation}"


def sealed(value: bytes) -> bytes:
    """``value`` followed by its checksum, as the loader writes every block value."""
    return value + xxhash.xxh3_64_digest(value)


def unsealed(raw: bytes) -> memoryview | None:
    """The value sealed in ``raw`` (a view, no copy); None when ``raw`` is shorter than a
    checksum or fails it (the value was changed after the load wrote it)."""
    if len(raw) < CHECK_BYTES:
        return None
    body = memoryview(raw)[:-CHECK_BYTES]
    return body if xxhash.xxh3_64_digest(body) == raw[-CHECK_BYTES:] else None


def check_prefix(prefix: str) -> str:
    """``prefix`` if it can name a graph (letters, digits, ``_.-``; it becomes a URL's path
    and part of every key), else ValueError saying what is allowed."""
    if not _PREFIX.fullmatch(prefix):
        raise ValueError(
            "a graph's prefix is 1-100 letters, digits, '_', '.' or '-', starting with a letter "
            f"or digit, got {prefix!r}"
        )
    return prefix


@dataclass(frozen=True)
class Keys:
    """The key names of the graph under ``prefix``, its blocks in ``slot_groups`` groups."""

    prefix: str
    slot_groups: int = SLOT_GROUPS

    @cached_property
    def group_tags(self) -> tuple[str, ...]:
        """Each group's hash tag: ``NAME:g<group>.<k>`` with the first ``k`` whose slot lies in
        the group's equal share of the slots (a cluster created with equal slot ranges then
        holds an equal share of the groups)."""
        tags = []
        for group in range(self.slot_groups):
            low = group * REDIS_CLUSTER_HASH_SLOTS // self.slot_groups
            high = (group + 1) * REDIS_CLUSTER_HASH_SLOTS // self.slot_groups
            k = 0
            while not low <= key_slot(f"{self.prefix}:g{group}.{k}".encode()) < high:
                k += 1
            tags.append(f"{self.prefix}:g{group}.{k}")
        return tuple(tags)

    def group(self, block: int) -> int:
        """The group of ``block``: consecutive blocks fall in different groups, so a hot range
        of nodes is spread over the shards."""
        return block % self.slot_groups

    @property
    def graph(self) -> str:
        """A hash: ``layout`` (JSON) and ``state`` (``loading`` or ``complete``)."""
        return f"{{{self.prefix}}}:graph"

    @property
    def done(self) -> str:
        """A hash: each loaded chunk's name -> the sha256 of what it wrote."""
        return f"{{{self.prefix}}}:done"

    def edge_starts(self, part: int) -> str:
        return f"{{{self.prefix}}}:edges:{part}"

    def block(self, block: int, field: str) -> str:
        return f"{{{self.group_tags[self.group(block)]}}}:b{block}:{field}"

    def id_shard(self, node_type: int, shard: int) -> str:
        return f"{{{self.prefix}:m{node_type}:{shard}}}"


Rows = Literal["adjacency", "nodes", "targets", "type", "relation"]


@dataclass(frozen=True)
class FieldFormat:
    """A block field's values: ``dtype``, ``columns`` per row (None: one value per row), and
    what its rows are (``rows``: the bytes of an `Adjacency`, nodes, target-type nodes, nodes
    of node type ``index``, or in-edges of relation ``index``)."""

    dtype: np.dtype[Any]
    columns: int | None
    rows: Rows
    index: int = 0

    def encode(self, array: np.ndarray) -> bytes:
        return np.ascontiguousarray(array, dtype=self.dtype).tobytes()

    def decode(self, raw: bytes) -> np.ndarray:
        flat = np.frombuffer(raw, dtype=self.dtype)
        return flat if self.columns is None else flat.reshape(-1, self.columns)


@dataclass(frozen=True)
class RemoteLayout(MetaFigures):
    """How one store is laid out in Redis; recorded as JSON with the graph.

    Attributes:
        meta: the store's meta.json (schema, counts, class names, files, checksum).
        block_size: nodes per block.
        slot_groups: hash tags the blocks are spread over (`Keys`).
        chunk_blocks: blocks per chunk of a load (one pipelined round, about CHUNK_BYTES).
        ids_per_chunk: IDs per chunk of a load.
        id_shards: per node type, the hashes its ID map is spread over.
        src_dtype: the stored in-neighbours' dtype (int32 or int64).
        id_dtypes: per node type, its IDs' dtype (int64, or ``|S<k>`` UTF-8 bytes).
    """

    meta: StoreMeta
    block_size: int
    slot_groups: int
    chunk_blocks: int
    ids_per_chunk: int
    id_shards: tuple[int, ...]
    src_dtype: str
    id_dtypes: tuple[str, ...]

    @classmethod
    def of_store(cls, store: GraphStore, block_size: int) -> RemoteLayout:
        """The layout of ``store`` in blocks of ``block_size`` nodes."""
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {block_size}")
        stored = sum(entry["bytes"] for entry in store.meta["files"].values())
        block_bytes = max(1, stored * block_size // max(1, store.num_nodes))
        types = store.schema.node_types
        return cls(
            meta=store.meta,
            block_size=block_size,
            slot_groups=SLOT_GROUPS,
            chunk_blocks=max(1, CHUNK_BYTES // block_bytes),
            ids_per_chunk=IDS_PER_CHUNK,
            id_shards=tuple(-(-max(1, t.num_nodes) // IDS_PER_SHARD) for t in types),
            src_dtype=store.indices.dtype.str,
            id_dtypes=tuple(table.ids.dtype.str for table in store.tables),
        )

    def to_json(self) -> str:
        record = {
            "format": REMOTE_FORMAT,
            "block_size": self.block_size,
            "slot_groups": self.slot_groups,
            "chunk_blocks": self.chunk_blocks,
            "ids_per_chunk": self.ids_per_chunk,
            "id_shards": list(self.id_shards),
            "src_dtype": self.src_dtype,
            "id_dtypes": list(self.id_dtypes),
            "meta": self.meta,
        }
        return json.dumps(record, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> RemoteLayout:
        """The recorded layout; ValueError saying what is wrong with it."""
        try:
            record = json.loads(text)
            found = record["format"]
        except (KeyError, TypeError, json.JSONDecodeError) as error:
            raise ValueError(f"the recorded layout is malformed: {error}") from None
        if found != REMOTE_FORMAT:
            raise ValueError(
                f"it was loaded in layout format {found}, this gnnserve reads {REMOTE_FORMAT}: "
                "reload it with `python -m graph_assets load-redis` under a new --prefix"
            )
        try:
            layout = cls(
                meta=record["meta"],
                block_size=_positive(record["block_size"]),
                slot_groups=_positive(record["slot_groups"]),
                chunk_blocks=_positive(record["chunk_blocks"]),
                ids_per_chunk=_positive(record["ids_per_chunk"]),
                id_shards=tuple(_positive(s) for s in record["id_shards"]),
                src_dtype=str(np.dtype(record["src_dtype"]).str),
                id_dtypes=tuple(str(np.dtype(d).str) for d in record["id_dtypes"]),
            )
            schema = layout.schema
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"the recorded layout is malformed: {error}") from None
        count = len(schema.node_types)
        if len(layout.id_shards) != count or len(layout.id_dtypes) != count:
            raise ValueError(f"the recorded layout does not describe {count} node types")
        return layout

    @cached_property
    def schema(self) -> GraphSchema:
        return schema_of(self.meta)

    def keys(self, prefix: str) -> Keys:
        """The key names of this layout's graph under ``prefix``."""
        return Keys(prefix, self.slot_groups)

    @property
    def num_blocks(self) -> int:
        return -(-self.num_nodes // self.block_size)

    @property
    def several_relations(self) -> bool:
        """Whether a block's `Adjacency` records each in-edge's relation."""
        return len(self.schema.relations) > 1

    @property
    def edge_start_parts(self) -> int:
        """How many keys hold the table of each block's first edge ID."""
        return -(-(self.num_blocks + 1) // EDGE_STARTS_PER_KEY)

    def block_nodes(self, block: int) -> tuple[int, int]:
        """The global indices ``[start, stop)`` of ``block``."""
        start = block * self.block_size
        return start, min(start + self.block_size, self.num_nodes)

    def type_rows(self, block: int, node_type: int) -> tuple[int, int]:
        """The global indices ``[start, stop)`` of ``node_type`` within ``block`` (empty:
        ``start >= stop``)."""
        start, stop = self.block_nodes(block)
        kind = self.schema.node_types[node_type]
        return max(start, kind.offset), min(stop, kind.stop)

    @cached_property
    def fields(self) -> dict[str, FieldFormat]:
        """Every field a block may hold and its format."""
        schema = self.schema
        formats = {
            ADJ: FieldFormat(np.dtype("u1"), None, "adjacency"),
            DEG: FieldFormat(np.dtype("<i8"), DEGREE_COLUMNS, "nodes"),
            LABELS: FieldFormat(np.dtype("<i8"), None, "targets"),
        }
        for t, node_type in enumerate(schema.node_types):
            formats[ids_field(t)] = FieldFormat(np.dtype(self.id_dtypes[t]), None, "type", t)
            if node_type.feature_dim:
                width = node_type.feature_dim
                formats[features_field(t)] = FieldFormat(np.dtype("<f4"), width, "type", t)
        for r, relation in enumerate(schema.relations):
            if relation.edge_feature_dim:
                formats[edge_features_field(r)] = FieldFormat(
                    np.dtype("<f4"), relation.edge_feature_dim, "relation", r
                )
        return formats

    def rows_of(self, field: str, blocks: np.ndarray, edges: np.ndarray) -> np.ndarray | None:
        """How many rows ``field`` of each of ``blocks`` (whose in-edges are ``edges``) must
        hold (int64; bytes for an `Adjacency`); None for a relation's edge features on a graph
        of several relations (the blocks' relations say)."""
        start = blocks * self.block_size
        stop = np.minimum(start + self.block_size, self.num_nodes)
        form = self.fields[field]
        if form.rows == "type":
            kind = self.schema.node_types[form.index]
            return np.maximum(0, np.minimum(stop, kind.stop) - np.maximum(start, kind.offset))
        if form.rows == "relation":
            return None if self.several_relations else edges
        counts = {
            "adjacency": Adjacency.size(stop - start, edges, self),
            "nodes": stop - start,
            "targets": np.maximum(0, np.minimum(stop, self.schema.target_type.num_nodes) - start),
        }
        return counts[form.rows]


@dataclass(frozen=True)
class Adjacency:
    """A block's in-lists: ``ptr`` (int64, the block's nodes plus one: absolute CSC positions,
    so a node's edge IDs are ``ptr[i]``, ``ptr[i] + 1``, ...), ``src`` (each in-edge's
    source) and ``rel`` (each in-edge's relation; None on a graph of one relation), stored
    end to end in one value."""

    ptr: np.ndarray
    src: np.ndarray
    rel: np.ndarray | None

    @staticmethod
    def size(nodes: np.ndarray, edges: np.ndarray, layout: RemoteLayout) -> np.ndarray:
        """The bytes of each adjacency of ``nodes`` nodes with ``edges`` in-edges."""
        per_edge = np.dtype(layout.src_dtype).itemsize + (2 if layout.several_relations else 0)
        return 8 * (nodes + 1) + per_edge * edges

    def encode(self, layout: RemoteLayout) -> bytes:
        parts = [np.asarray(self.ptr, "<i8"), np.asarray(self.src, layout.src_dtype)]
        if self.rel is not None:
            parts.append(np.asarray(self.rel, "<i2"))
        return b"".join(part.tobytes() for part in parts)

    @classmethod
    def decode(
        cls, raw: bytes | memoryview, nodes: int, edges: int, layout: RemoteLayout
    ) -> Adjacency:
        """The adjacency of ``nodes`` nodes with ``edges`` in-edges in ``raw`` (`size` bytes
        long: the caller checks)."""
        src_dtype = np.dtype(layout.src_dtype)
        at = 8 * (nodes + 1)
        src = np.frombuffer(raw, src_dtype, edges, at)
        rel = None
        if layout.several_relations:
            rel = np.frombuffer(raw, "<i2", edges, at + edges * src_dtype.itemsize)
        return cls(np.frombuffer(raw, "<i8", nodes + 1), src, rel)


def _positive(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"expected an integer >= 1, found {value!r}")
    return value


_FNV_OFFSET, _FNV_PRIME = np.uint64(0xCBF29CE484222325), np.uint64(0x100000001B3)


def id_shards(keys: np.ndarray, shards: int) -> np.ndarray:
    """The ID-map shard (int64) of each ID: FNV-1a of its bytes (an int ID's 8 little-endian
    bytes, a string ID's UTF-8 bytes without the fixed-width padding) modulo ``shards``; the
    loader and the reader both place IDs with it."""
    if keys.dtype.kind == "S":
        data = np.frombuffer(keys.tobytes(), dtype=np.uint8).reshape(len(keys), keys.itemsize)
        present = data != 0  # stored IDs hold no NUL: only the padding does
    else:
        data = np.ascontiguousarray(keys, dtype="<i8").view(np.uint8).reshape(len(keys), 8)
        present = np.ones(data.shape, dtype=bool)
    digest = np.full(len(keys), _FNV_OFFSET, dtype=np.uint64)
    for column in range(data.shape[1]):
        mixed = (digest ^ data[:, column].astype(np.uint64)) * _FNV_PRIME
        digest = np.where(present[:, column], mixed, digest)
    return (digest % np.uint64(shards)).astype(np.int64)


def id_fields(keys: np.ndarray) -> list[bytes]:
    """The ID-map field of each ID: an int's decimal digits, a string's UTF-8 bytes."""
    if keys.dtype.kind == "S":
        return list(keys.tolist())
    return [str(value).encode("ascii") for value in keys.tolist()]


def key_array(keys: Sequence[int | bytes], id_dtype: str) -> np.ndarray:
    """Canonical ID keys (graph_assets.stored.store.node_key) as the array `id_shards` hashes."""
    if np.dtype(id_dtype).kind == "S":
        return np.array(keys, dtype=np.bytes_) if keys else np.empty(0, dtype="S1")
    return np.array(keys, dtype=np.int64)
