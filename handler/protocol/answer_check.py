"""Every answer is checked for NaN and infinity before it is sent, whichever task made it.

A model that outputs NaN or infinity (broken weights, an overflow, a NaN feature row) would
otherwise be answered 200 with ``null`` probabilities (orjson writes NaN as ``null``) and an
arbitrary ``predicted_class``. The batch engine passes each request's body through
:func:`non_finite_error`, so such a request is answered 500 ``NonFiniteOutput`` naming what
failed, and the other requests of its batch are answered as usual.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from handler.protocol.body import show
from handler.protocol.errors import NonFiniteOutput

_WHOLE = "this request"  # the subject of a body that names no node (an inline graph's answer)


def non_finite_error(body: Any) -> NonFiniteOutput | None:
    """The 500 for a body that holds a NaN or an infinity, naming the node, link or source
    node it belongs to; None when every number in it is finite."""
    found = _find(body)
    if found is None:
        return None
    return NonFiniteOutput(
        f"non-finite output (NaN/inf) from the model for {found.subject or _WHOLE}: the model "
        "or the features it read are broken, not the request; check the model's weights and "
        "the graph's features (the server log names this request)"
    )


@dataclass
class _Found:
    """A non-finite number was found; ``subject`` is what it belongs to, once known."""

    subject: str | None = None


def _find(value: Any) -> _Found | None:
    """Where ``value`` holds a non-finite number. The outermost object that names a node
    decides the subject (a prediction's ``node_id``, not the IDs of the nodes its explanation
    lists); it is worked out only once a number is found, on the way back out."""
    if isinstance(value, float):
        return None if math.isfinite(value) else _Found()
    if isinstance(value, dict):
        outputs = value.get("outputs")
        if isinstance(outputs, list):
            found = _find_in_outputs(outputs)
        else:
            found = next(filter(None, map(_find, value.values())), None)
        if found is not None:
            found.subject = _subject(value) or found.subject
        return found
    if isinstance(value, (list, tuple)) and not _finite_numbers(value):
        return next(filter(None, map(_find, value)), None)
    return None


def _subject(answer: dict[str, Any]) -> str | None:
    """What one object of an answer is about, when it names it."""
    if "node_id" in answer:
        return f"node {show(answer['node_id'])}"
    if "src" in answer and "dst" in answer:
        return f"link {show(answer['src'])} -> {show(answer['dst'])}"
    if "src" in answer:
        return f"the recommendations for node {show(answer['src'])}"
    if "new_node" in answer:
        return "the new node"
    return None


def _find_in_outputs(outputs: list[Any]) -> _Found | None:
    """A v2 answer: tensors in ``data``, one row per ID of its ``node_id`` (or ``src`` and
    ``dst``) output, so the row of a bad value names its node or link."""
    data: dict[Any, list[Any]] = {
        item.get("name"): item["data"]
        for item in outputs
        if isinstance(item, dict) and isinstance(item.get("data"), list)
    }
    for values in data.values():
        if _finite_numbers(values):
            continue
        for index, value in enumerate(values):
            if isinstance(value, float) and not math.isfinite(value):
                rows = _v2_rows(data)
                if rows and len(values) % len(rows) == 0:
                    return _Found(rows[index // (len(values) // len(rows))])
                return _Found()
    return None


def _v2_rows(data: dict[Any, list[Any]]) -> list[str]:
    """The subject of each row of a v2 answer's tensors; none when it names no IDs."""
    if "node_id" in data:
        return [f"node {show(node_id)}" for node_id in data["node_id"]]
    if "src" in data and "dst" in data:
        return [
            f"link {show(s)} -> {show(d)}" for s, d in zip(data["src"], data["dst"], strict=True)
        ]
    return []


def _finite_numbers(values: list[Any] | tuple[Any, ...]) -> bool:
    """True when ``values`` are numbers that are all finite. Their sum, in one C loop, is
    finite only then (NaN and infinity carry through a sum); a sum that overflows, or values
    that are not all numbers, are looked at one by one by the caller."""
    try:
        total = sum(values)
    except (TypeError, OverflowError):  # not numbers (objects, strings, None), or huge ints
        return False
    return not isinstance(total, float) or math.isfinite(total)
