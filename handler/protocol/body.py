"""The edge of the handler: each TorchServe request decoded once into a :class:`Request`.

TorchServe hands every request over as ``{"body": ...}`` (or ``"data"``) holding bytes, text or an
already-decoded object. The handler turns each one into a ``Request`` before anything else looks
at it, so the update route, the router and the task's parser all read the same decoded value; a
body that cannot be decoded carries its 400 along and is answered as that request's own error.
What a request asks for (:class:`Kind`) is decided here too, once: nothing later asks a
prediction whether it is an update.
"""

from __future__ import annotations

import json
import reprlib
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from handler.protocol.errors import ApiError, BadRequest, TooLarge

NodeId = int | str  # a node ID exactly as the client sent it

_SHOW = reprlib.Repr()
_SHOW.maxstring = _SHOW.maxother = 60
_SHOW.maxlevel = 2


def show(value: Any) -> str:
    """A short repr of a client's value for an error message: bounded in length and depth, so a
    huge or deeply nested value neither floods the message nor overflows the stack."""
    return _SHOW.repr(value)


UPDATE_OP = "update"  # {"op": "update", ...}: docs/api.md, Live updates


class Kind(Enum):
    """What a request asks for: the router sends updates to its update route, every other
    request (predictions, extras, explanations) to the task's rule."""

    PREDICTION = "prediction"
    UPDATE = "update"


@dataclass(frozen=True)
class Request:
    """One request's decoded JSON value, or the error that decoding it raised; its kind, and
    for an update the update key its header carried (``None``: no header)."""

    body: Any = None
    error: ApiError | None = None
    kind: Kind = Kind.PREDICTION
    update_key: str | None = field(default=None, repr=False)  # a secret: never in a log line

    def json(self) -> Any:
        """The decoded value; the decoding error, raised, if there is none."""
        if self.error is not None:
            raise self.error
        return self.body

    def json_object(self, example: str) -> dict[str, Any]:
        """The decoded JSON object, or BadRequest naming an ``example`` of one."""
        body = self.json()
        if not isinstance(body, dict):
            raise BadRequest(
                f"the body must be a JSON object like {example}; got {type(body).__name__}"
            )
        return body


def as_request(item: Any, update_key: str | None = None) -> Request:
    """``item`` decoded, with its kind: an object whose ``"op"`` is ``"update"`` is an update
    and keeps ``update_key``; anything else is a prediction, an ``"op"`` field or not. A
    ``Request`` is passed through: nothing is decoded twice."""
    if isinstance(item, Request):
        return item
    try:
        body = decode_body(body_of(item))
    except ApiError as error:
        return Request(error=error)
    if isinstance(body, dict) and body.get("op") == UPDATE_OP:
        return Request(body=body, kind=Kind.UPDATE, update_key=update_key)
    return Request(body=body)


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


def decode_body(raw: Any) -> Any:
    """The JSON value of a body: TorchServe hands over a decoded object, bytes or text. A body
    whose parse runs out of the worker's memory is that request's 413; the batch goes on."""
    try:
        return _decoded_json(raw)
    except MemoryError:
        raise TooLarge(
            "the body is too large to parse in this worker's memory; send fewer IDs, pairs or "
            "a smaller graph per request"
        ) from None


def _decoded_json(raw: Any) -> Any:
    if isinstance(raw, (bytes, bytearray)):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise BadRequest("the body is not UTF-8 text; send a JSON object") from None
    if isinstance(raw, str):
        try:
            return json.loads(raw, parse_constant=_reject_constant)
        except ValueError as exc:
            raise BadRequest(
                f'the body is not valid JSON ({exc}); send e.g. {{"node_id": 42}}'
            ) from None
        except RecursionError:
            raise BadRequest(
                'the body nests too deeply to parse; send a flat object like {"node_id": 42}'
            ) from None
    return raw


def body_of(item: Any) -> Any:
    """TorchServe puts the payload under "body" (or "data" for some clients)."""
    if isinstance(item, dict):
        for key in ("body", "data"):
            if key in item:
                return item[key]
        if item:
            # curl -d without a Content-Type sends a form; TorchServe splits it into fields. So
            # does its gRPC Predictions with input keys of the client's choosing.
            raise BadRequest(
                "the body arrived as form fields, not JSON; send it with the header "
                "'Content-Type: application/json' (over TorchServe's gRPC Predictions: the JSON "
                'under the input key "data" or "body")'
            )
    # TorchServe hands over no field at all for an empty body, and for a form body without a
    # name=value pair: what `curl -d '{"node_id": 42}'` without a Content-Type sends.
    raise BadRequest(
        'empty request: no JSON body arrived; send a JSON object like {"node_id": 42} with the '
        "header 'Content-Type: application/json' (without it, curl -d sends the body as a form, "
        "which arrives empty)"
    )
