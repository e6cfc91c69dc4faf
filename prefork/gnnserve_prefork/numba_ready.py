"""Imported by the zygote: numba's first compilation, which loads its typing and target
registries and starts LLVM (about 0.3 s; PyG imports numba itself when it is installed). A
worker would otherwise pay that before its sampler's compiled hops load from numba's disk cache
(then about 0.05 s: handler/sampling/sampler_kernels.py). It starts no thread and touches no GPU,
so the forked workers inherit it as they inherit torch.
"""

from __future__ import annotations

import numba


@numba.njit
def _successor(value: int) -> int:
    return value + 1


_successor(0)
