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

import base64
import binascii
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, StrictInt, StrictStr, ValidationError

from handler.protocol.body import show
from handler.protocol.errors import BadRequest, TooLarge
from handler.protocol.validation import describe_errors

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
        raise BadRequest(
            f"invalid KServe v2 request ({describe_errors(exc)}); send "
            '{"inputs": [{"name": "node_ids", "shape": [2], "datatype": "INT64", "data": [1, 2]}]}'
        ) from None
    if len(parsed.inputs) != 1:
        raise BadRequest(f"send exactly one input tensor of node IDs; got {len(parsed.inputs)}")
    tensor = parsed.inputs[0]
    if tensor.name not in INPUT_NAMES:
        raise BadRequest(f"the input tensor must be named node_id or node_ids; got {tensor.name!r}")
    if not _holds(tensor.shape, len(tensor.data)):
        raise BadRequest(
            f"shape {tensor.shape} does not match the {len(tensor.data)} values in data; "
            f"send shape [{len(tensor.data)}] (or [{len(tensor.data)}, 1])"
        )
    if not tensor.data:
        raise BadRequest("the input tensor holds no node IDs")
    kind = _DATATYPES[tensor.datatype]
    wrong = [value for value in tensor.data if not isinstance(value, kind)]
    if wrong:
        raise BadRequest(
            f"datatype {tensor.datatype} needs {kind.__name__} values; got {wrong[0]!r}"
        )
    if tensor.datatype == "BYTES" and is_grpc_body(body):
        return [_from_base64(value) for value in tensor.data], parsed.id
    return list(tensor.data), parsed.id


def is_grpc_body(body: dict[str, Any]) -> bool:
    """A body TorchServe's frontend built from a gRPC ``ModelInfer`` (Open Inference Protocol):
    it always carries ``model_name``, which no v2 REST request has, and base64-encodes every
    BYTES element."""
    return "model_name" in body


def _from_base64(value: Any) -> str:
    try:
        return base64.b64decode(str(value), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise BadRequest(f"a BYTES node ID is not base64 of UTF-8 text: {show(value)}") from None


def v2_error(error: dict[str, Any], body: Any, model_name: str, model_version: str) -> dict:
    """The error answer of a v2 request: the JSON error with the protocol's ``error`` field,
    shaped as an inference response too (``id``, ``model_name``, ``model_version``, an
    ``error`` BYTES output). TorchServe's gRPC ``ModelInfer`` ignores the status and converts
    the body as a response; a body without those fields makes its converter throw and the
    worker die."""
    request_id = body.get("id") if isinstance(body, dict) else None
    message = str(error.get("message", ""))
    return {
        **error,
        "id": request_id if isinstance(request_id, str) else "",
        "model_name": model_name,
        "model_version": model_version,
        "outputs": [{"name": "error", "shape": [1], "datatype": "BYTES", "data": [message]}],
    }


def _holds(shape: list[int], count: int) -> bool:
    """Whether a tensor of ``shape`` holds ``count`` elements: ``[n]``, ``[n, 1]``, ``[1, n]``
    and any other shape of ``n`` elements (row-major data, as the protocol sends it)."""
    size = 1
    for dimension in shape:
        if dimension < 0:
            return False
        size *= dimension
    return bool(shape) and size == count


BINARY_HEADER = "inference-header-content-length"


def binary_extension_refusal() -> BadRequest:
    """What a client using the binary tensor data extension is told (it can read it: the
    error is JSON with an ``error`` field, as the protocol's clients expect)."""
    return BadRequest(
        "the binary tensor data extension is not supported: send the tensors as JSON (with "
        "tritonclient: InferInput.set_data_from_numpy(array, binary_data=False) and "
        "InferRequestedOutput(name, binary_data=False))"
    )


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
