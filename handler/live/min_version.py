"""Read-your-writes across replicas: a prediction may name the graph version it must see.

An update's answer carries ``graph_version`` (``<graph checksum prefix>+<seq>``). A client that
sends that string with a later prediction (the body's ``min_graph_version``, or the header
``X-Gnnserve-Min-Graph-Version`` for bodies that cannot carry it, such as KServe v2) gets an
answer computed on that version or a later one, from whichever replica serves it: the worker
first applies the log up to that seq (waiting at most ``min_version_wait_ms``), else answers
503 with ``Retry-After``. The seq is what counts: it runs on across compactions of the lineage,
whose checksum prefix changes.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from handler.protocol.body import Request, show
from handler.protocol.errors import BadRequest

MIN_VERSION_FIELD = "min_graph_version"
MIN_VERSION_HEADER = "x-gnnserve-min-graph-version"
_VERSION = re.compile(r"^[0-9a-f]{1,64}\+(\d{1,18})$")
RETRY_AFTER_S = 1


def parse_min_version(value: Any) -> int:
    """The seq a ``graph_version`` string names; BadRequest for anything else."""
    match = _VERSION.match(value) if isinstance(value, str) else None
    if match is None:
        raise BadRequest(
            f"{MIN_VERSION_FIELD} must be a graph_version from an answer, like "
            f'"3f2a9c1b7d4e+42"; got {show(value)}'
        )
    return int(match.group(1))


def split_min_version(request: Request, header: str | None) -> tuple[Request, int | None]:
    """The request without its ``min_graph_version`` field, and the seq it asks for (the body's
    field, else the header; None when neither is there). BadRequest for a malformed one."""
    body, seq = request.body, None
    if header is not None:
        seq = parse_min_version(header)
    if isinstance(body, dict) and MIN_VERSION_FIELD in body:
        seq = parse_min_version(body[MIN_VERSION_FIELD])
        body = {key: value for key, value in body.items() if key != MIN_VERSION_FIELD}
        request = replace(request, body=body)
    return request, seq
