"""An embedding captured from the same forward pass that gives the prediction (a forward
pre-hook on a layer), so an embedding always belongs to the answer it comes with."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def with_input_of(layer: torch.nn.Module, forward: Any) -> tuple[Tensor, Tensor]:
    """``forward()``'s output and the input of ``layer``'s last call in it (the destination
    rows of a bipartite call)."""
    captured: list[Tensor] = []

    def keep_input(_module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        value = args[0] if args else kwargs["x"]
        captured.append(value[1] if isinstance(value, tuple) else value)

    handle = layer.register_forward_pre_hook(keep_input, with_kwargs=True)
    try:
        output = forward()
    finally:
        handle.remove()
    return output, captured[-1]
