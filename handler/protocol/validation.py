"""Request checks every task shares: pydantic validation worded for clients, size limits, and
float features. One formatter words every validation error the same way."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict, StrictFloat, StrictInt, StrictStr, ValidationError

from handler.protocol.body import show
from handler.protocol.errors import BadRequest, TooLarge

IdField = StrictInt | StrictStr
Number = StrictInt | StrictFloat
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_LISTED = 5  # clauses named in one error message
_ALTERNATIVES = ("int", "str", "float")  # pydantic's union branches, folded into one clause


class Strict(BaseModel):
    """A request body model: no unknown fields, no type coercion."""

    model_config = ConfigDict(extra="forbid", strict=True)


M = TypeVar("M", bound=BaseModel)


def describe_errors(error: ValidationError, allowed: Sequence[str] = ()) -> str:
    """One clause per offending field, the int/str alternatives of an ID folded together; an
    unknown field names the ``allowed`` ones when given."""
    parts: dict[str, str] = {}
    for detail in error.errors():
        loc = [str(p) for p in detail["loc"] if p not in _ALTERNATIVES]
        where = ".".join(loc) or "body"
        kind = detail["type"]
        if kind == "extra_forbidden":
            known = f" (allowed: {', '.join(allowed)})" if allowed else ""
            parts[where] = f"{where}: unknown field{known}"
        elif kind == "missing":
            parts[where] = f"{where}: missing"
        elif kind in ("int_type", "string_type") and where not in parts:
            value = detail["input"]
            parts[where] = (
                f"{where}: expected an integer or a string, got {type(value).__name__} "
                f"{show(value)}"
            )
        else:
            parts.setdefault(where, f"{where}: {detail['msg']}")
    messages = list(parts.values())
    more = f"; and {len(messages) - _LISTED} more" if len(messages) > _LISTED else ""
    return "; ".join(messages[:_LISTED]) + more


def validate(model: type[M], body: dict[str, Any], example: str, allowed: Sequence[str] = ()) -> M:
    """``body`` as ``model``, or BadRequest naming what is wrong and an ``example``."""
    try:
        return model.model_validate(body)
    except ValidationError as error:
        raise BadRequest(
            f"invalid request: {describe_errors(error, allowed)}. Send e.g. {example}"
        ) from None


def check_count(name: str, count: int, limit: int, setting: str) -> None:
    """TooLarge (413) when a list is longer than the archive accepts."""
    if count > limit:
        raise TooLarge(
            f"{name} has {count} entries; this archive accepts at most {limit} (split the "
            f"request, or raise {setting} in the model config)"
        )


def float32_features(values: list[Any], width: int, where: str) -> np.ndarray:
    """``values`` as finite float32, ``width`` wide."""
    try:
        x = np.asarray(values, dtype=np.float64)
    except OverflowError:  # an integer beyond float64's range: JSON integers are unbounded
        raise _beyond_float32(where) from None
    if x.shape[-1:] != (width,):
        raise BadRequest(
            f"{where} must hold {width} features per node (the graph's feature width); got "
            f"{x.shape[-1] if x.ndim else 0}"
        )
    if not (np.abs(x) <= _FLOAT32_MAX).all():  # NaN fails the comparison too
        raise _beyond_float32(where)
    return x.astype(np.float32)


def _beyond_float32(where: str) -> BadRequest:
    return BadRequest(f"{where} holds a NaN, an infinity or a value beyond float32's range")
