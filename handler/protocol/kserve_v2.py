"""The KServe v2 (Open Inference Protocol) request and response for node classification.

TorchServe's KServe envelopes unwrap only the first request of a batch, which breaks
``batchSize`` > 1; accepting the v2 body natively keeps TorchServe's batching. A request carries
one input tensor of node IDs (INT64/INT32 integers or BYTES strings)::

    {"id": "r1",
     "inputs": [{"name": "node_ids", "shape": [2], "datatype": "INT64", "data": [1, 2]}]}

and is answered with one output tensor per field (``node_id``, ``predicted_class``,
``probabilities`` as a flattened ``[n, C]`` FP32 tensor).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, StrictInt, StrictStr, ValidationError

from handler.protocol.errors import BadRequest, TooLarge

INPUT_NAMES = ("node_id", "node_ids")
_DATATYPES = {"INT64": int, "INT32": int, "BYTES": str}


class _Tensor(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    name: StrictStr
    shape: list[StrictInt]
    datatype: Literal["INT64", "INT32", "BYTES"]
    data: list[StrictInt | StrictStr]


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    id: StrictStr | None = None
    inputs: list[_Tensor]


def is_v2_body(body: dict[str, Any]) -> bool:
    """A v2 request is recognised by its ``inputs`` list."""
    return "inputs" in body


def parse_v2_node_ids(body: dict[str, Any], max_ids: int) -> tuple[list[int | str], str | None]:
    """The node IDs of a v2 request and its ``id``; every problem is a 400 (or 413)."""
    inputs = body.get("inputs")
    if isinstance(inputs, list) and len(inputs) == 1 and isinstance(inputs[0], dict):
        data = inputs[0].get("data")
        if isinstance(data, list) and len(data) > max_ids:
            raise TooLarge(
                f"the input tensor has {len(data)} node IDs; this archive accepts at most "
                f"{max_ids} per request"
            )
    try:
        parsed = _Body.model_validate(body)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:5]
        )
        raise BadRequest(
            f"invalid KServe v2 request ({problems}); send "
            '{"inputs": [{"name": "node_ids", "shape": [2], "datatype": "INT64", "data": [1, 2]}]}'
        ) from None
    if len(parsed.inputs) != 1:
        raise BadRequest(f"send exactly one input tensor of node IDs; got {len(parsed.inputs)}")
    tensor = parsed.inputs[0]
    if tensor.name not in INPUT_NAMES:
        raise BadRequest(f"the input tensor must be named node_id or node_ids; got {tensor.name!r}")
    if tensor.shape != [len(tensor.data)]:
        raise BadRequest(
            f"shape {tensor.shape} does not match the {len(tensor.data)} values in data; "
            f"send shape [{len(tensor.data)}]"
        )
    if not tensor.data:
        raise BadRequest("the input tensor holds no node IDs")
    kind = _DATATYPES[tensor.datatype]
    wrong = [value for value in tensor.data if not isinstance(value, kind)]
    if wrong:
        raise BadRequest(
            f"datatype {tensor.datatype} needs {kind.__name__} values; got {wrong[0]!r}"
        )
    return list(tensor.data), parsed.id


def v2_response(
    request_id: str | None,
    model_name: str,
    model_version: str,
    node_ids: list[int | str],
    probabilities: list[list[float]],
) -> dict[str, Any]:
    """The v2 answer: node IDs echoed (BYTES when any is a string), classes, probabilities."""
    classes = [max(range(len(row)), key=row.__getitem__) for row in probabilities]
    width = len(probabilities[0]) if probabilities else 0
    id_type = "INT64" if all(isinstance(node, int) for node in node_ids) else "BYTES"
    response: dict[str, Any] = {
        "model_name": model_name,
        "model_version": model_version,
        "outputs": [
            {"name": "node_id", "shape": [len(node_ids)], "datatype": id_type, "data": node_ids},
            {
                "name": "predicted_class",
                "shape": [len(classes)],
                "datatype": "INT64",
                "data": classes,
            },
            {
                "name": "probabilities",
                "shape": [len(probabilities), width],
                "datatype": "FP32",
                "data": [value for row in probabilities for value in row],
            },
        ],
    }
    if request_id is not None:
        response["id"] = request_id
    return response
