"""The block cache: least recently used out first, never over its capacity (its arrays never
over twice that), an invalidated block's fields all gone, and every held block's rows exactly
what was put, through evictions, drops and compactions."""

from __future__ import annotations

import numpy as np

from graph_assets.remote.cache import BlockCache, Segments


def put(cache: BlockCache, field: str, blocks: list[int], *parts: list[np.ndarray]) -> None:
    cache.put(field, np.array(blocks, dtype=np.int64), [Segments.of(p) for p in parts])


def held(cache: BlockCache, field: str, blocks: list[int]) -> list[bool]:
    return cache.lookup(field, np.array(blocks, dtype=np.int64))[0].tolist()


def test_least_recently_used_goes_first_and_the_bound_holds() -> None:
    row = np.zeros((1, 100), dtype=np.float32)  # 400 bytes, 464 with the entry's overhead
    cache = BlockCache(capacity_bytes=1000)  # two of them
    put(cache, "x0", [0], [row])
    put(cache, "x0", [1], [row])
    assert held(cache, "x0", [0]) == [True]  # 0 is now the most recent
    put(cache, "x0", [2], [row])
    assert held(cache, "x0", [0, 1, 2]) == [True, False, True]
    assert cache.nbytes <= cache.capacity_bytes
    put(cache, "big", [3], [np.zeros((3, 100), dtype=np.float32)])  # more than the cache
    assert held(cache, "big", [3]) == [False] and held(cache, "x0", [2]) == [True]


def test_nothing_is_kept_without_capacity() -> None:
    cache = BlockCache(capacity_bytes=0)
    put(cache, "deg", [0], [np.zeros((2, 3), dtype=np.int64)])
    assert held(cache, "deg", [0]) == [False] and cache.nbytes == 0


def test_dropping_a_block_forgets_every_field_of_it() -> None:
    cache = BlockCache(capacity_bytes=1 << 20)
    for field in ("adj", "deg", "x0"):
        put(cache, field, [7], [np.arange(3)])
    put(cache, "adj", [8], [np.arange(3)])
    cache.drop_blocks(np.array([7, 9]))
    assert [held(cache, f, [7]) for f in ("adj", "deg", "x0")] == [[False]] * 3
    assert held(cache, "adj", [8]) == [True]
    assert cache.nbytes == 3 * 8 + 64


def test_held_rows_are_what_was_put_through_evictions_drops_and_compactions() -> None:
    rng = np.random.default_rng(0)
    cache = BlockCache(capacity_bytes=20_000)
    truth: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]] = {}
    for _ in range(300):
        field = ("a", "b")[int(rng.integers(2))]
        blocks = np.unique(rng.integers(0, 200, size=int(rng.integers(1, 20))))
        found, parts = cache.lookup(field, blocks)
        for i, block in enumerate(blocks[found].tolist()):
            for p, part in enumerate(parts):
                rows = part.rows[part.start[i] : part.start[i] + part.count[i]]
                np.testing.assert_array_equal(rows, truth[field, block][p])
        new = blocks[~found]
        values = [
            (rng.random((int(rng.integers(0, 9)), 4)), rng.integers(0, 99, int(rng.integers(9))))
            for _ in new
        ]
        if len(new):
            cache.put(field, new, [Segments.of([v[p] for v in values]) for p in (0, 1)])
        truth.update(((field, b), v) for b, v in zip(new.tolist(), values, strict=True))
        if rng.random() < 0.1:
            cache.drop_blocks(rng.integers(0, 200, size=10))
        assert 0 <= cache.nbytes <= cache.capacity_bytes
        arenas = [a for f in cache._fields.values() for a in f.arenas]
        assert sum(a.nbytes for a in arenas) <= 2 * cache.capacity_bytes  # the arrays' bound


def test_a_field_evicted_for_another_gives_its_memory_back() -> None:
    cache = BlockCache(capacity_bytes=100_000)
    row = [np.zeros((10, 50), dtype=np.float32)]  # 2,000 bytes a block
    for field in ("a", "b"):  # "b" fills the cache, evicting every block of "a"
        for block in range(0, 100, 5):
            put(cache, field, list(range(block, block + 5)), row * 5)
    assert held(cache, "a", list(range(100))) == [False] * 100
    arenas = [a for f in cache._fields.values() for a in f.arenas]
    assert sum(a.nbytes for a in arenas) <= 2 * cache.capacity_bytes


def test_segments_compact_and_interleave_blocks_in_order() -> None:
    held_rows = Segments(np.arange(10), np.array([6, 1]), np.array([2, 3]))
    new = Segments.of([np.array([100]), np.array([], dtype=np.int64)])
    mixed = held_rows.compacted().taking(new, np.array([False, True, True, False]))
    blocks = [mixed.rows[s : s + c].tolist() for s, c in zip(mixed.start, mixed.count, strict=True)]
    assert blocks == [[100], [6, 7], [1, 2, 3], []]
