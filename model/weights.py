"""The one comparison of a ``state_dict`` with the module it should load into: which keys are
missing, unexpected or mis-shaped, said in a line a user can read (a few keys, not hundreds)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn.parameter import is_lazy


@dataclass(frozen=True)
class KeyMismatch:
    """Keys of a ``state_dict`` that do not fit a module (each list sorted)."""

    missing: list[str]
    unexpected: list[str]
    mis_shaped: list[str]

    def __bool__(self) -> bool:
        return bool(self.missing or self.unexpected or self.mis_shaped)

    def describe(self) -> str:
        """``missing keys a, b; unexpected keys c; wrong shapes d (...)``."""
        parts = []
        if self.missing:
            parts.append(f"missing keys {_few(self.missing)}")
        if self.unexpected:
            parts.append(f"unexpected keys {_few(self.unexpected)}")
        if self.mis_shaped:
            parts.append(f"wrong shapes {_few(self.mis_shaped)}")
        return "; ".join(parts)

    def wrapper_prefix(self) -> str:
        """``module.`` when every unexpected key is a missing one under one extra prefix (a
        wrapper's state_dict: DataParallel, a Lightning module), else empty."""
        heads = {key.split(".", 1)[0] for key in self.unexpected if "." in key}
        if len(heads) != 1 or not self.missing or not all("." in k for k in self.unexpected):
            return ""
        prefix = f"{heads.pop()}."
        stripped = {key[len(prefix) :] for key in self.unexpected}
        return prefix if stripped >= set(self.missing) else ""


def key_mismatch(module: torch.nn.Module, state_dict: Mapping[str, object]) -> KeyMismatch:
    """How ``state_dict`` differs from ``module.state_dict()`` in keys and shapes. A lazy
    parameter (PyG's ``Linear(-1, ...)``, ``SAGEConv((-1, -1), ...)``, their ``to_hetero``
    copies) has no shape yet: any tensor fits it, and PyG's load hook takes the saved one."""
    expected = module.state_dict()
    mis_shaped = []
    for key in sorted(set(expected) & set(state_dict)):
        value = state_dict[key]
        if not isinstance(value, Tensor):
            mis_shaped.append(f"{key} (a {type(value).__name__}, not a tensor)")
        elif is_lazy(expected[key]):
            continue
        elif value.shape != expected[key].shape:
            mis_shaped.append(
                f"{key} {tuple(value.shape)} (the model has {tuple(expected[key].shape)})"
            )
    return KeyMismatch(
        missing=sorted(set(expected) - set(state_dict)),
        unexpected=sorted(set(state_dict) - set(expected)),
        mis_shaped=mis_shaped,
    )


def _few(items: list[str], limit: int = 5) -> str:
    shown = ", ".join(items[:limit])
    return f"{shown} (and {len(items) - limit} more)" if len(items) > limit else shown
