"""A graph store that does not answer (Redis failing over, or slower than
``remote_timeout_ms``): every prediction of the batch is answered 503 with ``Retry-After``,
once for the whole batch rather than request by request, never 500; the worker answers 200 again,
identically, as soon as the store does."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from ts.context import RequestProcessor

from graph_assets.remote.errors import RemoteUnavailable
from handler.protocol.error_table import api_error, batch_error
from handler.protocol.errors import Unavailable

from .conftest import started

BODIES = [{"node_id": 3}, {"node_ids": [0, 6]}, {"node_id": 21}, {"node_ids": []}]


def serve(handler: Any, context: Any, bodies: list[Any]) -> tuple[list[int], list[Any]]:
    context.request_processor = [RequestProcessor({}) for _ in bodies]
    answers = [json.loads(a) for a in handler.handle([{"body": b} for b in bodies], context)]
    return [context.get_response_status(i)[0] for i in range(len(bodies))], answers


def failing(calls: list[int]) -> Callable[..., Any]:
    def read(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        raise RemoteUnavailable(
            "Redis at redis://10.0.0.5:7000 cannot be used: Timeout reading from socket"
        )

    return read


@pytest.mark.parametrize("read", ["lookup", "feature_rows"])
def test_an_unavailable_store_is_the_batchs_503_with_retry_after_then_200_again(
    model_dir, monkeypatch, read
):
    handler, context = started(model_dir, 4)
    statuses, before = serve(handler, context, BODIES)
    assert statuses == [200, 200, 200, 400]
    store = handler.engine.ego.store
    calls: list[int] = []
    monkeypatch.setattr(type(store), read, failing(calls))  # a frozen dataclass
    statuses, answers = serve(handler, context, BODIES)
    assert statuses == [503] * 4  # the batch's answer, the malformed request's too
    assert len(calls) == 1  # one read for the batch: not retried request by request
    for index in range(4):
        assert answers[index]["type"] == "Unavailable"
        assert answers[index]["message"].startswith("the graph store is unavailable")
        assert "10.0.0.5" not in answers[index]["message"]  # the address is the log's
        assert context.get_response_headers(index)["Retry-After"] == "1"
    monkeypatch.undo()
    statuses, after = serve(handler, context, BODIES)
    assert statuses == [200, 200, 200, 400]
    assert after == before


def test_the_error_table_maps_an_unavailable_store_to_503_and_nothing_else():
    error = RemoteUnavailable("Redis at redis://10.0.0.5:7000 cannot be used: refused")
    answer = api_error(error)
    assert isinstance(answer, Unavailable) and answer.status == 503
    assert batch_error(error) is not None
    assert batch_error(ValueError("a bug")) is None
    assert api_error(ValueError("a bug")) is None
