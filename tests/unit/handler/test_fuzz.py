"""Property-based fuzzing of request parsing and of the engine: every input gives an answer.

Whatever arrives (any JSON value, any bytes, any text, any shape of batch item), the parser
either returns a valid ``NodeRequest`` or raises an ``ApiError`` with a 4xx status, and the
engine returns exactly one response per request: 200, or a 4xx with a ``{code, type, message}``
body. Never an exception, never a 500, never a hang (each example has a deadline). Bounded so
that the whole module runs in a few seconds.
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from handler.protocol.errors import ApiError
from handler.tasks.node.requests import NodeRequest, parse_node_request
from tests.strategies import encoded, json_values, request_objects

from .conftest import make_engine

MAX_IDS = 8
MAX_MESSAGE = 2000
FUZZ = settings(
    max_examples=300,
    deadline=2000,  # ms per example: a hang fails the test instead of stalling the suite
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# IDs the int store has (multiples of 3 below 240) and their canonical strings.
known_ids = st.integers(min_value=0, max_value=79).map(lambda i: i * 3)
known_ids = known_ids | known_ids.map(str)
objects = request_objects(known_ids, MAX_IDS)
# What TorchServe may hand the handler as a body: a decoded JSON value (application/json),
# text (text/*), or bytes (anything else, or JSON it failed to decode).
bodies = (
    objects
    | objects.map(encoded)
    | objects.map(lambda v: bytearray(encoded(v)))
    | objects.map(json.dumps)
    | st.binary(max_size=64)
    | st.text(max_size=64)
)
items = (
    bodies.map(lambda b: {"body": b})
    | bodies.map(lambda b: {"data": b})
    | st.dictionaries(st.text(max_size=10), st.binary(max_size=10), max_size=3)
    | json_values
)


def check_error(error: ApiError) -> None:
    assert 400 <= error.status < 500, error
    body = error.body()
    assert set(body) == {"code", "type", "message", "error"}
    assert body["code"] == error.status and body["type"] == type(error).__name__
    assert isinstance(body["message"], str) and 0 < len(body["message"]) <= MAX_MESSAGE


@FUZZ
@given(item=items)
@example(item={"body": b"[" * 100_000})
@example(item={"body": "{" * 5_000})
@example(item={"body": b'{"node_id": 1e999}'})
@example(item={"body": b'{"node_id": "' + b"9" * 5000 + b'"}'})
@example(item={"body": b'{"node_ids": [' + b"9" * 5000 + b"]}"})
@example(item={"body": {"node_id": float("nan")}})
@example(item={"body": {"node_ids": [True, False]}})
@example(item={"body": {"node_id": "\ud800"}})
def test_parser_returns_a_request_or_a_4xx(item: object) -> None:
    try:
        request = parse_node_request(item, MAX_IDS)
    except ApiError as error:
        check_error(error)
        return
    assert isinstance(request, NodeRequest)
    assert len(request.node_ids) >= 1 and len(request.node_ids) <= MAX_IDS
    assert all(
        isinstance(node, str) or (isinstance(node, int) and not isinstance(node, bool))
        for node in request.node_ids
    )


def deeply_nested(depth: int) -> list:
    """A list nested ``depth`` levels, built without recursion (deeper than repr can go)."""
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


PATHOLOGICAL = [
    {"body": {"node_ids": deeply_nested(5_000)}},
    {"body": {"node_id": deeply_nested(5_000)}},
    {"body": {"inputs": [{"name": "node_ids", "data": deeply_nested(5_000)}]}},
    {"body": {"node_ids": [list(range(100_000))]}},
    {"body": {"node_id": "x" * 1_000_000}},
    {"body": {"node_ids": ["y" * 100_000] * MAX_IDS}},
]


def test_pathological_values_get_a_short_4xx(engine) -> None:
    for item in PATHOLOGICAL[:4]:
        with pytest.raises(ApiError) as info:
            parse_node_request(item, MAX_IDS)
        check_error(info.value)
    responses = engine.handle(PATHOLOGICAL)
    assert [r.status for r in responses] == [400, 400, 400, 400, 404, 404]
    assert all(len(r.body["message"]) <= MAX_MESSAGE for r in responses)


def json_safe(value: object) -> bool:
    """True when ``value`` serializes as strict JSON (no NaN or infinity)."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and json_safe(v) for k, v in value.items())
    if isinstance(value, list):
        return all(json_safe(v) for v in value)
    return value is None or isinstance(value, (str, int, bool))


@pytest.fixture(scope="module")
def engine(int_store):
    return make_engine(int_store, fanouts=[3, 2], max_ids_per_request=MAX_IDS)


@FUZZ
@given(batch=st.lists(items, min_size=1, max_size=8))
def test_engine_answers_every_request_of_any_batch(engine, batch: list) -> None:
    responses = engine.handle(batch)
    assert len(responses) == len(batch)
    for response in responses:
        assert response.status in (200, 400, 404, 413), response
        assert json_safe(response.body)
        json.dumps(response.body, allow_nan=False)
        if response.status != 200:
            body = response.body
            assert (
                set(body) == {"code", "type", "message", "error"}
                and body["code"] == response.status
            )
            assert 0 < len(body["message"]) <= MAX_MESSAGE
