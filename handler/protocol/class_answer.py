"""The one shape of a classification answer, whichever task or engine computed it."""

from __future__ import annotations

from typing import Any

from model.user_model import Output


def class_answer(probabilities: list[float], class_names: list[str] | None) -> dict[str, Any]:
    """``predicted_class`` (the argmax), ``predicted_label`` when the graph names its classes,
    and ``probabilities``: the fields every classifying answer carries, in this order."""
    predicted = max(range(len(probabilities)), key=probabilities.__getitem__)
    answer: dict[str, Any] = {"predicted_class": predicted}
    if class_names:
        answer["predicted_label"] = class_names[predicted]
    answer["probabilities"] = probabilities
    return answer


def node_answer(row: list[float], output: Output, class_names: list[str] | None) -> dict[str, Any]:
    """A node's answer fields: the class answer of class scores, or ``output`` with the
    values as they are (``--output raw``)."""
    if output is Output.RAW:
        return {"output": row}
    return class_answer(row, class_names)
