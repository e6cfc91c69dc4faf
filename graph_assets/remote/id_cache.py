"""A bounded cache of external ID -> global index lookups, so that a warm batch makes no round
trip for its IDs.

A found index can be kept for as long as the worker serves the graph: the graph in Redis never
changes under a worker (its checksum is checked at start; updates live in the worker's overlay,
which answers added and removed nodes itself). An ID Redis lacks is never kept: its answer
(-1) costs a round trip each time, so that a later load or an added node is never hidden.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import numpy as np

# Bytes an entry costs beside its key's own object: the int value (28-32) and the dict's slot
# with its growth slack (measured with tracemalloc: 116 bytes an entry for int keys of 28).
_ENTRY_BYTES = 32 + 96
# Once full, eviction frees this share of the capacity beyond what a put needs.
_EVICT_SLACK = 1 / 16

Key = int | bytes


class IdCache:
    """Global indices of canonical ID keys (`graph_assets.stored.store.node_key`) per node
    type, dropped oldest first once they would take more than ``capacity_bytes`` (0: none
    kept)."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.nbytes = 0
        self._types: dict[int, dict[Key, int]] = {}

    def get(self, node_type: int, keys: Sequence[Key]) -> np.ndarray:
        """int64 index of each of ``keys``, -1 where it is not held."""
        entries = self._types.get(node_type)
        if not entries:
            return np.full(len(keys), -1, dtype=np.int64)
        return np.fromiter((entries.get(key, -1) for key in keys), np.int64, len(keys))

    def put(self, node_type: int, keys: Sequence[Key], indices: np.ndarray) -> None:
        """Keeps the found ones (``indices`` >= 0) of ``keys``, as far as the capacity allows."""
        if not self.capacity_bytes:
            return
        found = [(key, int(index)) for key, index in zip(keys, indices.tolist(), strict=True)]
        found = [(key, index) for key, index in found if index >= 0]
        need = sum(_entry_bytes(key) for key, _ in found)
        if not found or need > self.capacity_bytes:
            return
        if self.nbytes + need > self.capacity_bytes:
            slack = int(self.capacity_bytes * _EVICT_SLACK)
            self._evict(self.nbytes + need - self.capacity_bytes + slack)
        entries = self._types.setdefault(node_type, {})
        for key, index in found:
            if key not in entries:
                self.nbytes += _entry_bytes(key)
            entries[key] = index

    def _evict(self, at_least: int) -> None:
        """Frees at least ``at_least`` bytes (or everything), the oldest entries first."""
        freed = 0
        for entries in self._types.values():
            gone = []
            for key in entries:
                if freed >= at_least:
                    break
                gone.append(key)
                freed += _entry_bytes(key)
            for key in gone:
                del entries[key]
        self.nbytes -= freed


def _entry_bytes(key: Key) -> int:
    return sys.getsizeof(key) + _ENTRY_BYTES
