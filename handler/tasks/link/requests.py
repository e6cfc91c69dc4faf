"""Link archive requests: scored pairs (JSON or KServe v2) and top-k recommendations."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field, StrictBool, StrictInt

from handler.protocol.body import NodeId, as_request, show
from handler.protocol.errors import BadRequest, TooLarge
from handler.protocol.kserve_v2 import ID_TYPES, Wanted, is_v2_body, raw_length, read_inputs
from handler.protocol.validation import IdField, Strict, check_count, validate

LINK_EXAMPLE = '{"src": 1, "dst": 2}, {"pairs": [[1, 2], [3, 4]]} or {"src": 1, "top_k": 10}'
PAIRS_EXAMPLE = (
    '{"inputs": [{"name": "pairs", "shape": [2, 2], "datatype": "INT64", "data": [1, 2, 3, 4]}]}'
)


@dataclass(frozen=True)
class PairRequest:
    """``{"src": a, "dst": b}`` (``single``), ``{"pairs": [[a, b], ...]}``, or a v2 body with
    a ``pairs`` tensor ``[n, 2]`` (``protocol`` ``v2``, answered in kind, its ``id`` echoed)."""

    pairs: tuple[tuple[NodeId, NodeId], ...]
    single: bool
    protocol: Literal["json", "v2"] = "json"
    request_id: str | None = None


@dataclass(frozen=True)
class TopKRequest:
    """``{"src": a, "top_k": k, "exclude_neighbors": true}``."""

    src: NodeId
    k: int
    exclude_neighbors: bool


class _LinkBody(Strict):
    src: IdField | None = None
    dst: IdField | None = None
    pairs: list[Annotated[list[IdField], Field(min_length=2, max_length=2)]] | None = None
    top_k: StrictInt | None = None
    exclude_neighbors: StrictBool = True


def parse_link_request(item: Any, max_ids: int, max_top_k: int) -> PairRequest | TopKRequest:
    """One of the three link request forms, or a v2 pairs tensor; anything else is a 400."""
    body = as_request(item).json_object(LINK_EXAMPLE)
    if is_v2_body(body):
        return parse_v2_pairs(body, max_ids)
    if isinstance(body.get("pairs"), list):
        check_count("pairs", len(body["pairs"]), max_ids, "max_ids_per_request")
    parsed = validate(_LinkBody, body, LINK_EXAMPLE)
    if "exclude_neighbors" in body and parsed.top_k is None:
        raise BadRequest('exclude_neighbors goes with top_k: send {"src": 1, "top_k": 10}')
    src, dst, pairs, top_k = parsed.src, parsed.dst, parsed.pairs, parsed.top_k
    if src is not None and dst is not None and pairs is None and top_k is None:
        return PairRequest(pairs=((src, dst),), single=True)
    if pairs is not None and src is None and dst is None and top_k is None:
        if not pairs:
            raise BadRequest("pairs is empty; send at least one [src, dst] pair")
        return PairRequest(pairs=tuple((a, b) for a, b in pairs), single=False)
    if src is not None and top_k is not None and dst is None and pairs is None:
        if top_k < 1:
            raise BadRequest(f"top_k must be a positive integer; got {show(top_k)}")
        if top_k > max_top_k:
            raise TooLarge(
                f"top_k is {show(top_k)}; this archive returns at most {max_top_k} (raise "
                "max_top_k in the model config)"
            )
        return TopKRequest(src, top_k, parsed.exclude_neighbors)
    raise BadRequest(f"send one of {LINK_EXAMPLE}; got the field(s) {sorted(body)}")


def parse_v2_pairs(body: dict[str, Any], max_ids: int) -> PairRequest:
    """A v2 request's ``pairs`` tensor: shape ``[n, 2]``, one ``[src, dst]`` row per pair,
    INT64/INT32 or BYTES IDs."""
    check_count("the pairs tensor", raw_length(body, "pairs") // 2, max_ids, "max_ids_per_request")
    tensors, request_id = read_inputs(body, [Wanted(("pairs",), ID_TYPES)], PAIRS_EXAMPLE)
    pairs = tensors["pairs"]
    if len(pairs.shape) != 2 or pairs.shape[1] != 2:
        raise BadRequest(
            f"the pairs tensor must have shape [n, 2], one [src, dst] row per pair; got shape "
            f"{list(pairs.shape)}"
        )
    values = pairs.values
    return PairRequest(
        pairs=tuple(zip(values[0::2], values[1::2], strict=True)),
        single=False,
        protocol="v2",
        request_id=request_id,
    )
