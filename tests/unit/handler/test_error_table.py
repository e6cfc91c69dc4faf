"""The one table from domain errors to statuses and bodies."""

from __future__ import annotations

import errno

import pytest

from graph_assets.errors import (
    SubgraphTooLarge,
    UpdateLogUnavailable,
    UpdateLogWriteFailed,
    UpdateNotReplicated,
)
from graph_assets.live.operations import Rejection, UpdateRejected
from graph_assets.live.overlay import ListenerBehind
from graph_assets.remote.errors import RemoteDataCorrupt, RemoteDataLost
from handler.live.errors import (
    MalformedUpdate,
    TooManyOperations,
    UpdateKeyRejected,
    UpdateRaceLost,
    UpdateRefused,
    UpdatesDisabled,
    UpdatesHalted,
)
from handler.protocol import errors
from handler.protocol.error_table import api_error, batch_error, internal_error


@pytest.mark.parametrize(
    ("kind", "status", "type_name"),
    [
        (Rejection.INVALID, 400, "BadRequest"),
        (Rejection.MISSING, 404, "NotFound"),
        (Rejection.CONFLICT, 409, "Conflict"),
        (Rejection.LIMIT, 413, "TooLarge"),
    ],
)
def test_each_kind_of_rejected_update_has_its_status(kind, status, type_name):
    error = api_error(UpdateRejected(kind, 2, "what is wrong"))
    assert error is not None
    assert error.body() == {
        "code": status,
        "type": type_name,
        "message": "operation 2: what is wrong",
        "error": "operation 2: what is wrong",
    }


def test_every_rejection_kind_is_in_the_table():
    for kind in Rejection:
        assert api_error(UpdateRejected(kind, 0, "x")) is not None


@pytest.mark.parametrize(
    ("code", "status"),
    [(errno.ENOSPC, 507), (errno.EDQUOT, 507), (errno.EFBIG, 507), (errno.EIO, 503)],
)
def test_a_failed_log_write_is_507_when_the_volume_is_full_else_503(code, status):
    error = api_error(UpdateLogWriteFailed(code, "could not write", rolled_back=True))
    assert error is not None and error.status == status


@pytest.mark.parametrize("kind", [UpdateLogUnavailable, UpdateNotReplicated])
def test_an_update_log_out_of_reach_is_503_saying_what_is_in_the_log(kind):
    error = api_error(kind("update log redis://h:1/0: seq 3 may have been written"))
    assert error is not None and error.status == 503 and error.type_name == "Unavailable"
    assert error.message == "update log redis://h:1/0: seq 3 may have been written"


def test_an_oversized_ego_graph_is_413_and_says_how_to_fix_it():
    error = api_error(SubgraphTooLarge(10, 20, 5, 5))
    assert error is not None and error.status == 413 and "lower the fanouts" in error.message


def test_rows_behind_the_graph_answer_the_whole_batch_503_without_the_cause():
    error = batch_error(ListenerBehind("1 update(s) ... (RemoteUnavailable: Redis at redis://h:1)"))
    assert error is not None and error.status == 503 and error.type_name == "Unavailable"
    assert "precomputed rows up to date" in error.message and "redis://" not in error.message
    assert api_error(ListenerBehind("x")) is not None


def test_anything_else_is_not_a_client_error():
    assert api_error(RuntimeError("a bug")) is None
    assert internal_error(RuntimeError("a bug"), "model").status == 500
    assert "ran out of memory during model" in internal_error(MemoryError(), "model").message


@pytest.mark.parametrize(
    ("error", "what"),
    [
        (
            RemoteDataLost("redis://10.0.0.5:7000 prefix 'g' lost key {g:g1.0}:b1:x0", "k"),
            "is missing from",
        ),
        (
            RemoteDataCorrupt("redis://10.0.0.5:7000 prefix 'g': key {g:g1.0}:b1:x0", "k"),
            "is corrupt in",
        ),
    ],
)
def test_lost_or_corrupt_graph_data_is_its_requests_503_not_the_batchs(error, what):
    """Only the requests that read the value fail (not a batch error); the key and address
    are the log's, the client learns what is wrong and that a reload repairs it."""
    answer = api_error(error)
    assert answer is not None and answer.status == 503 and answer.type_name == "Unavailable"
    assert answer.message.startswith(f"graph data this request needs {what} the graph store")
    assert answer.message.endswith("; the server log names the key and how to restore it")
    assert "10.0.0.5" not in answer.message and "{g:" not in answer.message
    assert batch_error(error) is None


@pytest.mark.parametrize(
    ("error", "status", "type_name", "message"),
    [
        (
            UpdatesDisabled(),
            403,
            "Forbidden",
            "updates are disabled for this archive; build it with ./build_mar.sh "
            "--enable-updates (and give its workers an update secret) to take them",
        ),
        (UpdateKeyRejected("the key"), 403, "Forbidden", "the key"),
        (MalformedUpdate("the shape"), 400, "BadRequest", "the shape"),
        (TooManyOperations("3 operations"), 413, "TooLarge", "3 operations"),
        (UpdatesHalted("could not apply seq 4"), 503, "Unavailable", "could not apply seq 4"),
        (UpdateRaceLost("50 other updates"), 503, "Unavailable", "50 other updates"),
    ],
)
def test_each_refused_update_has_its_status_and_message(error, status, type_name, message):
    answer = api_error(error)
    assert answer is not None
    assert answer.body() == {
        "code": status,
        "type": type_name,
        "message": message,
        "error": message,
    }


def test_every_kind_of_refused_update_is_in_the_table():
    kinds = UpdateRefused.__subclasses__()
    assert len(kinds) == 6
    for kind in kinds:
        error = kind() if kind is UpdatesDisabled else kind("why")
        answer = api_error(error)
        assert answer is not None and 400 <= answer.status < 600, kind


def test_the_live_graphs_errors_name_no_status():
    for kind in (UpdateRefused, *UpdateRefused.__subclasses__()):
        assert not hasattr(kind, "status") and not hasattr(kind, "body"), kind
        assert not issubclass(kind, errors.ApiError), kind


def test_one_not_found_for_a_requested_node_and_an_updates_node_or_edge():
    assert not hasattr(errors, "NodeNotFound")
    missing_edge = api_error(UpdateRejected(Rejection.MISSING, 0, "no edge 3 -> 6"))
    assert type(missing_edge) is errors.NotFound and missing_edge.status == 404
    assert missing_edge.body()["type"] == "NotFound"
