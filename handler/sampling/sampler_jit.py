"""The sampler's compiled loops (numba): one hop's draws and its relabelling, bit for bit the
vectorised steps of handler.sampling.sampler. Self-contained (numpy and numba only), because
handler.sampling.sampler_kernels loads it from a copy at a path of its own (it says why)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numba
import numpy as np

_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_2 = np.uint64(0x94D049BB133111EB)
_LOW_63 = np.uint64((1 << 63) - 1)
_S27, _S30, _S31 = np.uint64(27), np.uint64(30), np.uint64(31)


def compiled(function: Callable[..., Any]) -> Callable[..., Any]:
    """``numba.njit``, releasing the GIL, with the machine code cached on disk where numba
    finds a writable place (beside this file, ``NUMBA_CACHE_DIR``, the user's cache
    directory); where it finds none (read-only code, no writable home) each process compiles
    its own rather than failing to import."""
    try:
        return numba.njit(cache=True, nogil=True)(function)
    except RuntimeError:  # numba: "cannot cache function ...: no locator available"
        return numba.njit(nogil=True)(function)


@numba.njit(inline="always")
def _mix(x: np.uint64) -> np.uint64:
    """splitmix64's finaliser, as handler.sampling.sampler._mix."""
    x = (x ^ (x >> _S30)) * _MIX_1
    x = (x ^ (x >> _S27)) * _MIX_2
    return x ^ (x >> _S31)


@compiled
def draw(
    indices: np.ndarray,
    starts: np.ndarray,
    counts: np.ndarray,
    nodes: np.ndarray,
    fanout: int,
    key_salt: np.uint64,
    base_key: np.uint64,
    salts: np.ndarray,
    most_edges: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Up to ``fanout`` (``-1``: all) of the ``counts[i]`` entries at ``starts[i]`` of
    ``indices`` for each of ``nodes``: a list that is longer than ``fanout`` keeps Floyd's
    choice with ``fanout`` draws keyed on (node, ``key_salt``) and salted per step. Returns
    (row, source, position, total); nothing but the total when it exceeds ``most_edges``."""
    n = len(nodes)
    take = np.empty(n, dtype=np.int64)
    total = 0
    for i in range(n):
        count = counts[i]
        take[i] = count if fanout < 0 or count <= fanout else fanout
        total += take[i]
    if total > most_edges:
        return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64), total
    rows = np.empty(total, dtype=np.int64)
    chosen = np.empty(total, dtype=np.int64)
    picked = np.empty(fanout if fanout > 0 else 0, dtype=np.int64)
    edge = 0
    for i in range(n):
        count, kept, start = counts[i], take[i], starts[i]
        if kept < count:  # Floyd: kept == fanout distinct offsets in [0, count)
            key = _mix((np.uint64(nodes[i]) ^ base_key) + key_salt)
            # Every step's draw first (independent divisions overlap), then the fix-ups.
            for step in range(kept):
                draw = _mix(salts[step] + key) & _LOW_63
                picked[step] = np.int64(draw % np.uint64(count - kept + step + 1))
            for step in range(kept):
                offset = picked[step]
                for earlier in range(step):
                    if picked[earlier] == offset:
                        offset = count - kept + step
                        picked[step] = offset
                        break
                chosen[edge + step] = start + offset
        else:
            for step in range(kept):
                chosen[edge + step] = start + step
        for step in range(kept):
            rows[edge + step] = i
        edge += kept
    # A loop of independent loads of their own: the CPU overlaps their cache misses.
    sources = np.empty(total, dtype=np.int64)
    for edge in range(total):
        sources[edge] = indices[chosen[edge]]
    return rows, sources, chosen, total


@compiled
def csc_draw(
    indptr: np.ndarray,
    indices: np.ndarray,
    position: np.ndarray,
    nodes: np.ndarray,
    fanout: int,
    key_salt: np.uint64,
    base_key: np.uint64,
    salts: np.ndarray,
    most_edges: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """:func:`draw` of the in-lists at ``position`` in CSC arrays."""
    starts = np.empty(len(position), dtype=np.int64)
    counts = np.empty(len(position), dtype=np.int64)
    for i in range(len(position)):
        starts[i] = indptr[position[i]]
        counts[i] = indptr[position[i] + 1] - starts[i]
    return draw(indices, starts, counts, nodes, fanout, key_salt, base_key, salts, most_edges)


@numba.njit
def sorted_order(values: np.ndarray) -> np.ndarray:
    """Positions of non-negative ``values`` (node indices) in ascending order: an LSD radix
    sort of their offsets from the least, in digits of up to 11 bits (fewer for a short array).
    Twice as fast as numpy's vectorised argsort for a hop's 300 to 20,000 sources, and several
    times numba's own sort."""
    n = len(values)
    order = np.empty(n, dtype=np.int64)
    for k in range(n):
        order[k] = k
    if n < 2:
        return order
    low = high = values[0]
    for k in range(n):
        low, high = min(low, values[k]), max(high, values[k])
    span, bits = high - low, 0
    while span >> bits:
        bits += 1
    width = 4
    while width < 11 and 1 << (width + 1) <= n:
        width += 1
    passes = (bits + width - 1) // width
    if passes == 0:  # all equal
        return order
    width = (bits + passes - 1) // passes
    mask = (1 << width) - 1
    spare = np.empty(n, dtype=np.int64)
    for done in range(passes):
        shift = done * width
        count = np.zeros((1 << width) + 1, dtype=np.int64)
        for k in range(n):
            count[((values[k] - low) >> shift & mask) + 1] += 1
        for bucket in range(1 << width):
            count[bucket + 1] += count[bucket]
        for k in range(n):
            at = order[k]
            bucket = (values[at] - low) >> shift & mask
            spare[count[bucket]] = at
            count[bucket] += 1
        order, spare = spare, order
    return order


@compiled
def relabel(
    neighbours: np.ndarray, frontier: np.ndarray, rows: np.ndarray, offset: int, next_offset: int
) -> tuple[np.ndarray, np.ndarray]:
    """The next level (``neighbours`` unique, ascending) and each edge's local source row: its
    neighbour's row in the next level, or for a self-loop its destination's own row."""
    level = np.empty(len(neighbours), dtype=np.int64)
    sources = np.empty(len(neighbours), dtype=np.int64)
    size = 0
    for edge in sorted_order(neighbours):
        value = neighbours[edge]
        if size == 0 or level[size - 1] != value:
            level[size] = value
            size += 1
        row = rows[edge]
        sources[edge] = offset + row if value == frontier[row] else next_offset + size - 1
    return level[:size], sources
