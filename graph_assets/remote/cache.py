"""A bounded, least-recently-used cache of decoded block fields, the hot rows a worker keeps
so that popular nodes cost no round trip; an update drops the blocks it touches.

A cached read must cost a few numpy calls, not Python work per block: each field keeps its
blocks' rows end to end in one array per part (an in-list has three: pointers, sources,
relations) with a sorted index of the blocks it holds, so the rows of any number of blocks
are found with one ``searchsorted`` and gathered with one fancy index.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

_ENTRY_OVERHEAD = 64  # bytes an entry's index rows cost beside its data
# Once full, eviction frees this share of the capacity beyond what a put needs, so that the
# (sorting) eviction runs once per many puts rather than on each.
_EVICT_SLACK = 1 / 16
# An arena that runs out of room is compacted into one this much larger than its live rows,
# and one that drops to less than 1/_SHRINK_BELOW live rows is compacted too: the arrays take
# at most twice what the cache holds.
_ARENA_GROWTH = 1.5
_SHRINK_BELOW = 2


@dataclass(frozen=True)
class Segments:
    """Rows of some blocks: block ``i``'s are ``rows[start[i] : start[i] + count[i]]``."""

    rows: np.ndarray
    start: np.ndarray
    count: np.ndarray

    @classmethod
    def of(cls, parts: Sequence[np.ndarray]) -> Segments:
        """``parts`` (one array per block, at least one) end to end."""
        count = np.array([len(part) for part in parts], dtype=np.int64)
        return cls(np.concatenate(parts), np.cumsum(count) - count, count)

    def compacted(self) -> Segments:
        """The same blocks' rows gathered end to end (no rows of other blocks)."""
        rows = self.rows[ranges(self.start, self.count)]
        return Segments(rows, np.cumsum(self.count) - self.count, self.count)

    def taking(self, other: Segments, mine: np.ndarray) -> Segments:
        """Blocks in order, ``mine[i]`` saying whether block ``i`` is in this (compacted)
        one or, in order, in compacted ``other``."""
        start = np.empty(len(mine), dtype=np.int64)
        count = np.empty(len(mine), dtype=np.int64)
        start[mine], count[mine] = self.start, self.count
        start[~mine], count[~mine] = other.start + len(self.rows), other.count
        return Segments(np.concatenate([self.rows, other.rows]), start, count)


def ranges(start: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Indices ``start[i], ..., start[i] + count[i] - 1`` for every ``i``, end to end."""
    ends = np.cumsum(count)
    return np.repeat(start - (ends - count), count) + np.arange(ends[-1] if len(ends) else 0)


class _Field:
    """One field's cached blocks: per part an arena of rows, end to end in the order they
    came (the rows of dropped blocks left behind until the arena is compacted), and the held
    blocks sorted, each with its start and count per part, its size and its last use (1-D
    arrays each: inserting into them costs a copy, not a masked 2-D assignment)."""

    def __init__(self, like: Sequence[np.ndarray]) -> None:
        self.arenas = [np.empty((0, *part.shape[1:]), dtype=part.dtype) for part in like]
        self.row_bytes = [part.itemsize * int(np.prod(part.shape[1:])) for part in like]
        self.ends = [0] * len(like)
        self.blocks = np.empty(0, dtype=np.int64)
        self.starts = [np.empty(0, dtype=np.int64) for _ in like]
        self.counts = [np.empty(0, dtype=np.int64) for _ in like]
        self.sizes = np.empty(0, dtype=np.int64)
        self.used = np.empty(0, dtype=np.int64)

    @property
    def nbytes(self) -> int:
        index = [self.blocks, self.sizes, self.used, *self.starts, *self.counts]
        return sum(array.nbytes for array in [*self.arenas, *index])

    def positions(self, blocks: np.ndarray) -> np.ndarray:
        """Each block's index among the held ones, -1 where it is not held."""
        at = np.searchsorted(self.blocks, blocks)
        at[at == len(self.blocks)] = 0
        held = self.blocks[at] == blocks if len(self.blocks) else np.zeros(len(blocks), bool)
        return np.where(held, at, -1)

    def segments(self, at: np.ndarray) -> tuple[Segments, ...]:
        return tuple(
            Segments(arena[: self.ends[p]], self.starts[p][at], self.counts[p][at])
            for p, arena in enumerate(self.arenas)
        )

    def add(self, blocks: np.ndarray, parts: Sequence[Segments], used: int) -> int:
        """Appends ``blocks`` (not held, ascending) and returns the bytes they take."""
        at = np.searchsorted(self.blocks, blocks)
        sizes = np.full(len(blocks), _ENTRY_OVERHEAD, dtype=np.int64)
        for p, part in enumerate(parts):
            start = self._append(p, part.rows) + part.start
            self.starts[p] = np.insert(self.starts[p], at, start)
            self.counts[p] = np.insert(self.counts[p], at, part.count)
            sizes += part.count * self.row_bytes[p]
        self.blocks = np.insert(self.blocks, at, blocks)
        self.sizes = np.insert(self.sizes, at, sizes)
        self.used = np.insert(self.used, at, used)
        return int(sizes.sum())

    def remove(self, at: np.ndarray) -> int:
        """Forgets the blocks at ``at`` and returns the bytes they took."""
        keep = np.ones(len(self.blocks), dtype=bool)
        keep[at] = False
        freed = int(self.sizes[~keep].sum())
        self.blocks, self.sizes, self.used = self.blocks[keep], self.sizes[keep], self.used[keep]
        self.starts = [start[keep] for start in self.starts]
        self.counts = [count[keep] for count in self.counts]
        for part, arena in enumerate(self.arenas):
            if len(arena) > _SHRINK_BELOW * (int(self.counts[part].sum()) + 1):
                self._compact(part, 0)
        return freed

    def _append(self, part: int, rows: np.ndarray) -> int:
        """Writes ``rows`` after the part's last rows and returns where they start. Rows
        already handed out are never overwritten: a full arena is compacted into a new one."""
        if self.ends[part] + len(rows) > len(self.arenas[part]):
            self._compact(part, len(rows))
        end = self.ends[part]
        self.arenas[part][end : end + len(rows)] = rows
        self.ends[part] = end + len(rows)
        return end

    def _compact(self, part: int, extra: int) -> None:
        """Moves the part's held rows, end to end, into a new arena with room for ``extra``
        more (the old one stays whole for the rows already handed out)."""
        starts, counts = self.starts[part], self.counts[part]
        live = ranges(starts, counts)
        old = self.arenas[part]
        arena = np.empty((int(_ARENA_GROWTH * (len(live) + extra)) + 1, *old.shape[1:]), old.dtype)
        arena[: len(live)] = old[live]
        self.arenas[part], self.ends[part] = arena, len(live)
        self.starts[part] = np.cumsum(counts) - counts


class BlockCache:
    """Decoded rows of ``(block, field)`` entries, evicted least recently used first once they
    would hold more than ``capacity_bytes`` (0: nothing is kept). Its arrays take up to twice
    what it holds (rows of dropped blocks wait for a compaction)."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.nbytes = 0
        self._fields: dict[str, _Field] = {}
        self._clock = 0

    @property
    def footprint(self) -> int:
        """Bytes its arrays take: the arenas, free rows included, and the block indices."""
        return sum(entries.nbytes for entries in self._fields.values())

    def lookup(self, field: str, blocks: np.ndarray) -> tuple[np.ndarray, tuple[Segments, ...]]:
        """Which of ``blocks`` (unique) hold ``field`` here, and those blocks' rows per part,
        in order; marks them used now."""
        self._clock += 1
        entries = self._fields.get(field)
        if entries is None:
            return np.zeros(len(blocks), dtype=bool), ()
        at = entries.positions(blocks)
        held = at >= 0
        entries.used[at[held]] = self._clock
        return held, entries.segments(at[held])

    def put(self, field: str, blocks: np.ndarray, parts: Sequence[Segments]) -> None:
        """Keeps ``field`` of ``blocks`` (ascending, none held), whose rows per part are
        ``parts``, as far as the capacity allows, the least recently used going first."""
        if not len(blocks) or not self.capacity_bytes:
            return
        need = sum(part.rows.nbytes for part in parts) + _ENTRY_OVERHEAD * len(blocks)
        if need > self.capacity_bytes:
            return
        entries = self._fields.get(field)
        if entries is None:
            entries = self._fields[field] = _Field([part.rows for part in parts])
        if self.nbytes + need > self.capacity_bytes:
            slack = int(self.capacity_bytes * _EVICT_SLACK)
            self._evict(self.nbytes + need - self.capacity_bytes + slack)
        self.nbytes += entries.add(blocks, parts, self._clock)

    def drop_blocks(self, blocks: np.ndarray) -> None:
        """Forgets every field of ``blocks``."""
        blocks = np.asarray(blocks, dtype=np.int64)
        for entries in self._fields.values():
            at = entries.positions(blocks)
            self.nbytes -= entries.remove(at[at >= 0])

    def _evict(self, at_least: int) -> None:
        """Frees at least ``at_least`` bytes (or everything), least recently used first."""
        names = list(self._fields)
        used = np.concatenate([self._fields[name].used for name in names])
        sizes = np.concatenate([self._fields[name].sizes for name in names])
        owner = np.repeat(np.arange(len(names)), [len(self._fields[n].used) for n in names])
        within = np.concatenate([np.arange(len(self._fields[name].used)) for name in names])
        order = np.argsort(used)  # ties (used by one read) go in any order
        freed = np.cumsum(sizes[order])
        gone = order[: int(np.searchsorted(freed, at_least)) + 1]
        for f, name in enumerate(names):
            self.nbytes -= self._fields[name].remove(within[gone[owner[gone] == f]])
