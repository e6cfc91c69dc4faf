"""Read-your-writes by version: ``min_graph_version`` in the body or the header, answered once
the worker holds that version, else 503 with Retry-After, and 400 for a malformed one."""

from __future__ import annotations

import json

import pytest
from ts.context import RequestProcessor

from handler.live.min_version import parse_min_version, split_min_version
from handler.protocol.body import Request
from handler.protocol.errors import BadRequest

from .conftest import started

SECRET = "update-secret-0123456789"


@pytest.fixture()
def live_handler(model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("GNNSERVE_UPDATE_SECRET", SECRET)
    return started(
        model_dir,
        4,
        updates_enabled=True,
        update_state_dir=str(tmp_path / "state"),
        min_version_wait_ms=50,
    )


def serve(handler, context, bodies, headers=None):
    headers = headers or [{} for _ in bodies]
    context.request_processor = [RequestProcessor(h) for h in headers]
    answers = [json.loads(a) for a in handler.handle([{"body": b} for b in bodies], context)]
    return [context.get_response_status(i)[0] for i in range(len(bodies))], answers


def test_a_version_held_is_answered_and_one_ahead_waits_then_gets_503(live_handler):
    handler, context = live_handler
    update = {"op": "update", "operations": [{"type": "add_node", "id": 900, "x": [0.1] * 6}]}
    statuses, answers = serve(
        handler, context, [update], headers=[{"X-Gnnserve-Update-Key": SECRET}]
    )
    assert statuses == [200]
    version = answers[0]["graph_version"]
    ahead = version.replace("+1", "+5")
    statuses, answers = serve(
        handler,
        context,
        [
            {"node_id": 900, "min_graph_version": version},
            {"node_id": 900, "min_graph_version": ahead},
            {"node_ids": [900]},
            {"inputs": [{"name": "node_ids", "shape": [1], "datatype": "INT64", "data": [900]}]},
        ],
        headers=[{}, {}, {}, {"X-Gnnserve-Min-Graph-Version": ahead}],
    )
    assert statuses == [200, 503, 200, 503]
    assert answers[0]["graph_version"] == version
    assert "did not reach it within 50 ms" in answers[1]["message"]
    assert context.get_response_headers(1)["Retry-After"] == "1"
    assert "Retry-After" not in context.get_response_headers(0)


def test_a_malformed_version_is_that_requests_400(live_handler):
    handler, context = live_handler
    statuses, answers = serve(
        handler, context, [{"node_id": 0, "min_graph_version": "latest"}, {"node_id": 0}]
    )
    assert statuses == [400, 200] and "graph_version from an answer" in answers[0]["message"]


def test_an_archive_without_updates_refuses_a_version(model_dir):
    handler, context = started(model_dir, 1)
    statuses, answers = serve(handler, context, [{"node_id": 0, "min_graph_version": "ab+1"}])
    assert statuses == [400] and "archives that take updates" in answers[0]["message"]


def test_the_field_is_taken_out_and_the_header_read():
    request, seq = split_min_version(
        Request(body={"node_id": 1, "min_graph_version": "ab+7"}), None
    )
    assert request.body == {"node_id": 1} and seq == 7
    assert split_min_version(Request(body={"node_id": 1}), "ff+3")[1] == 3
    assert split_min_version(Request(body={"node_id": 1}), None)[1] is None
    for bad in ("+1", "ab+", "ab+-1", "AB+1", 12, None, "ab+1+2"):
        with pytest.raises(BadRequest):
            parse_min_version(bad)
