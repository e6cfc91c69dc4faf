"""The update route: every router sends the requests the edge decoded as updates here
(``handler.pipeline.router``), and runs them before any other request of the batch.

prepare -> run -> respond like the task engines: ``prepare`` checks each update's key and
shape, ``run`` applies them one by one in request order, ``respond`` hands back one answer per
update. Each update's failure is its own answer; the others still apply.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from handler.live.errors import UpdatesDisabled
from handler.live.live_graph import LiveGraph, UpdatePolicy, UpdateRequest, parse_update
from handler.protocol.body import as_request
from handler.protocol.error_table import api_error
from handler.protocol.errors import ApiError, InternalError
from handler.protocol.response import Response

logger = logging.getLogger(__name__)


class UpdateEngine:
    """Applies a batch's updates to ``live`` under ``policy`` (``live`` is None, and the policy
    disabled, for an archive that takes none: each update is refused 403)."""

    def __init__(self, live: LiveGraph | None, policy: UpdatePolicy) -> None:
        self.live = live
        self.policy = policy

    def prepare(self, items: Sequence[Any]) -> list[UpdateRequest | ApiError]:
        """Each update authorised and its fields checked, or the error that refuses it."""
        parsed: list[UpdateRequest | ApiError] = []
        for item in items:
            request = as_request(item)
            try:
                parsed.append(parse_update(request.json(), request.update_key, self.policy))
            except Exception as error:
                parsed.append(_refusal(error))
        return parsed

    def run(self, parsed: list[UpdateRequest | ApiError]) -> list[Response]:
        """Applies the updates in order; what the graph refuses is that update's answer."""
        return [self._apply(update) for update in parsed]

    def respond(self, answers: list[Response]) -> list[Response]:
        """One answer per update, in request order (``run`` formed them)."""
        return answers

    def _apply(self, update: UpdateRequest | ApiError) -> Response:
        if isinstance(update, ApiError):
            return _answer(update)
        try:
            if self.live is None:
                raise UpdatesDisabled()
            applied = self.live.update(update)
        except Exception as error:
            return _answer(_refusal(error))
        body = {
            "status": "applied",
            "operations": len(update.operations),
            "graph_version": self.live.version,
            "seq": applied.seq,
            "rows_rebuilding": applied.rows_rebuilding,
        }
        return Response(status=200, body=body)


def _refusal(error: Exception) -> ApiError:
    """The client's answer for an update that failed (``handler.protocol.error_table``); an
    error it does not list is a fault of the server: 500, its traceback logged."""
    refusal = api_error(error)
    if refusal is not None:
        logger.info("update refused: %s %s", refusal.status, refusal.type_name)
        return refusal
    logger.error("an update failed inside the handler; nothing was applied", exc_info=error)
    return InternalError("the update failed inside the handler; nothing was applied")


def _answer(error: ApiError) -> Response:
    return Response(status=error.status, body=error.body())
