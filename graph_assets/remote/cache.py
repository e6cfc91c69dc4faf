"""A bounded, least-recently-used cache of decoded block fields, the hot rows a worker keeps
so that popular nodes cost no round trip; an update drops the blocks it touches."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

import numpy as np

BlockField = tuple[int, str]  # (block, field)
_ENTRY_OVERHEAD = 200  # bytes the dict entry and the array object cost beside the data


class BlockCache:
    """Decoded ``(block, field)`` arrays, evicted least recently used first once they would
    hold more than ``capacity_bytes`` (0: nothing is kept)."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.nbytes = 0
        self._entries: OrderedDict[BlockField, np.ndarray] = OrderedDict()
        self._fields: dict[int, set[str]] = {}  # block -> its fields held, for drop_blocks

    def get(self, key: BlockField) -> np.ndarray | None:
        array = self._entries.get(key)
        if array is not None:
            self._entries.move_to_end(key)
        return array

    def put(self, key: BlockField, array: np.ndarray) -> None:
        size = _size(array)
        if size > self.capacity_bytes:
            return
        self._remove(key)
        while self.nbytes + size > self.capacity_bytes:
            self._remove(next(iter(self._entries)))
        self._entries[key] = array
        self._fields.setdefault(key[0], set()).add(key[1])
        self.nbytes += size

    def drop_blocks(self, blocks: Iterable[int]) -> None:
        """Forgets every field of ``blocks``."""
        for block in blocks:
            for field in list(self._fields.get(block, ())):
                self._remove((block, field))

    def _remove(self, key: BlockField) -> None:
        array = self._entries.pop(key, None)
        if array is None:
            return
        self.nbytes -= _size(array)
        fields = self._fields[key[0]]
        fields.discard(key[1])
        if not fields:
            del self._fields[key[0]]


def _size(array: np.ndarray) -> int:
    return array.nbytes + _ENTRY_OVERHEAD
