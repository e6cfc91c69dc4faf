"""The request parser's fast path for the common bodies answers like full validation."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import handler.tasks.node.requests as requests_module
from handler.protocol.errors import TooLarge
from handler.tasks.node.requests import parse_node_request
from tests.strategies import json_values

ids = st.one_of(st.integers(), st.text(max_size=8), st.booleans(), st.floats(), st.none())
bodies = st.dictionaries(
    st.sampled_from(["node_id", "node_ids", "x"]),
    st.one_of(ids, st.lists(ids, max_size=4), json_values),
    max_size=2,
)


@given(body=bodies)
def test_the_fast_path_answers_exactly_like_full_validation(body):
    plain = requests_module._plain_request(body)
    if plain is None:
        return
    assert parse_node_request({"body": body}, max_ids=10_000) == plain
    validated = requests_module._NodeBody.model_validate(body)
    if validated.node_id is not None:
        assert plain.node_ids == (validated.node_id,) and plain.single
    else:
        assert validated.node_ids is not None
        assert plain.node_ids == tuple(validated.node_ids) and not plain.single


def test_the_fast_path_keeps_the_id_limit():
    with pytest.raises(TooLarge):
        parse_node_request({"body": {"node_ids": list(range(5))}}, max_ids=4)


def test_bools_and_floats_never_take_the_fast_path():
    for body in ({"node_id": True}, {"node_id": 1.0}, {"node_ids": [1, False]}, {"node_ids": []}):
        assert requests_module._plain_request(body) is None
