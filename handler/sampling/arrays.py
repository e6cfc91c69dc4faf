"""The few array functions the sampler needs, for numpy (CPU) and torch (any device).

The sampler runs ~150 small array operations per batch. On a CPU, a torch operation costs
~5 us of dispatch and a numpy one ~1 us, which made sampling twice as slow as it needs to be;
on a GPU only torch will do. The sampler is written once against this interface, with
operators (``+ ^ >> & %``, comparisons, indexing) that both libraries share, and gets the
implementation that suits its device. Both wrap int64 arithmetic the same way, so the samples
are identical (tests/unit/handler/test_sampler.py checks it). On the CPU even ~1 us an
operation was most of a small batch's sampling, so numpy arrays take the hops' hot steps as
compiled kernels (``fused``, handler.sampling.sampler_kernels), drawing what these operations draw.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import torch

Array = Any  # np.ndarray or torch.Tensor, whichever the ops work on


class ArrayOps(Protocol):
    """What differs between numpy and torch; everything else is spelled the same.

    ``fused``: the sampler runs its per-hop steps as compiled kernels
    (handler.sampling.sampler_kernels) instead of these operations; numpy arrays only.
    """

    fused: bool

    def arange(self, start: int, stop: int | None = None) -> Array: ...
    def int64(self, values: Array) -> Array: ...
    def of_ints(self, values: Sequence[int]) -> Array: ...
    def repeat(self, values: Array, counts: Array, total: int) -> Array: ...
    def cumsum(self, values: Array) -> Array: ...
    def clamp_max(self, values: Array, most: int) -> Array: ...
    def unique_inverse(self, values: Array) -> tuple[Array, Array]: ...
    def cat(self, parts: Sequence[Array]) -> Array: ...
    def stack(self, parts: Sequence[Array]) -> Array: ...
    def where(self, condition: Array, yes: Array, no: Array) -> Array: ...
    def flatnonzero(self, values: Array) -> Array: ...
    def from_numpy(self, values: np.ndarray) -> Array: ...
    def to_numpy(self, values: Array) -> np.ndarray: ...
    def from_torch(self, values: torch.Tensor) -> Array: ...
    def to_torch(self, values: Array) -> torch.Tensor: ...


class NumpyOps:
    """CPU arrays; tensors in and out share memory with them. With ``fused`` (the default) the
    sampler's hops are compiled kernels; without, the vectorised steps they are tested against.
    """

    def __init__(self, fused: bool = True) -> None:
        self.fused = fused

    def arange(self, start: int, stop: int | None = None) -> np.ndarray:
        if stop is None:
            return np.arange(start, dtype=np.int64)
        return np.arange(start, stop, dtype=np.int64)

    def int64(self, values: np.ndarray) -> np.ndarray:
        return values.astype(np.int64, copy=False)

    def of_ints(self, values: Sequence[int]) -> np.ndarray:
        return np.array(values, dtype=np.int64)

    def repeat(self, values: np.ndarray, counts: np.ndarray, total: int) -> np.ndarray:
        return np.repeat(values, counts)

    def cumsum(self, values: np.ndarray) -> np.ndarray:
        return np.cumsum(values)

    def clamp_max(self, values: np.ndarray, most: int) -> np.ndarray:
        return np.minimum(values, most)

    def unique_inverse(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        unique, inverse = np.unique(values, return_inverse=True)
        return unique, inverse.reshape(-1).astype(np.int64, copy=False)

    def cat(self, parts: Sequence[np.ndarray]) -> np.ndarray:
        return np.concatenate(parts)

    def stack(self, parts: Sequence[np.ndarray]) -> np.ndarray:
        return np.stack(parts)

    def where(self, condition: np.ndarray, yes: np.ndarray, no: np.ndarray) -> np.ndarray:
        return np.where(condition, yes, no)

    def flatnonzero(self, values: np.ndarray) -> np.ndarray:
        return np.flatnonzero(values)

    def from_numpy(self, values: np.ndarray) -> np.ndarray:
        return values

    def to_numpy(self, values: np.ndarray) -> np.ndarray:
        return values

    def from_torch(self, values: torch.Tensor) -> np.ndarray:
        return values.numpy()

    def to_torch(self, values: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(values)


class TorchOps:
    """Tensors on one device (the GPU in a GPU worker)."""

    fused = False

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def arange(self, start: int, stop: int | None = None) -> torch.Tensor:
        if stop is None:
            return torch.arange(start, device=self.device)
        return torch.arange(start, stop, device=self.device)

    def int64(self, values: torch.Tensor) -> torch.Tensor:
        return values.to(torch.int64)

    def of_ints(self, values: Sequence[int]) -> torch.Tensor:
        return torch.tensor(list(values), dtype=torch.int64, device=self.device)

    def repeat(self, values: torch.Tensor, counts: torch.Tensor, total: int) -> torch.Tensor:
        return torch.repeat_interleave(values, counts, output_size=total)

    def cumsum(self, values: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(values, 0)

    def clamp_max(self, values: torch.Tensor, most: int) -> torch.Tensor:
        return torch.clamp(values, max=most)

    def unique_inverse(self, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        unique, inverse = torch.unique(values, return_inverse=True)
        return unique, inverse

    def cat(self, parts: Sequence[torch.Tensor]) -> torch.Tensor:
        return torch.cat(list(parts))

    def stack(self, parts: Sequence[torch.Tensor]) -> torch.Tensor:
        return torch.stack(list(parts))

    def where(self, condition: torch.Tensor, yes: Any, no: Any) -> torch.Tensor:
        return torch.where(condition, yes, no)

    def flatnonzero(self, values: torch.Tensor) -> torch.Tensor:
        return torch.nonzero(values).flatten()

    def from_numpy(self, values: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(values).to(self.device)

    def to_numpy(self, values: torch.Tensor) -> np.ndarray:
        return values.cpu().numpy()

    def from_torch(self, values: torch.Tensor) -> torch.Tensor:
        return values.to(self.device)

    def to_torch(self, values: torch.Tensor) -> torch.Tensor:
        return values


def ops_for(device: torch.device) -> ArrayOps:
    """numpy on the CPU, torch elsewhere."""
    return NumpyOps() if device.type == "cpu" else TorchOps(device)


def readonly_tensor(array: np.ndarray) -> torch.Tensor:
    """Wraps a read-only memory map without copying; nothing ever writes through it (torch warns
    that the array is not writable, which is the point)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array)
