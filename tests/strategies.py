"""Hypothesis strategies for request bodies, shared by the unit fuzzing of the handler and the
fuzzing of a real server: any JSON value, request-shaped objects, and mostly well-formed
requests (so the 200 and 404 paths are fuzzed as much as the 400s)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=20,
)


def encoded(value: object) -> bytes:
    """``value`` as JSON bytes (NaN and infinities written as Python's json writes them)."""
    return json.dumps(value).encode()


def request_objects(known_ids: SearchStrategy[Any], max_ids: int) -> SearchStrategy[Any]:
    """Objects shaped like our requests (and KServe v2 ones), whose values may be anything."""
    node_ids = known_ids | known_ids.map(str) | st.integers() | st.text(max_size=12) | json_values
    tensor = st.fixed_dictionaries(
        {},
        optional={
            "name": st.sampled_from(["node_ids", "node_id", "x"]) | json_values,
            "shape": st.lists(st.integers(-2, max_ids + 4), max_size=2) | json_values,
            "datatype": st.sampled_from(["INT64", "INT32", "BYTES", "FP32"]) | json_values,
            "data": st.lists(node_ids, max_size=max_ids + 2) | json_values,
        },
    )
    request_like = st.fixed_dictionaries(
        {},
        optional={
            "node_id": node_ids,
            "node_ids": st.lists(node_ids, max_size=max_ids + 2) | json_values,
            "inputs": st.lists(tensor, max_size=2) | json_values,
            "id": json_values,
            "extra": json_values,
        },
    )
    plausible_ids = known_ids | st.integers(min_value=-5, max_value=300) | st.text(max_size=8)
    plausible = (
        plausible_ids.map(lambda node: {"node_id": node})
        | st.lists(plausible_ids, min_size=1, max_size=max_ids + 1).map(
            lambda ids: {"node_ids": ids}
        )
        | st.lists(known_ids, min_size=1, max_size=max_ids).map(
            lambda ids: {
                "inputs": [
                    {
                        "name": "node_ids",
                        "shape": [len(ids)],
                        "datatype": "INT64" if isinstance(ids[0], int) else "BYTES",
                        "data": ids,
                    }
                ]
            }
        )
    )
    return plausible | request_like | json_values


def raw_bodies(known_ids: SearchStrategy[Any], max_ids: int) -> SearchStrategy[bytes]:
    """What a client can put on the wire: JSON of any of the above, or any bytes."""
    objects = request_objects(known_ids, max_ids)
    return objects.map(encoded) | st.binary(max_size=64) | st.text(max_size=64).map(str.encode)
