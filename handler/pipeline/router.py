"""Which engine answers which request: each task builds one router over its engines (its
predictions, its extras, its explanations; ``handler.tasks``) with a rule that picks the engine
from a request's decoded body and its ``explain`` flag. Updates take a route of their own, which
every task's router gets the same way (:meth:`Router.take_updates`): the edge decided each
request's kind when it decoded it (``handler.protocol.body``), so the task's rule never sees one.

The update route is prepared and run first, its updates applied in request order, before any
other request of the batch is checked against a graph version, parsed or sampled: a prediction
reads every update sent before it in its batch (read-your-writes), and after it too.

A TorchServe batch may mix requests for several engines (and explanation requests with
predictions: TorchServe batches both from one queue and marks each explanation request with an
``explain`` header). The router splits the batch, runs each engine on its share, and puts the
answers back in request order, one per request. An engine that fails as a whole answers 500
for its own requests only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

from handler.pipeline.batch import DeviceFailure, StageTimes
from handler.protocol.body import Kind, as_request
from handler.protocol.error_table import batch_error
from handler.protocol.errors import ApiError, InternalError
from handler.protocol.response import Response

logger = logging.getLogger(__name__)

PREDICT, EXTRAS, EXPLAIN, UPDATE = "predict", "extras", "explain", "update"
REFUSED = "refused"  # a request its gate refused: its part holds the answer, no engine runs
_SUMMED = tuple(item.name for item in fields(StageTimes) if item.name != "batch_size")


class TaskEngine(Protocol):
    """prepare -> run -> respond, as every ``handler.pipeline.batch.BatchEngine`` does."""

    def prepare(self, items: Sequence[Any]) -> Any: ...

    def run(self, batch: Any) -> Any: ...

    def respond(self, result: Any) -> list[Response]: ...


@dataclass
class _Part:
    """The share of a batch that one engine answers."""

    route: str
    positions: list[int]
    prepared: Any = None
    result: Any = None
    error: ApiError | None = None
    ran: bool = False


@dataclass
class RoutedBatch:
    """A batch split across engines; ``times`` adds up their stage times."""

    size: int
    parts: list[_Part] = field(default_factory=list)

    @property
    def times(self) -> StageTimes:
        total = StageTimes(batch_size=self.size)
        for part in self.parts:
            times = getattr(part.prepared, "times", None)
            if times is None:
                continue
            for name in _SUMMED:
                setattr(total, name, getattr(total, name) + getattr(times, name))
        return total


@dataclass
class RoutedResult:
    """What ``run`` hands ``respond`` (``batch`` as the handler's metrics expect)."""

    batch: RoutedBatch


Chooser = Callable[[Any, bool], str]
# The refusal, if any, of the request at a position, asked once the batch's updates are applied
# (the handler's: a ``min_graph_version`` this worker does not hold).
Gate = Callable[[int], ApiError | None]


class Router:
    """Dispatches each request of a batch to an engine by a route name (module docstring)."""

    def __init__(self, engines: dict[str, TaskEngine], choose: Chooser) -> None:
        self.engines = engines
        self.choose = choose

    def take_updates(self, engine: TaskEngine) -> None:
        """Sends every update to ``engine`` (``handler.live.updates.UpdateEngine``). A router
        without one hands updates to the task's rule, whose engines refuse them as bodies."""
        self.engines[UPDATE] = engine

    def prepare(
        self,
        items: Sequence[Any],
        explain: Sequence[bool] | None = None,
        gate: Gate | None = None,
    ) -> RoutedBatch:
        """Splits the batch by route; applies its updates (prepared and run, in request order)
        before ``gate`` is asked about any other request and before any other route prepares."""
        flags = list(explain) if explain is not None else [False] * len(items)
        updates: list[tuple[int, Any]] = []
        others: list[tuple[int, Any, bool]] = []
        for position, (item, flag) in enumerate(zip(items, flags, strict=True)):
            request = as_request(item)  # decoded once: the engine parses this same value
            if request.kind is Kind.UPDATE and UPDATE in self.engines:
                updates.append((position, request))
            else:
                others.append((position, request, flag))
        batch = RoutedBatch(size=len(items))
        if updates:
            part = self._prepared(UPDATE, updates)
            self._run(part)
            batch.parts.append(part)
        routed: dict[str, list[tuple[int, Any]]] = {}
        for position, request, flag in others:
            refusal = gate(position) if gate is not None else None
            if refusal is not None:
                batch.parts.append(_Part(REFUSED, [position], error=refusal))
                continue
            routed.setdefault(self.choose(request.body, flag), []).append((position, request))
        batch.parts.extend(self._prepared(route, entries) for route, entries in routed.items())
        return batch

    def _prepared(self, route: str, entries: list[tuple[int, Any]]) -> _Part:
        part = _Part(route, [position for position, _ in entries])
        try:
            part.prepared = self.engines[route].prepare([item for _, item in entries])
        except DeviceFailure:
            raise
        except Exception as error:
            part.error = _shared(error, route) or InternalError(
                "the request could not be prepared; see the server log"
            )
            if isinstance(part.error, InternalError):
                logger.exception("the %s engine failed to prepare its requests", route)
        return part

    def run(self, batch: RoutedBatch) -> RoutedResult:
        for part in batch.parts:
            self._run(part)
        return RoutedResult(batch=batch)

    def _run(self, part: _Part) -> None:
        """Runs a part once (the update route already ran in ``prepare``)."""
        if part.error is not None or part.ran:
            return
        part.ran = True
        try:
            part.result = self.engines[part.route].run(part.prepared)
        except DeviceFailure:
            raise
        except Exception as error:
            part.error = _shared(error, part.route) or InternalError(
                "the computation failed; the error is in the server log"
            )
            if isinstance(part.error, InternalError):
                logger.exception("the %s engine failed on its requests", part.route)

    def respond(self, result: RoutedResult) -> list[Response]:
        batch = result.batch
        answers: list[Response | None] = [None] * batch.size
        for part in batch.parts:
            responses = None
            if part.error is None:
                try:
                    responses = self.engines[part.route].respond(part.result)
                except Exception as failure:
                    part.error = _shared(failure, part.route)
                    if part.error is None:
                        logger.exception("the %s engine failed to format its answers", part.route)
            if responses is None or len(responses) != len(part.positions):
                error = part.error or InternalError("no answer was formatted; see the server log")
                responses = [Response(error.status, error.body()) for _ in part.positions]
            for position, response in zip(part.positions, responses, strict=True):
                answers[position] = response
        missing = [i for i, answer in enumerate(answers) if answer is None]
        if missing:
            raise AssertionError(f"the batch has {batch.size} requests but {missing} got no answer")
        return [answer for answer in answers if answer is not None]

    def handle(
        self, items: Sequence[Any], explain: Sequence[bool] | None = None, gate: Gate | None = None
    ) -> list[Response]:
        """``prepare``, ``run`` and ``respond`` in one call (tests, benchmarks)."""
        return self.respond(self.run(self.prepare(items, explain, gate)))


def _shared(error: Exception, route: str) -> ApiError | None:
    """The answer of every request of an engine's share for an error they all meet alike (the
    graph store unavailable: 503), logged in one line; None for any other error."""
    shared = batch_error(error)
    if shared is not None:
        logger.warning("the %s engine's requests answered %d: %s", route, shared.status, error)
    return shared


def predict_or_explain(body: Any, explain: bool) -> str:
    """The rule of a task whose only extra engine is its explanations."""
    return EXPLAIN if explain else PREDICT
