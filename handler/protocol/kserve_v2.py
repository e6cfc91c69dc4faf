"""KServe v2 (Open Inference Protocol) bodies: the input tensors every task reads, the answers
and errors it writes.

TorchServe's KServe envelopes unwrap only the first request of a batch, which breaks
``batchSize`` > 1; reading the v2 body natively keeps TorchServe's batching. A request carries
named input tensors::

    {"id": "r1",
     "inputs": [{"name": "node_ids", "shape": [2], "datatype": "INT64", "data": [1, 2]}]}

This module checks what every v2 request shares (the tensors' structure, each shape against its
data, the values against their datatype, gRPC's base64 BYTES); each task's ``requests.py`` says
which tensors it takes and what their shapes mean (docs/api.md, "KServe v2").
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, StrictInt, StrictStr, ValidationError

from handler.protocol.body import show
from handler.protocol.errors import BadRequest, TooLarge
from handler.protocol.validation import describe_errors

ID_TYPES = ("INT64", "INT32", "BYTES")
INT_TYPES = ("INT64", "INT32")
FLOAT_TYPES = ("FP32", "FP64")
# What a datatype's JSON values are (bool is never one: it is an int subclass in Python).
_VALUES: dict[str, tuple[type, ...]] = {
    "INT64": (int,),
    "INT32": (int,),
    "BYTES": (str,),
    "FP32": (int, float),
    "FP64": (int, float),
}
_WORDS = {
    "INT64": "integer",
    "INT32": "integer",
    "BYTES": "string",
    "FP32": "number",
    "FP64": "number",
}
NODE_EXAMPLE = (
    '{"inputs": [{"name": "node_ids", "shape": [2], "datatype": "INT64", "data": [1, 2]}]}'
)


class _Tensor(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    name: StrictStr
    shape: list[StrictInt]
    datatype: StrictStr
    data: list[Any]


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    id: StrictStr | None = None
    inputs: list[_Tensor]


@dataclass(frozen=True)
class Wanted:
    """An input tensor a task takes: its names (the first is the one results are keyed by),
    the datatypes it accepts, and whether it may hold no values (a graph without edges)."""

    names: tuple[str, ...]
    datatypes: tuple[str, ...]
    may_be_empty: bool = False


@dataclass(frozen=True)
class Tensor:
    """One input tensor: ``values`` flat, row-major, checked against ``datatype`` (BYTES sent
    over gRPC already decoded) and as many as ``shape`` holds."""

    name: str
    shape: tuple[int, ...]
    datatype: str
    values: list[Any]


def is_v2_body(body: Any) -> bool:
    """A v2 request is recognised by its ``inputs`` key."""
    return isinstance(body, dict) and "inputs" in body


def is_grpc_body(body: dict[str, Any]) -> bool:
    """A body TorchServe's frontend built from a gRPC ``ModelInfer`` (Open Inference Protocol):
    it always carries ``model_name``, which no v2 REST request has, and base64-encodes every
    BYTES element."""
    return "model_name" in body


def raw_length(body: dict[str, Any], name: str) -> int:
    """How many values the input ``name`` sends in ``data`` (0 when there is none), counted
    before anything is validated, so that an oversized request is refused 413 without the
    cost of checking it. A nested ``data`` is counted one level down, as a matrix."""
    inputs = body.get("inputs")
    for tensor in inputs if isinstance(inputs, list) else ():
        if isinstance(tensor, dict) and tensor.get("name") == name:
            data = tensor.get("data")
            if not isinstance(data, list):
                return 0
            return sum(len(row) if isinstance(row, list) else 1 for row in data)
    return 0


def read_inputs(
    body: dict[str, Any], wanted: Sequence[Wanted], example: str
) -> tuple[dict[str, Tensor], str | None]:
    """The request's tensors, keyed by their first wanted name, and its ``id``; every problem
    is a 400 that names what to send instead."""
    try:
        parsed = _Body.model_validate(body)
    except ValidationError as exc:
        raise BadRequest(
            f"invalid KServe v2 request ({describe_errors(exc)}); send {example}"
        ) from None
    names = [tensor.name for tensor in parsed.inputs]
    by_name = {name: want for want in wanted for name in want.names}
    expected = " and ".join(" or ".join(want.names) for want in wanted)
    if len(names) != len(wanted) or any(name not in by_name for name in names):
        raise BadRequest(f"send the input tensor(s) {expected}; got {show(names)}; e.g. {example}")
    tensors: dict[str, Tensor] = {}
    for tensor in parsed.inputs:
        want = by_name[tensor.name]
        if want.names[0] in tensors:
            raise BadRequest(f"the input tensor {want.names[0]} is sent twice; send it once")
        tensors[want.names[0]] = _checked(tensor, want, is_grpc_body(body))
    return tensors, parsed.id


def _checked(tensor: _Tensor, want: Wanted, grpc: bool) -> Tensor:
    name = tensor.name
    if tensor.datatype not in want.datatypes:
        raise BadRequest(
            f"the input tensor {name} must have datatype {' or '.join(want.datatypes)}; got "
            f"{show(tensor.datatype)}"
        )
    values = _flat(tensor.data, name)
    if not values and not want.may_be_empty:
        raise BadRequest(
            f"the input tensor {name} holds no values: send them in data (JSON) or in "
            "contents (gRPC); raw_input_contents and binary tensor data are not read"
        )
    if not _holds(tensor.shape, len(values)):
        raise BadRequest(
            f"the shape {tensor.shape} of the input tensor {name} does not hold the "
            f"{len(values)} values in its data: send a shape whose dimensions multiply to "
            f"{len(values)}"
        )
    kinds = _VALUES[tensor.datatype]
    wrong = [value for value in values if type(value) not in kinds]
    if wrong:
        raise BadRequest(
            f"datatype {tensor.datatype} of the input tensor {name} needs "
            f"{_WORDS[tensor.datatype]} values; got {show(wrong[0])}"
        )
    if tensor.datatype == "BYTES" and grpc:
        values = [_from_base64(value) for value in values]
    return Tensor(name, tuple(tensor.shape), tensor.datatype, values)


def _flat(data: list[Any], name: str) -> list[Any]:
    """``data`` in its flat, row-major form: the protocol allows the nested form too."""
    values = data
    while any(isinstance(value, list) for value in values):
        if not all(isinstance(value, list) for value in values):
            raise BadRequest(f"the data of the input tensor {name} mixes lists and values")
        values = [item for value in values for item in value]
    return values


def _holds(shape: list[int], count: int) -> bool:
    """Whether a tensor of ``shape`` holds ``count`` elements."""
    size = 1
    for dimension in shape:
        if dimension < 0:
            return False
        size *= dimension
    return bool(shape) and size == count


def _from_base64(value: str) -> str:
    try:
        return base64.b64decode(value, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise BadRequest(f"a BYTES value is not base64 of UTF-8 text: {show(value)}") from None


def parse_v2_node_ids(body: dict[str, Any], max_ids: int) -> tuple[list[int | str], str | None]:
    """The node IDs of a v2 request (one tensor ``node_ids`` or ``node_id``, any shape of ``n``
    elements: ``[n]``, ``[n, 1]``, ``[1, n]``) and its ``id``."""
    count = raw_length(body, "node_ids") or raw_length(body, "node_id")
    if count > max_ids:
        raise TooLarge(
            f"the input tensor has {count} node IDs; this archive accepts at most {max_ids} per "
            "request"
        )
    tensors, request_id = read_inputs(
        body, [Wanted(("node_ids", "node_id"), ID_TYPES)], NODE_EXAMPLE
    )
    return tensors["node_ids"].values, request_id


def v2_parameter(body: dict[str, Any], name: str, tensor: str) -> str | None:
    """A string parameter of a v2 request, given as a request parameter or a parameter of its
    input tensor ``tensor`` (KServe's JSON form ``"user"``, or gRPC's ``{"string_param":
    "user"}``); None when neither has it, 400 when they differ or it is not a string."""
    found: list[Any] = []
    places = [body.get("parameters")]
    inputs = body.get("inputs")
    if isinstance(inputs, list):
        places += [
            t.get("parameters")
            for t in inputs
            if isinstance(t, dict) and t.get("name") in (tensor, tensor.removesuffix("s"))
        ]
    for place in places:
        if isinstance(place, dict) and name in place:
            value = place[name]
            if isinstance(value, dict) and set(value) == {"string_param"}:
                value = value["string_param"]
            if not isinstance(value, str):
                raise BadRequest(f"the parameter {name} must be a string; got {show(value)}")
            found.append(value)
    if len(set(found)) > 1:
        raise BadRequest(f"the parameter {name} is given twice with different values: {found}")
    return found[0] if found else None


def ids_datatype(ids: Sequence[int | str]) -> str:
    """``INT64`` when every ID is an integer, else ``BYTES`` (IDs go back as they came)."""
    return "INT64" if all(isinstance(node, int) for node in ids) else "BYTES"


def output(name: str, datatype: str, shape: list[int], data: list[Any]) -> dict[str, Any]:
    """One output tensor, ``data`` flat and row-major."""
    return {"name": name, "shape": shape, "datatype": datatype, "data": data}


def class_outputs(probabilities: list[list[float]]) -> list[dict[str, Any]]:
    """``predicted_class`` ``[n]`` and ``probabilities`` ``[n, C]``, one row per answer."""
    classes = [max(range(len(row)), key=row.__getitem__) for row in probabilities]
    width = len(probabilities[0]) if probabilities else 0
    return [
        output("predicted_class", "INT64", [len(classes)], classes),
        output(
            "probabilities",
            "FP32",
            [len(probabilities), width],
            [value for row in probabilities for value in row],
        ),
    ]


def inference_response(
    request_id: str | None, model_name: str, model_version: str, outputs: list[dict[str, Any]]
) -> dict[str, Any]:
    """A v2 answer: ``model_name``, ``model_version``, ``outputs``, and the request's ``id``."""
    response: dict[str, Any] = {
        "model_name": model_name,
        "model_version": model_version,
        "outputs": outputs,
    }
    if request_id is not None:
        response["id"] = request_id
    return response


def v2_response(
    request_id: str | None,
    model_name: str,
    model_version: str,
    node_ids: list[int | str],
    probabilities: list[list[float]],
    node_type: str | None = None,
) -> dict[str, Any]:
    """A node archive's v2 answer: the node IDs echoed, classes, probabilities; on a graph of
    several node types a ``node_type`` output too, each ID's type (an output, not a parameter:
    TorchServe's gRPC response converter copies outputs only)."""
    ids = output("node_id", ids_datatype(node_ids), [len(node_ids)], node_ids)
    types = (
        []
        if node_type is None
        else [output("node_type", "BYTES", [len(node_ids)], [node_type] * len(node_ids))]
    )
    outputs = [ids, *types, *class_outputs(probabilities)]
    return inference_response(request_id, model_name, model_version, outputs)


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
        "outputs": [output("error", "BYTES", [1], [message])],
    }


def explanation_refusal(example: str) -> BadRequest:
    """Explanations answer in their own JSON shape, which v2 outputs cannot carry: a v2 body
    sent to ``/explanations`` (or ``/v2/models/<m>/explain``) is told what to send."""
    return BadRequest(f"explanations take the JSON body, e.g. {example}, not KServe v2 tensors")


BINARY_HEADER = "inference-header-content-length"


def binary_extension_refusal() -> BadRequest:
    """What a client using the binary tensor data extension is told (it can read it: the
    error is JSON with an ``error`` field, as the protocol's clients expect)."""
    return BadRequest(
        "the binary tensor data extension is not supported: send the tensors as JSON (with "
        "tritonclient: InferInput.set_data_from_numpy(array, binary_data=False) and "
        "InferRequestedOutput(name, binary_data=False))"
    )
