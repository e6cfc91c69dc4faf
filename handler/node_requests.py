"""Turns one raw request body into a validated :class:`NodeRequest`, or raises an ApiError."""

from __future__ import annotations

import json
import reprlib
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, StrictInt, StrictStr, ValidationError

from handler.errors import BadRequest, TooLarge
from handler.kserve_v2 import is_v2_body, parse_v2_node_ids

NodeId = int | str


@dataclass(frozen=True)
class NodeRequest:
    """A node classification request.

    Attributes:
        node_ids: the requested IDs exactly as the client sent them (type preserved).
        single: True for ``{"node_id": x}`` (one object answered), False for ``{"node_ids": [..]}``.
        protocol: ``json`` (our contract) or ``v2`` (a KServe v2 body, answered in kind).
        request_id: the v2 request's ``id``, echoed in its response.
    """

    node_ids: tuple[NodeId, ...]
    single: bool
    protocol: Literal["json", "v2"] = "json"
    request_id: str | None = None


class _NodeBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    node_id: StrictInt | StrictStr | None = None
    node_ids: list[StrictInt | StrictStr] | None = None


_SHOW = reprlib.Repr()
_SHOW.maxstring = _SHOW.maxother = 60
_SHOW.maxlevel = 2


def show(value: Any) -> str:
    """A short repr of a client's value for an error message: bounded in length and depth, so a
    huge or deeply nested value neither floods the message nor overflows the stack."""
    return _SHOW.repr(value)


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


def decode_body(raw: Any) -> Any:
    """The JSON value of a body: TorchServe hands over a decoded object, bytes or text."""
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
            # curl -d without a Content-Type sends a form; TorchServe splits it into fields.
            raise BadRequest(
                "the body arrived as form fields, not JSON; send it with the header "
                "'Content-Type: application/json'"
            )
    raise BadRequest('empty request; send a JSON object like {"node_id": 42}')


def _describe(error: ValidationError) -> str:
    """One line per offending field; the int/str union alternatives are folded together."""
    parts: dict[str, str] = {}
    for detail in error.errors():
        loc = [str(p) for p in detail["loc"] if p not in ("int", "str")]
        where = ".".join(loc) or "body"
        if detail["type"] == "extra_forbidden":
            parts[where] = f"{where}: unknown field (allowed: node_id, node_ids)"
        elif detail["type"] in ("int_type", "string_type"):
            value = detail["input"]
            got = f"{type(value).__name__} {show(value)}"
            parts[where] = f"{where}: expected an integer or a string, got {got}"
        else:
            parts.setdefault(where, f"{where}: {detail['msg']}")
    messages = list(parts.values())
    more = f"; and {len(messages) - 5} more" if len(messages) > 5 else ""
    return "; ".join(messages[:5]) + more


_ID_TYPES = (int, str)  # exactly these: bool is an int subclass but never a node ID


def _plain_request(body: dict[str, Any]) -> NodeRequest | None:
    """The common bodies, ``{"node_id": x}`` and ``{"node_ids": [...]}`` holding ints and strings
    only, accepted without the full validation (it cost ~20 us per request); anything else
    returns None and takes the validating path, which gives the same answer or the error."""
    if len(body) != 1:
        return None
    if type(body.get("node_id")) in _ID_TYPES:
        return NodeRequest(node_ids=(body["node_id"],), single=True)
    ids = body.get("node_ids")
    if type(ids) is list and len(ids) > 0 and all(type(x) in _ID_TYPES for x in ids):
        return NodeRequest(node_ids=tuple(ids), single=False)
    return None


def parse_node_request(item: Any, max_ids: int) -> NodeRequest:
    """Validates one request of a batch; a failure here never touches the others."""
    body = decode_body(body_of(item))
    if not isinstance(body, dict):
        raise BadRequest(
            f'the body must be a JSON object like {{"node_id": 42}}; got {type(body).__name__}'
        )
    if is_v2_body(body):
        node_ids, request_id = parse_v2_node_ids(body, max_ids)
        return NodeRequest(tuple(node_ids), single=False, protocol="v2", request_id=request_id)
    raw_ids = body.get("node_ids")
    if isinstance(raw_ids, list) and len(raw_ids) > max_ids:
        raise TooLarge(
            f"node_ids has {len(raw_ids)} entries; this archive accepts at most {max_ids} per "
            "request (split the list, or raise max_ids_per_request in the model config)"
        )
    plain = _plain_request(body)
    if plain is not None:
        return plain
    try:
        parsed = _NodeBody.model_validate(body)
    except ValidationError as exc:
        raise BadRequest(
            f"invalid request: {_describe(exc)}. Node IDs are integers or strings; send "
            '{"node_id": 42} or {"node_ids": [1, "acct_9"]}'
        ) from None
    if parsed.node_id is not None and parsed.node_ids is not None:
        raise BadRequest("send either node_id or node_ids, not both")
    if parsed.node_id is not None:
        return NodeRequest(node_ids=(parsed.node_id,), single=True)
    if parsed.node_ids is None:
        raise BadRequest('missing field: send {"node_id": 42} or {"node_ids": [1, 2]}')
    if not parsed.node_ids:
        raise BadRequest("node_ids is empty; send at least one node ID")
    return NodeRequest(node_ids=tuple(parsed.node_ids), single=False)
