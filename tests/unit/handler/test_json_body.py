"""Response bodies decode to what ``json.dumps`` would have written, whatever they hold."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from handler.protocol.json_body import encode_body

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),  # beyond 64 bits too: orjson refuses those, json writes them
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(),  # lone surrogates too, as a client can send them escaped
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.dictionaries(st.one_of(st.text(), st.integers(-9, 9)), inner, max_size=5)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(values)
def test_bodies_decode_like_json_dumps(value) -> None:
    assert json.loads(encode_body(value)) == json.loads(json.dumps(value))


def test_probabilities_keep_every_digit() -> None:
    body = {"node_id": 7, "probabilities": [0.1, 1 / 3, 2.5e-08, 0.9999999403953552]}
    assert json.loads(encode_body(body)) == body


def test_a_huge_node_id_falls_back_to_json() -> None:
    assert encode_body({"node_id": 2**70}) == json.dumps({"node_id": 2**70}).encode()
