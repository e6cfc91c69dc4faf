"""A test's wrapper of a served model (a fault injected into its forward) that declares the
served-model contract of the model it wraps, as any served model must."""

from __future__ import annotations

from typing import Any

import torch

from model.served.contract import ServedModel, served

# What the contract declares (model.served.contract.ServedModel); a module has parameters.
_DECLARED = frozenset(
    name for name in vars(ServedModel) if not name.startswith("_") and name != "parameters"
)


class Wrapping(torch.nn.Module):
    """Holds the served model as ``inner``; every declaration is ``inner``'s."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        if name in _DECLARED:
            return getattr(served(self.inner), name)
        return super().__getattr__(name)
