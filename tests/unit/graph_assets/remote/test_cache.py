"""The block cache: least recently used out first, never over its capacity, and an
invalidated block's fields all gone."""

from __future__ import annotations

import numpy as np

from graph_assets.remote.cache import BlockCache


def test_least_recently_used_goes_first_and_the_bound_holds() -> None:
    row = np.zeros(100, dtype=np.float32)  # 400 bytes, about 600 with the entry's overhead
    cache = BlockCache(capacity_bytes=1300)  # two of them
    cache.put((0, "x0"), row)
    cache.put((1, "x0"), row)
    assert cache.get((0, "x0")) is row  # 0 is now the most recent
    cache.put((2, "x0"), row)
    assert cache.get((1, "x0")) is None and cache.get((0, "x0")) is row
    assert cache.nbytes <= cache.capacity_bytes
    cache.put((3, "big"), np.zeros(1000, dtype=np.float32))  # larger than the whole cache
    assert cache.get((3, "big")) is None and cache.get((2, "x0")) is row


def test_dropping_a_block_forgets_every_field_of_it() -> None:
    cache = BlockCache(capacity_bytes=1 << 20)
    for field in ("adj", "deg", "x0"):
        cache.put((7, field), np.arange(3))
    cache.put((8, "adj"), np.arange(3))
    cache.drop_blocks([7, 9])
    assert [cache.get((7, f)) for f in ("adj", "deg", "x0")] == [None, None, None]
    assert cache.get((8, "adj")) is not None
    assert cache.nbytes == 3 * 8 + 200
