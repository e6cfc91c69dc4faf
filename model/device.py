"""A model placed on its serving device in full float32 arithmetic.

Served answers must equal the full-graph forward on the CPU (<= 1e-5). Some CUDA builds and
images let float32 matrix products run as TF32 (10-bit mantissa), which moves probabilities
by ~1e-4 on an H200; the worker owns its process, so it asks for IEEE float32 outright.
"""

from __future__ import annotations

import torch


def to_serving_device(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """``model`` in eval mode on ``device``; on CUDA, float32 products stay float32 (no TF32)."""
    if device.type == "cuda":
        torch.set_float32_matmul_precision("highest")
        torch.backends.cudnn.allow_tf32 = False
    return model.to(device).eval()
