"""The update route: the edge decides once that a request is an update, the router applies a
batch's updates first and in request order, and one update's failure is its own answer."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
from ts.context import RequestProcessor

from handler.live.live_graph import LiveGraph
from handler.pipeline.router import PREDICT, Router, predict_or_explain
from handler.protocol.body import Kind, Request, as_request
from handler.protocol.errors import BadRequest
from handler.protocol.response import Response

from .conftest import started

SECRET = "update-secret-0123456789"
KEY = {"X-Gnnserve-Update-Key": SECRET}


@pytest.fixture()
def live_handler(model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("GNNSERVE_UPDATE_SECRET", SECRET)
    return started(model_dir, 8, updates_enabled=True, update_state_dir=str(tmp_path / "state"))


def serve(handler, context, bodies, headers=None):
    """One batch through ``handle``: each request's status and JSON body, in order."""
    headers = headers or [{} for _ in bodies]
    context.request_processor = [RequestProcessor(h) for h in headers]
    answers = [json.loads(a) for a in handler.handle([{"body": b} for b in bodies], context)]
    return [context.get_response_status(i)[0] for i in range(len(bodies))], answers


def update(*operations: dict[str, Any]) -> dict[str, Any]:
    return {"op": "update", "operations": list(operations)}


def new_node(node_id: int) -> dict[str, Any]:
    return {"type": "add_node", "id": node_id, "x": [0.1] * 6}


def test_the_kind_is_decided_where_the_body_is_decoded():
    assert as_request({"body": update(new_node(1))}, update_key="k").kind is Kind.UPDATE
    assert as_request({"body": update(new_node(1))}, update_key="k").update_key == "k"
    for body in (
        {"node_id": 0, "op": "predict"},
        {"node_id": 0, "op": ["update"]},
        [{"op": "update"}],
        "update",
        {"node_id": 0},
    ):
        request = as_request({"body": body}, update_key="k")
        assert request.kind is Kind.PREDICTION and request.update_key is None, body
    assert as_request({"body": b"{oops"}).kind is Kind.PREDICTION
    assert SECRET not in repr(as_request({"body": update()}, update_key=SECRET))


@pytest.mark.parametrize("first", [0, 1, 2])
def test_updates_are_applied_before_every_prediction_of_their_batch(live_handler, first):
    """Wherever the update sits in the batch, every prediction of the batch reads it."""
    handler, context = live_handler
    bodies: list[dict[str, Any]] = [{"node_id": 900}, {"node_ids": [900, 0]}]
    bodies.insert(first, update(new_node(900), {"type": "add_edge", "src": 900, "dst": 0}))
    headers = [KEY if index == first else {} for index in range(3)]
    statuses, answers = serve(handler, context, bodies, headers)
    assert statuses == [200, 200, 200]
    applied = answers[first]
    assert applied["status"] == "applied" and applied["seq"] == 1
    predictions = [answer for index, answer in enumerate(answers) if index != first]
    assert all(answer["graph_version"] == applied["graph_version"] for answer in predictions)
    assert {p["node_id"] for p in predictions[1]["predictions"]} == {900, 0}


def test_updates_apply_in_request_order(live_handler):
    handler, context = live_handler
    edge = {"type": "add_edge", "src": 901, "dst": 0}
    bodies = [update(edge), {"node_id": 901}, update(new_node(901)), update(edge)]
    statuses, answers = serve(handler, context, bodies, [KEY, {}, KEY, KEY])
    # The edge before its node is refused; the node, then the same edge, apply as seq 1 and 2.
    assert statuses == [404, 200, 200, 200]
    assert answers[0]["type"] == "NotFound" and "901" in answers[0]["message"]
    assert [answers[2]["seq"], answers[3]["seq"]] == [1, 2]
    assert answers[1]["node_id"] == 901 and answers[1]["graph_version"].endswith("+2")
    assert handler.live is not None and handler.live.seq == 2


def test_a_failing_update_does_not_fail_its_neighbours(live_handler):
    handler, context = live_handler
    bodies = [
        update(new_node(910)),
        update(new_node(911)),
        {"node_id": 0},
        {"op": "update", "operations": []},
        update(new_node(910)),
        update(new_node(912)),
    ]
    headers = [{"X-Gnnserve-Update-Key": "wrong"}, KEY, {}, KEY, KEY, KEY]
    statuses, answers = serve(handler, context, bodies, headers)
    assert statuses == [403, 200, 200, 400, 200, 200]
    assert answers[0]["type"] == "Forbidden" and "x-gnnserve-update-key" in answers[0]["message"]
    assert answers[3]["message"] == 'an update carries a non-empty "operations" list'
    assert [answers[i]["seq"] for i in (1, 4, 5)] == [1, 2, 3]
    assert answers[2]["graph_version"].endswith("+3")
    assert handler.live is not None and handler.live.seq == 3


def test_an_update_that_fails_inside_the_handler_is_its_own_500(live_handler, monkeypatch):
    handler, context = live_handler
    live: LiveGraph = handler.live
    real = live.update

    def broken_for_913(request):
        if request.operations[0].get("id") == 913:
            raise RuntimeError("a bug in the update path")
        return real(request)

    monkeypatch.setattr(live, "update", broken_for_913)
    bodies = [update(new_node(913)), update(new_node(914)), {"node_id": 914}]
    statuses, answers = serve(handler, context, bodies, [KEY, KEY, {}])
    assert statuses == [500, 200, 200]
    assert answers[0]["type"] == "InternalError"
    assert answers[0]["message"] == "the update failed inside the handler; nothing was applied"
    assert answers[1]["seq"] == 1 and answers[2]["node_id"] == 914
    # The next batch is served as usual: nothing of 913 was applied.
    statuses, answers = serve(
        handler, context, [{"node_id": 913}, update(new_node(913))], [{}, KEY]
    )
    assert statuses == [404, 500]


def test_a_prediction_that_merely_names_an_op_is_a_prediction(live_handler):
    handler, context = live_handler
    bodies = [{"node_id": 0, "op": "predict"}, {**update(new_node(950)), "node_id": 0}]
    statuses, answers = serve(handler, context, bodies, [KEY, KEY])
    # The first is the node parser's 400; the second an update with a stray field.
    assert statuses == [400, 400]
    assert "op: unknown field (allowed: node_id, node_ids, node_type)" in answers[0]["message"]
    assert answers[1]["message"] == "unknown field(s) ['node_id'] in an update"
    assert handler.live is not None and handler.live.seq == 0


def test_a_version_made_by_an_update_of_the_same_batch_is_held(live_handler):
    handler, context = live_handler
    assert handler.live is not None
    made = handler.live.version.replace("+0", "+1")
    bodies = [{"node_id": 0, "min_graph_version": made}, update(new_node(920))]
    statuses, answers = serve(handler, context, bodies, [{}, KEY])
    assert statuses == [200, 200] and answers[0]["graph_version"] == made


def test_an_archive_without_updates_refuses_them_saying_how_to_enable_them(model_dir):
    handler, context = started(model_dir, 2)
    statuses, answers = serve(handler, context, [update(new_node(930)), {"node_id": 0}], [KEY, {}])
    assert statuses == [403, 200]
    assert answers[0]["type"] == "Forbidden" and "--enable-updates" in answers[0]["message"]


class Recording:
    """An engine that answers each request with its position in the engine's share and
    records the calls, shared across engines, in the order they happen."""

    def __init__(self, name: str, calls: list[tuple[str, str, list[Any]]]) -> None:
        self.name, self.calls = name, calls

    def prepare(self, items: Sequence[Any]) -> list[Any]:
        bodies = [as_request(item).body for item in items]
        self.calls.append((self.name, "prepare", bodies))
        return bodies

    def run(self, bodies: list[Any]) -> list[Any]:
        self.calls.append((self.name, "run", bodies))
        return bodies

    def respond(self, bodies: list[Any]) -> list[Response]:
        return [Response(200, {"engine": self.name, "body": body}) for body in bodies]


def test_the_router_runs_the_update_route_first_then_gates_and_prepares_the_rest():
    calls: list[tuple[str, str, list[Any]]] = []
    router = Router({PREDICT: Recording("predict", calls)}, predict_or_explain)
    router.take_updates(Recording("update", calls))
    gated: list[int] = []

    def gate(position: int) -> BadRequest | None:
        gated.append(position)
        return BadRequest("refused by the gate") if position == 3 else None

    items = [
        {"body": {"node_id": 1}},
        {"body": update(new_node(1))},
        {"body": {"node_id": 2, "op": "update-ish"}},
        {"body": {"node_id": 3}},
        Request(body=update(new_node(2)), kind=Kind.UPDATE),
    ]
    answers = router.handle(items, gate=gate)
    assert calls == [
        ("update", "prepare", [update(new_node(1)), update(new_node(2))]),
        ("update", "run", [update(new_node(1)), update(new_node(2))]),
        ("predict", "prepare", [{"node_id": 1}, {"node_id": 2, "op": "update-ish"}]),
        ("predict", "run", [{"node_id": 1}, {"node_id": 2, "op": "update-ish"}]),
    ]
    assert gated == [0, 2, 3]  # asked after the updates ran, never about an update
    assert [answer.body.get("engine") for answer in answers] == [
        "predict",
        "update",
        "predict",
        None,
        "update",
    ]
    assert answers[3].status == 400 and answers[3].body["message"] == "refused by the gate"


def test_an_update_route_that_fails_as_a_whole_answers_500_for_the_updates_alone():
    calls: list[tuple[str, str, list[Any]]] = []

    class Broken(Recording):
        def run(self, bodies: list[Any]) -> list[Any]:
            raise RuntimeError("a bug")

    router = Router({PREDICT: Recording("predict", calls)}, predict_or_explain)
    router.take_updates(Broken("update", calls))
    answers = router.handle([{"body": update(new_node(1))}, {"body": {"node_id": 1}}])
    assert [answer.status for answer in answers] == [500, 200]
    assert answers[0].body["type"] == "InternalError"


def test_an_unknown_node_and_an_unknown_edge_are_the_same_404(live_handler):
    handler, context = live_handler
    no_edge = {"type": "remove_edge", "src": 237, "dst": 234}  # two isolated nodes
    bodies = [{"node_id": 1}, update(no_edge), update({"type": "remove_node", "id": 1})]
    statuses, answers = serve(handler, context, bodies, [{}, KEY, KEY])
    assert statuses == [404, 404, 404]
    assert [answer["type"] for answer in answers] == ["NotFound"] * 3
    assert answers[0]["message"].startswith("node(s) not in the graph: 1")
