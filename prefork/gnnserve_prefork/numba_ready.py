"""Imported by the zygote: numba, and its first compilation, which loads numba's typing and
target registries and starts LLVM. A worker would otherwise pay that (about 0.4 s with the
import) before its sampler's compiled hops load from numba's disk cache (then about 0.05 s).
It starts no thread and touches no GPU, so the forked workers inherit it as they inherit torch.
"""

from __future__ import annotations

import numba


@numba.njit
def _successor(value: int) -> int:
    return value + 1


_successor(0)
