"""Giving a cold read's freed buffers back to the operating system.

A read that misses the cache receives each block's value as a bytes object of its own (32
rows of 128 float32 are 16 KiB), decodes them into the cache's arrays and frees them. glibc's
malloc serves objects of that size from its heap and keeps what is freed there for later
allocations: ``free`` returns only the heap's top, and the objects still alive between the
freed ones pin the rest. A worker serving a graph larger than its cache thus kept about one
cold batch's values on top of its cache: 134 MiB on the 10M-edge benchmark graph under
Zipf(1.1) requests (PSS 422 MiB, 288 with this module; ``python -m
bench.experiments.remote_graph --memory-only``). ``malloc_trim(0)`` hands every whole free page
of every arena back (``madvise``): 3-14 ms there for 60-140 MiB, 0.1 ms when there is nothing
to return, so it runs once reads have received ``TRIM_AFTER_BYTES`` since the last time.
Fixing malloc's mmap threshold instead (``mallopt``) does not help: the values are far below
any threshold that would not also map every small array. Other C libraries (musl, macOS) have
no ``malloc_trim``: there this does nothing.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

# Bytes received from Redis after which the next finished read gives freed memory back: more
# than a warm batch's few blocks, less than one cold batch of wide features.
TRIM_AFTER_BYTES = 8 << 20


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, looked up once in the running process; None elsewhere."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


_TRIM = _malloc_trim()


class FreedBuffers:
    """Counts the bytes reads received; ``release`` hands freed heap pages back once they
    reach ``threshold`` (0: after every read that received any)."""

    def __init__(self, threshold: int = TRIM_AFTER_BYTES) -> None:
        self.threshold = threshold
        self.pending = 0
        self.trims = 0

    def received(self, nbytes: int) -> None:
        self.pending += nbytes

    def release(self) -> None:
        """Called once a read's raw values are no longer referenced."""
        if self.pending and self.pending >= self.threshold:
            self.pending = 0
            self.trims += 1
            if _TRIM is not None:
                _TRIM(0)
