"""Compiled (numba) per-hop steps of the sampler on the CPU, drawing exactly what its vectorised
steps draw.

Why: a vectorised hop is ~50 small numpy operations of 1-3 us each, which is most of a small
batch's sampling time and, on a GPU worker, the CPU's critical path. One compiled loop per
step (handler.sampling.sampler_jit) does the same arithmetic in one pass: splitmix64 on uint64
(wrapping, bit for bit the int64 arithmetic of handler.sampling.sampler), Floyd's algorithm step by
step, and the gathers. On one core, 1M edges, fanouts [10, 10]: 1, 32 and 256 seeds sample in
0.04, 0.10 and 0.6 ms instead of 0.14, 0.32 and 1.5. The vectorised steps stay the reference
(tests/unit/handler/test_sampler_kernels.py) and what torch runs on a GPU.

Numba compiles a kernel for each combination of argument types on first use (under a second
each, 1.5 s of CPU for a sampler's set): :func:`warm` does it when a sampler is built, not on a
request, and numba keeps the machine code on disk for the next process. Its disk cache is keyed
on the source file's path, and TorchServe unpacks an archive into a new temporary directory at
every start (and each server has a temp dir of its own), so the loops are loaded from a copy at
``~/.cache/gnnserve-numba-cache/<hash of their source>/`` (``$XDG_CACHE_HOME``; the temp dir
when that cannot be had), private to this user (the cache is pickled code): every worker and
every start of every server and archive with the same loops shares one compilation, and a
worker loads them in about 0.05 s (0.3 s unless the pre-fork zygote started numba before
forking it: prefork/gnnserve_prefork/numba_ready.py).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import numpy as np

from graph_assets.errors import UnsafeDirectory
from graph_assets.private_dir import ensure_private_dir

logger = logging.getLogger(__name__)

CACHE = "gnnserve-numba-cache"
_SOURCE = Path(__file__).with_name("sampler_jit.py")
_MASK_64 = (1 << 64) - 1


@functools.cache
def _jit() -> ModuleType:
    """handler.sampling.sampler_jit, loaded from its copy in the private cache directory (written
    there when missing or different), or in place where that directory cannot be had."""
    source = _SOURCE.read_bytes()
    digest = hashlib.sha256(source).hexdigest()[:16]
    try:
        home = _cache_root() / digest
        home.mkdir(mode=0o700, exist_ok=True)
        copy = home / _SOURCE.name
        if not copy.is_file() or copy.read_bytes() != source:
            partial = home / f".{_SOURCE.name}.{os.getpid()}"
            partial.write_bytes(source)
            partial.replace(copy)  # whole or not at all, for a worker starting beside this one
    except (OSError, UnsafeDirectory) as problem:
        logger.warning(
            "sampler kernels loaded in place, their compilation cached at best for as long as "
            "this unpacked archive lives: %s",
            problem,
        )
        copy = _SOURCE
    name = f"gnnserve_sampler_jit_{digest}"
    spec = importlib.util.spec_from_file_location(name, copy)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the sampler kernels from {copy}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # numba's cache finds the kernels' globals through it
    spec.loader.exec_module(module)
    return module


def _cache_root() -> Path:
    """The user's cache (``$XDG_CACHE_HOME`` or ``~/.cache``, then ``gnnserve-numba-cache``),
    private to the user: one compilation for every server this user starts on this machine,
    whatever its temp dir; the temp dir's when the user's cache cannot be had."""
    user_cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    try:
        return ensure_private_dir(Path(user_cache) / CACHE)
    except (OSError, RuntimeError, UnsafeDirectory) as problem:
        logger.info("sampler kernels cached in the temp dir: %s", problem)
        return ensure_private_dir(Path(tempfile.gettempdir()) / CACHE)


def _int64(values: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(values, dtype=np.int64)


def draw_segments(
    indices: np.ndarray,
    starts: np.ndarray,
    counts: np.ndarray,
    nodes: np.ndarray,
    fanout: int,
    key_salt: int,
    base_key: int,
    salts: np.ndarray,
    most_edges: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Samples the ``counts[i]`` in-edges at ``starts[i]`` of ``indices`` for each of ``nodes``
    (``handler.sampling.sampler.NeighbourSampler._sample_segments``'s draws; ``key_salt`` and
    ``base_key`` are int64 bit patterns, ``salts`` the per-step int64 salts). Returns (row,
    source, position in ``indices``, total edges); when the total exceeds ``most_edges`` the
    arrays are empty, so that the caller raises before anything was gathered."""
    return _jit().draw(
        indices,
        _int64(starts),
        _int64(counts),
        _int64(nodes),
        fanout,
        *_keys(key_salt, base_key, salts),
        most_edges,
    )


def draw_csc(
    indptr: np.ndarray,
    indices: np.ndarray,
    position: np.ndarray,
    nodes: np.ndarray,
    fanout: int,
    key_salt: int,
    base_key: int,
    salts: np.ndarray,
    most_edges: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """:func:`draw_segments` of the in-lists at ``position`` of CSC arrays (``indptr``,
    ``indices``), found there in the same pass."""
    return _jit().csc_draw(
        indptr,
        indices,
        _int64(position),
        _int64(nodes),
        fanout,
        *_keys(key_salt, base_key, salts),
        most_edges,
    )


def _keys(
    key_salt: int, base_key: int, salts: np.ndarray
) -> tuple[np.uint64, np.uint64, np.ndarray]:
    """The draw's keys as the kernels take them: unsigned 64-bit patterns of the int64 ones."""
    return (
        np.uint64(key_salt & _MASK_64),
        np.uint64(base_key & _MASK_64),
        _int64(salts).view(np.uint64),
    )


def relabel(
    neighbours: np.ndarray, frontier: np.ndarray, rows: np.ndarray, offset: int, next_offset: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(next level, local source rows)`` of a hop: ``np.unique`` of ``neighbours`` and
    ``self_loops_in_place`` of their rows in one pass (``offset``: the frontier's first row,
    ``next_offset``: the next level's)."""
    return _jit().relabel(_int64(neighbours), _int64(frontier), _int64(rows), offset, next_offset)


@functools.cache
def warm(indptr_dtype: np.dtype, indices_dtype: np.dtype, lists: bool) -> None:
    """Compiles (or loads from the disk cache) the kernels for a mapped graph's CSC dtypes and,
    with ``lists``, for the int64 in-lists that live updates and a remote graph are read as,
    once per process, so that no request pays it (about 1.5 s of CPU without the cache)."""
    one, salts = np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64)
    pairs = {(indptr_dtype, indices_dtype)} | ({(np.dtype(np.int64),) * 2} if lists else set())
    for pointers, sources in pairs:
        indptr, indices = np.zeros(2, dtype=pointers), np.zeros(0, dtype=sources)
        draw_csc(indptr, indices, one * 0, one, 1, 0, 0, salts, 0)
        # Compiled inside draw_csc, but loaded from the disk cache on its own.
        draw_segments(indices, one * 0, one * 0, one, 1, 0, 0, salts, 0)
    relabel(one, one, one * 0, 0, 1)
