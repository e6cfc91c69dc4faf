"""The one batch pipeline every task plugs into, free of TorchServe so it can be tested alone.

``prepare`` parses every request on its own and groups the valid ones (a node batch: ONE
ego-graph for the union of its seeds); ``run`` computes each group once; ``respond`` makes
exactly one response per request, checked, each answer free of NaN and infinity (a model's
non-finite output is that request's 500, ``handler.protocol.answer_check``). The fault rules
live here and only here: a group over the subgraph limits, or whose preparation or computation
fails unexpectedly, is split into single requests, so only the request that causes a failure
gets its error; a CUDA error that leaves the device unusable ends the worker instead
(:class:`DeviceFailure`), so TorchServe restarts it. A task supplies parsing, grouping, the
computation and the response body.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import torch

from graph_assets.errors import SubgraphTooLarge
from graph_assets.remote import RemoteCounters
from handler.gpu.feature_keeper import KeeperLost
from handler.protocol.answer_check import non_finite_error
from handler.protocol.error_table import (
    api_error,
    batch_error,
    internal_error,
    is_out_of_memory,
)
from handler.protocol.errors import ApiError, InternalError
from handler.protocol.response import Response
from handler.settings import ServingSettings

logger = logging.getLogger(__name__)

R = TypeVar("R")
T = TypeVar("T")


class DeviceFailure(SystemExit):
    """The accelerator is unusable: this worker process must end so TorchServe starts a new one.

    A CUDA error other than out-of-memory (an illegal address, a device-side assert, a launch
    failure) is sticky: it poisons the CUDA context, and every later kernel in the process fails
    too. Answering 500 forever is worse than losing the requests in flight, so the engine ends
    the process. It is a ``SystemExit`` because TorchServe catches ``Exception`` around the
    handler and would keep the broken worker alive; this passes through, the worker exits with
    status 1, and TorchServe fails the batch in flight and restarts the worker.
    """

    def __init__(self, error: BaseException) -> None:
        super().__init__(1)
        self.error = error


def raise_if_fatal(error: Exception, device: torch.device) -> None:
    """Ends the worker (``DeviceFailure``) on an unrecoverable device error; else returns."""
    if is_fatal_device_error(error):
        logger.critical(
            "unrecoverable device error on %s (%s); ending this worker so that TorchServe "
            "starts a fresh one",
            device,
            error,
        )
        raise DeviceFailure(error) from error


def is_fatal_device_error(error: BaseException) -> bool:
    """True for a CUDA error that leaves the device unusable (not an out-of-memory), and for
    the end of the process that held this GPU's shared features."""
    if isinstance(error, KeeperLost):
        return True
    if is_out_of_memory(error):
        return False
    accelerator = getattr(torch, "AcceleratorError", None)
    if accelerator is not None and isinstance(error, accelerator):
        return True
    return isinstance(error, RuntimeError) and "CUDA error" in str(error)


@dataclass
class StageTimes:
    """Seconds spent per stage of one batch, and its sizes (reported as metrics); on a graph
    in Redis, what its reads cost (round trips, value bytes, cache hits and misses of block
    fields, seconds waiting for Redis, which the stages' times include)."""

    batch_size: int = 0
    seed_nodes: int = 0
    sampled_nodes: int = 0
    sampled_edges: int = 0
    parse: float = 0.0
    sample: float = 0.0
    gather: float = 0.0
    forward: float = 0.0
    format: float = 0.0
    remote_round_trips: int = 0
    remote_bytes: int = 0
    remote_cache_hits: int = 0
    remote_cache_misses: int = 0
    remote_read: float = 0.0

    def add_reads(self, before: RemoteCounters | None, after: RemoteCounters | None) -> None:
        """Adds what a graph in Redis read between two snapshots of its counters."""
        if before is None or after is None:
            return
        self.remote_round_trips += after.round_trips - before.round_trips
        self.remote_bytes += after.bytes_read - before.bytes_read
        self.remote_cache_hits += after.cache_hits - before.cache_hits
        self.remote_cache_misses += after.cache_misses - before.cache_misses
        self.remote_read += after.read_seconds - before.read_seconds


@dataclass
class Group:
    """Requests computed together, and what was prepared for them (an ego-graph, a batch)."""

    positions: list[int]
    payload: Any


@dataclass
class Batch(Generic[R]):
    """One TorchServe batch in flight: per-request outcome, groups, results, stage times."""

    outcomes: list[R | ApiError]
    groups: list[Group] = field(default_factory=list)
    results: dict[int, Any] = field(default_factory=dict)
    times: StageTimes = field(default_factory=StageTimes)

    @property
    def batch(self) -> Batch[R]:
        """Itself: ``run`` hands back the batch it was given, as the node engine's result
        (which refers to its batch as ``.batch``)."""
        return self


class BatchEngine(ABC, Generic[R]):
    """prepare -> run -> respond over parsed requests of type ``R`` (see the module docstring)."""

    device: torch.device

    def refresh(self) -> None:
        """Runs before each batch is parsed (node archives: read the live updates)."""

    def read_counters(self) -> RemoteCounters | None:
        """What the graph's reads cost so far when it is read from Redis; None otherwise."""
        return None

    @abstractmethod
    def parse(self, item: Any) -> R:
        """One raw TorchServe request -> a validated request; raises ApiError."""

    def plan(self, positions: list[int], outcomes: list[R | ApiError]) -> list[list[int]]:
        """How the valid requests are grouped; by default all in one group."""
        return [positions]

    @abstractmethod
    def make_group(self, positions: list[int], outcomes: list[R | ApiError]) -> Any:
        """Prepares a group (samples its ego-graph); may raise SubgraphTooLarge or ApiError."""

    @abstractmethod
    def run_group(self, group: Group, batch: Batch[R]) -> None:
        """Computes the group; stores each request's result in ``batch.results[position]``."""

    @abstractmethod
    def body(self, request: R, result: Any) -> dict[str, Any]:
        """The JSON body of a successful request."""

    def parse_batch(self, items: Sequence[Any]) -> list[R | ApiError]:
        """Each request parsed alone (a task may share work across them, e.g. one ID lookup)."""
        return [self._parse(item) for item in items]

    def prepare(self, items: Sequence[Any]) -> Batch[R]:
        batch: Batch[R] = Batch(outcomes=[], times=StageTimes(batch_size=len(items)))
        reads = self.read_counters()
        start = time.perf_counter()
        self.refresh()
        batch.outcomes = self.parse_batch(items)
        batch.times.parse = time.perf_counter() - start
        start = time.perf_counter()
        valid = [i for i, o in enumerate(batch.outcomes) if not isinstance(o, ApiError)]
        for positions in self.plan(valid, batch.outcomes) if valid else []:
            batch.groups += self._make_groups(positions, batch.outcomes)
        batch.times.sample = time.perf_counter() - start
        batch.times.add_reads(reads, self.read_counters())
        return batch

    def run(self, batch: Batch[R]) -> Batch[R]:
        reads = self.read_counters()
        for group in batch.groups:
            self._run(group, batch)
        batch.times.add_reads(reads, self.read_counters())
        return batch

    def respond(self, batch: Batch[R]) -> list[Response]:
        start = time.perf_counter()
        responses = [self._respond(i, outcome, batch) for i, outcome in enumerate(batch.outcomes)]
        batch.times.format = time.perf_counter() - start
        if len(responses) != len(batch.outcomes):
            raise AssertionError(
                f"the batch has {len(batch.outcomes)} requests but {len(responses)} responses"
            )
        return responses

    def handle(self, items: Sequence[Any]) -> list[Response]:
        """``prepare``, ``run`` and ``respond`` in one call (tests, benchmarks)."""
        return self.respond(self.run(self.prepare(items)))

    def _parse(self, item: Any) -> R | ApiError:
        return parsed_or_error(self.parse, item)

    def _make_groups(self, positions: list[int], outcomes: list[R | ApiError]) -> list[Group]:
        if len(positions) > 1:
            try:
                return [Group(positions, self.make_group(positions, outcomes))]
            except (SubgraphTooLarge, ApiError):
                pass  # some request alone is too large or refused: find it, with no traceback
            except Exception as error:
                self._raise_if_fatal(error)
                logger.exception("preparing a group failed; preparing its requests one by one")
        groups = []
        for position in positions:
            try:
                groups.append(Group([position], self.make_group([position], outcomes)))
            except SubgraphTooLarge as error:
                outcomes[position] = api_error(error) or internal_error(error, "sampling")
            except ApiError as error:
                outcomes[position] = error
            except Exception as error:
                self._raise_if_fatal(error)
                outcomes[position] = request_failed(error, position, "sampling")
        return groups

    def _run(self, group: Group, batch: Batch[R]) -> None:
        try:
            self.run_group(group, batch)
            return
        except ApiError as error:
            if len(group.positions) == 1:
                batch.outcomes[group.positions[0]] = error
                return
        except Exception as error:
            self._raise_if_fatal(error)
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            if len(group.positions) == 1:
                position = group.positions[0]
                batch.outcomes[position] = request_failed(error, position, "model")
                return
            logger.exception("a batched computation failed; retrying its requests one by one")
        for retry in self._make_groups_one_by_one(group.positions, batch.outcomes):
            self._run(retry, batch)

    def _make_groups_one_by_one(
        self, positions: list[int], outcomes: list[R | ApiError]
    ) -> list[Group]:
        groups = []
        for position in positions:
            groups += self._make_groups([position], outcomes)
        return groups

    def _raise_if_fatal(self, error: Exception) -> None:
        raise_if_fatal(error, self.device)
        if batch_error(error) is not None:
            raise error  # the whole batch's answer (the router's), not retried one by one

    def _respond(self, position: int, outcome: R | ApiError, batch: Batch[R]) -> Response:
        if isinstance(outcome, ApiError):
            logger.info("request %d: %s %s", position, outcome.status, outcome.type_name)
            return Response(status=outcome.status, body=outcome.body())
        if position not in batch.results:
            error = InternalError("no answer was computed for this request")
            logger.error("request %d: %s", position, error.message)
            return Response(status=error.status, body=error.body())
        body = self.body(outcome, batch.results[position])
        broken = non_finite_error(body)
        if broken is not None:
            logger.error("request %d: %s", position, broken.message)
            return Response(status=broken.status, body=broken.body())
        return Response(status=200, body=body)


def logged_answer(error: Exception, what: str) -> ApiError | None:
    """The error table's answer for ``error`` met by ``what`` (a request, a lookup), logged
    in one line with its cause (graph data in Redis lost or corrupt: its key); None, nothing
    logged, for an error the table does not know (the caller's 500, with its traceback)."""
    answer = api_error(error)
    if answer is not None:
        logger.error("%s answered %d: %s", what, answer.status, error)
    return answer


def request_failed(error: Exception, position: int, stage: str) -> ApiError:
    """The answer of one request that ``error`` failed in ``stage`` (call it where the error
    is caught): the error table's, else a 500 logged with its traceback."""
    answer = logged_answer(error, f"request {position}")
    if answer is None:
        logger.exception("request %d: the %s failed", position, stage)
        return internal_error(error, stage)
    return answer


def parsed_or_error(parse: Callable[[Any], T], item: Any) -> T | ApiError:
    """``parse(item)``, or the error that request is answered with: its own ApiError, or a 500
    (logged) for anything unexpected, so one body never fails its batch."""
    try:
        return parse(item)
    except ApiError as error:
        return error
    except Exception as error:
        if batch_error(error) is not None:
            raise  # the whole batch's answer (the router's)
        answer = logged_answer(error, "a request")
        if answer is not None:  # e.g. its IDs' entries in Redis lost or corrupt
            return answer
        logger.exception("unexpected error while parsing a request")
        return InternalError("the request could not be parsed; the error is in the server log")


def timed(times: StageTimes, stage: str) -> Callable[[], None]:
    """Starts a clock; calling the result adds the elapsed seconds to ``times.<stage>``."""
    start = time.perf_counter()

    def stop() -> None:
        setattr(times, stage, getattr(times, stage) + time.perf_counter() - start)

    return stop


def apply_threads(settings: ServingSettings) -> None:
    """The worker's intra-op threads (one task per worker process owns the count)."""
    if settings.torch_threads > 0:
        torch.set_num_threads(settings.torch_threads)
