"""Copying a memory-mapped matrix to a device in chunks, through pinned memory on a GPU, so
that loading features never holds a second whole copy in host memory."""

from __future__ import annotations

import numpy as np
import torch

_CHUNK_ROWS = 1 << 16


def copy_to_device(matrix: np.ndarray, device: torch.device) -> torch.Tensor:
    """``matrix`` (float32 ``[N, F]``, e.g. a memory map) as a tensor on ``device``."""
    rows, width = matrix.shape
    table = torch.empty((rows, width), dtype=torch.float32, device=device)
    pin = device.type == "cuda"
    chunk = torch.empty((min(_CHUNK_ROWS, max(rows, 1)), width), pin_memory=pin)
    for start in range(0, rows, _CHUNK_ROWS):
        part = matrix[start : start + _CHUNK_ROWS]
        staged = chunk[: len(part)]
        staged.numpy()[:] = part
        table[start : start + len(part)].copy_(staged)
        if pin:  # the next chunk overwrites the staging buffer
            torch.cuda.synchronize(device)
    return table
