"""The one table from the domain's errors to the API's: the graph, the live graph and the sampler
say what went wrong, this module says which status and body a client gets for it."""

from __future__ import annotations

import errno

import torch

from graph_assets.errors import (
    SubgraphTooLarge,
    UpdateLogUnavailable,
    UpdateLogWriteFailed,
    UpdateNotReplicated,
)
from graph_assets.live.operations import Rejection, UpdateRejected
from graph_assets.live.overlay import ListenerBehind
from graph_assets.remote.errors import RemoteDataCorrupt, RemoteDataLost, RemoteUnavailable
from handler.live.errors import (
    MalformedUpdate,
    TooManyOperations,
    UpdateKeyRejected,
    UpdateRaceLost,
    UpdateRefused,
    UpdatesDisabled,
    UpdatesHalted,
)
from handler.protocol.errors import (
    ApiError,
    BadRequest,
    Conflict,
    Forbidden,
    InsufficientStorage,
    InternalError,
    NotFound,
    TooLarge,
    Unavailable,
)

_REJECTIONS: dict[Rejection, type[ApiError]] = {
    Rejection.INVALID: BadRequest,
    Rejection.MISSING: NotFound,
    Rejection.CONFLICT: Conflict,
    Rejection.LIMIT: TooLarge,
}
# Why the live graph refused an update (UpdatesDisabled is 403 with UPDATES_DISABLED, which says
# how to turn updates on). A halted worker, or one that kept losing the race for the next seq,
# may take the update later, or another replica may: 503, with Retry-After.
_UPDATE_REFUSALS: dict[type[UpdateRefused], type[ApiError]] = {
    UpdateKeyRejected: Forbidden,
    MalformedUpdate: BadRequest,
    TooManyOperations: TooLarge,
    UpdatesHalted: Unavailable,
    UpdateRaceLost: Unavailable,
}
UPDATES_DISABLED = (
    "updates are disabled for this archive; build it with ./build_mar.sh --enable-updates "
    "(and give its workers an update secret) to take them"
)
# A write that failed for lack of space is the operator's to fix (507); any other I/O error 503.
_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
# Graph data in Redis that a request needs and cannot be answered from: 503 for the requests
# that read it (never "the model failed"); the key is the server log's, not the client's.
_LOST_OR_CORRUPT: dict[type[Exception], str] = {
    RemoteDataLost: "is missing from the graph store (a lost key)",
    RemoteDataCorrupt: "is corrupt in the graph store (a value that fails its checks)",
}


def api_error(error: Exception) -> ApiError | None:
    """The answer for a domain error a client's request caused; None for anything else (a bug
    or a fault of the server, which the caller answers 500 and logs)."""
    if isinstance(error, ApiError):
        return error
    shared = batch_error(error)
    if shared is not None:
        return shared
    if isinstance(error, UpdateRejected):
        return _REJECTIONS[error.kind](str(error))
    if isinstance(error, UpdatesDisabled):
        return Forbidden(UPDATES_DISABLED)
    if isinstance(error, UpdateRefused):
        return _UPDATE_REFUSALS[type(error)](str(error))
    if isinstance(error, SubgraphTooLarge):
        return TooLarge(
            f"{error}; request fewer nodes, or lower the fanouts or raise "
            "max_subgraph_nodes/max_subgraph_edges in the model config"
        )
    if isinstance(error, UpdateLogWriteFailed):
        full = error.errno in _FULL_ERRNOS
        return (InsufficientStorage if full else Unavailable)(str(error))
    if isinstance(error, (UpdateLogUnavailable, UpdateNotReplicated)):
        # Their messages say what is in the log (may have been written; written, not
        # acknowledged), which the client needs before it sends the update again.
        return Unavailable(str(error))
    for kind, what in _LOST_OR_CORRUPT.items():
        if isinstance(error, kind):
            return Unavailable(
                f"graph data this request needs {what}; the server log names the key and how "
                "to restore it"
            )
    return None


def batch_error(error: BaseException) -> ApiError | None:
    """The answer for an error that every request of a batch meets alike: the graph store
    (Redis) down, failing over or slower than ``remote_timeout_ms``. It answers the whole batch
    at once (503, with Retry-After), never request by request, which would wait out the
    timeout again for each. None for any other error. The cause is the server log's, not the
    client's: the message names no address. So is a worker whose precomputed rows are not yet
    brought up to date after an update (their refresh met such a failure)."""
    if isinstance(error, RemoteUnavailable):
        return Unavailable(
            "the graph store is unavailable (failing over, or slower than its timeout); retry "
            "after the Retry-After seconds"
        )
    if isinstance(error, ListenerBehind):
        return Unavailable(
            "this worker is bringing its precomputed rows up to date after an update (their "
            "refresh failed); no answer is read from rows older than the graph version; retry "
            "after the Retry-After seconds"
        )
    return None


def internal_error(error: Exception, stage: str) -> InternalError:
    """The 500 of one request that failed unexpectedly (its traceback is in the server log);
    running out of memory says how to make the request smaller."""
    if is_out_of_memory(error):
        return InternalError(
            f"the server ran out of memory during {stage} of this request; request fewer nodes "
            "or lower the fanouts (the error is in the server log)"
        )
    return InternalError(f"the {stage} failed on this request; the error is in the server log")


def is_out_of_memory(error: BaseException) -> bool:
    """Host or device memory ran out: the request fails, the process stays usable."""
    if isinstance(error, (MemoryError, torch.OutOfMemoryError)):
        return True
    return isinstance(error, RuntimeError) and "out of memory" in str(error)
