"""The TorchServe handler: picks the device, loads graph and weights, maps results to statuses.

Thin on purpose: each request is decoded once at the edge (``handler.protocol``), the archive's
task (``handler.tasks``) parses, samples and infers, and nothing below this module and
``handler.worker_socket`` imports TorchServe.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from http import HTTPStatus
from pathlib import Path
from typing import Any

import torch
from ts.context import Context
from ts.metrics.dimension import Dimension
from ts.metrics.metric_type_enum import MetricTypes
from ts.torch_handler.base_handler import BaseHandler

from handler.graph.graph_source import open_graph
from handler.graph.precomputed import RefreshStats
from handler.live.live_graph import UPDATE_KEY_HEADER, LiveGraph
from handler.live.min_version import (
    MIN_VERSION_FIELD,
    MIN_VERSION_HEADER,
    RETRY_AFTER_S,
    split_min_version,
)
from handler.pipeline.batch import StageTimes
from handler.pipeline.metrics import GAUGES, BatchMetrics
from handler.pipeline.router import RoutedBatch, RoutedResult, Router
from handler.protocol.body import Request, as_request
from handler.protocol.errors import ApiError, BadRequest, Unavailable
from handler.protocol.json_body import encode_body
from handler.protocol.kserve_v2 import (
    BINARY_HEADER,
    binary_extension_refusal,
    is_v2_body,
    v2_error,
)
from handler.protocol.response import Response
from handler.settings import ServingSettings, worker_settings
from handler.tasks.registry import describe, start_task
from handler.tasks.spec import Archive, StartedTask
from handler.worker_metrics import HANDLER_TIME, HeldTimes
from handler.worker_socket import buffer_frontend_reads

logger = logging.getLogger(__name__)

# TorchServe's worker logs this on its root logger for every batch; the batch summary
# (handler.pipeline.metrics) replaces it at a fraction of the cost (~6% of a busy worker).
TORCHSERVE_BATCH_LINE = "Backend received inference at: %d"
_GAUGE = MetricTypes.GAUGE
TORCH_PROFILER_ENV = "ENABLE_TORCH_PROFILER"  # BaseHandler's switch for torch.profiler traces


def select_device(gpu_id: Any) -> torch.device:
    """cuda:<gpu_id> when TorchServe assigned a GPU and CUDA is usable, else the CPU."""
    if gpu_id is not None and torch.cuda.is_available():
        return torch.device(f"cuda:{int(gpu_id)}")
    return torch.device("cpu")


class GNNHandler(BaseHandler):
    """Serves node classification from the graph and weights packed in the archive."""

    def __init__(self) -> None:
        super().__init__()
        # The started task: its prediction engine, and the router that also sends embedding,
        # cold-start and explanation requests to their engines (handler.tasks).
        self.task: StartedTask | None = None
        self.engine: Any = None
        self.router: Router | None = None
        self.live: LiveGraph | None = None
        self._wants: list[int | ApiError | None] = []
        self._bodies: list[Any] = []
        self.settings = ServingSettings()
        self.batch_metrics = BatchMetrics(self.settings.metrics_interval_s)
        self._log_errors_reported = 0
        self._refreshes_reported: tuple[int, int, float, int] = (0, 0, 0.0, 0)

    def initialize(self, context: Context) -> None:
        """Loads everything once per worker; a bad archive fails here, not mid-request.

        A refusal is logged as one line naming the file and the problem (TorchServe's traceback
        follows it in model_log.log) and re-raised, so the worker never starts on a bad archive.
        """
        try:
            drop_torchserve_batch_line()
            if not buffer_frontend_reads():
                logger.warning("TorchServe's message reader not found: reading field by field")
            self._initialize(context)
        except Exception as error:
            logger.error("gnn worker refuses to start: %s", error)
            raise

    def _initialize(self, context: Context) -> None:
        properties = context.system_properties
        self.device = select_device(properties.get("gpu_id"))
        settings = worker_settings(context.model_yaml_config, int(properties["batch_size"]))
        self.batch_metrics = BatchMetrics(settings.metrics_interval_s)
        self.settings = settings
        archive = Archive(
            model_dir=Path(properties["model_dir"]),
            settings=settings,
            device=self.device,
            model_version=str(context.manifest.get("model", {}).get("modelVersion", "1.0")),
            model_name=context.model_name,
        )
        task = start_task(archive, open_graph=lambda: open_graph(archive.model_dir, settings))
        self.task, self.engine, self.router = task, task.engine, task.router
        self.live = task.live
        if context.metrics is not None and not isinstance(context.metrics, HeldTimes):
            context.metrics = HeldTimes(context.metrics)
        self.context = context
        self.initialized = True
        logger.info(
            "gnn %s model %s ready on %s: %s",
            settings.task,
            archive.model_version,
            self.device,
            task.summary(),
        )

    def handle(self, data: list[Any], context: Context) -> list[bytes]:
        """TorchServe's entry point for a batch. With live updates, the graph is held still from
        the first lookup to the last ``graph_version`` (the follower thread waits meanwhile),
        after catching up with every update acknowledged before the batch."""
        started = time.perf_counter()
        self._describe_call = self.is_describe_call(data, context)
        if self._describe_call:
            return super().handle(data, context)
        self.context = context
        self._answered_batch: tuple[StageTimes, int] | None = None
        requests = self._at_the_edge(data, context)
        held: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        if self.live is not None:
            wanted = [seq for seq in self._wants if isinstance(seq, int)]
            if wanted and max(wanted) > self.live.seq:  # before reading(): the follower needs it
                self.live.catch_up(max(wanted), self.settings.min_version_wait_ms / 1000)
            held = self.live.reading()
        with held:  # the report too: it reads the live graph's and the stored rows' state
            output = self._answer(requests, context)
            if self._answered_batch is not None:
                if context.metrics is not None:
                    elapsed_ms = 1000 * (time.perf_counter() - started)
                    context.metrics.add_time(HANDLER_TIME, elapsed_ms)  # held (worker_metrics)
                self._report(*self._answered_batch)
        return output

    def _answer(self, requests: list[Request], context: Context) -> list[bytes]:
        """preprocess, inference, postprocess. ``BaseHandler.handle`` would also write
        TorchServe's ``HandlerTime`` metric line for every batch; ``handle`` records it to be
        written with the interval report instead (handler.worker_metrics says why).
        TorchServe's profiler (``ENABLE_TORCH_PROFILER``) still runs there."""
        if os.environ.get(TORCH_PROFILER_ENV):
            return list(super().handle(requests, context))
        return self.postprocess(self.inference(self.preprocess(requests)))

    def _at_the_edge(self, data: list[Any], context: Context) -> list[Request]:
        """Each request decoded once, for the update route and the task alike: its kind (an
        update keeps its key header), and the graph version it asks for (``min_graph_version``)
        taken out of it."""
        requests: list[Request] = []
        self._wants = []
        self._headers = [lowercase_headers(context, index) for index in range(len(data))]
        for raw, headers in zip(data, self._headers, strict=True):
            request = as_request(raw, update_key=headers.get(UPDATE_KEY_HEADER))
            if BINARY_HEADER in headers:
                request = Request(error=binary_extension_refusal())
            want: int | ApiError | None
            try:
                request, want = split_min_version(request, headers.get(MIN_VERSION_HEADER))
            except ApiError as error:
                want = error
            requests.append(request)
            self._wants.append(want)
        self._bodies = [request.body for request in requests]
        return requests

    def _is_describe(self) -> bool:
        """``BaseHandler.handle`` asks this; ``handle`` decided it from the whole batch."""
        return self._describe_call

    @staticmethod
    def is_describe_call(data: list[Any], context: Context) -> bool:
        """The management API's describe call: a lone request with no payload and the header
        ``describe: True``. ``BaseHandler`` trusts the header of the batch's first request
        alone, and a client can send that header with a prediction: the batch would then get
        one description for all its requests, and TorchServe would answer each of them 503. A
        request with a body, or in a batch of several, is never a describe call."""
        header = context.get_request_header(0, "describe") if data else None
        return header == "True" and len(data) == 1 and not data[0]

    def preprocess(self, data: list[Any]) -> RoutedBatch:
        """The router applies the batch's updates first (in order), then refuses the requests
        that ask for a graph version this worker does not hold, validates each other request
        alone and samples one ego-graph for the batch's seeds. TorchServe marks each
        /explanations request with an "explain" header, per request."""
        explain = [headers.get("explain") == "True" for headers in self._headers]
        return self._router().prepare(data, explain=explain, gate=self._version_refusal)

    def _version_refusal(self, index: int) -> ApiError | None:
        """400 for a malformed ``min_graph_version``, 503 with ``Retry-After`` for one this
        worker has not reached in time; None when the request can be answered. Asked after the
        batch's updates are applied, so a version one of them made is held."""
        want = self._wants[index]
        if want is None or isinstance(want, ApiError):
            return want
        if self.live is None:
            return BadRequest(
                f"{MIN_VERSION_FIELD} applies to archives that take updates; this one does not"
            )
        if self.live.seq >= want:
            return None
        return Unavailable(
            f"this replica serves graph version {self.live.version}, before the requested "
            f"+{want}, and did not reach it within {self.settings.min_version_wait_ms:g} ms; "
            f"retry (this or another replica)"
        )

    def inference(self, data: RoutedBatch, *args: Any, **kwargs: Any) -> RoutedResult:
        """One forward pass for the batch, under ``torch.inference_mode()`` (in the engine)."""
        return self._router().run(data)

    def postprocess(self, data: RoutedResult) -> list[bytes]:
        """One JSON body per request, in order, each with its own HTTP status."""
        responses = self._router().respond(data)
        errors = sum(1 for response in responses if response.status >= 400)
        self._answered_batch = (data.batch.times, errors)
        responses = [self._in_kind(index, response) for index, response in enumerate(responses)]
        for index, response in enumerate(responses):
            phrase = HTTPStatus(response.status).phrase
            self.context.set_response_status(code=response.status, phrase=phrase, idx=index)
            self.context.set_response_content_type(index, "application/json")
            for name, value in retry_after(response).headers.items():
                self.context.set_response_header(index, name, value)
        return [encode_body(response.body) for response in responses]

    def _in_kind(self, index: int, response: Response) -> Response:
        """A v2 request's error in the shape v2 clients and TorchServe's gRPC converter read."""
        body = self._bodies[index] if index < len(self._bodies) else None
        if response.status < 400 or not isinstance(body, dict) or not is_v2_body(body):
            return response
        version = self.task.archive.model_version if self.task is not None else ""
        shaped = v2_error(response.body, body, self.context.model_name, version)
        return Response(response.status, shaped, response.headers)

    def _report(self, times: StageTimes, errors: int) -> None:
        """Batch figures as custom metrics (on TorchServe's Prometheus endpoint) and one log
        line, summed over ``metrics_interval_s`` (handler.pipeline.metrics says why)."""
        summary = self.batch_metrics.add(times, errors)
        if summary is None:
            return
        logger.info("%s", summary.describe())
        metrics = self.context.metrics
        if metrics is None:
            return
        for field_name, value in summary.mean_per_batch().items():
            name, unit = GAUGES[field_name]
            metrics.add_metric(
                name, round(value, 3), unit, dimensions=self._dimensions(), metric_type=_GAUGE
            )
        if isinstance(metrics, HeldTimes):
            metrics.report()
        metrics.add_metric(
            "GnnErrorResponses", summary.errors, "Count", dimensions=self._dimensions()
        )
        if self.live is not None:
            self._report_updates(metrics)
        if self.task is not None and self.task.precomputed is not None:
            rows = self.task.precomputed
            self._report_refreshes(metrics, rows.stats, rows.pending_rows)

    def _report_updates(self, metrics: Any) -> None:
        """The live graph's health (docs/operations.md): a record that cannot be applied, the
        log unreachable, how far behind the log this worker is, and the failed attempts to
        reach it since the last report."""
        live = self.live
        assert live is not None
        gauges = {
            "GnnUpdateReplayFailed": int(live.failure is not None),
            "GnnUpdateLogUnreachable": int(live.unreachable is not None),
            "GnnUpdateLag": live.lag,
        }
        for name, value in gauges.items():
            metrics.add_metric(
                name, value, "Count", dimensions=self._dimensions(), metric_type=_GAUGE
            )
        errors, self._log_errors_reported = (
            live.log_errors - self._log_errors_reported,
            live.log_errors,
        )
        metrics.add_metric("GnnUpdateLogErrors", errors, "Count", dimensions=self._dimensions())

    def _report_refreshes(self, metrics: Any, stats: RefreshStats, pending: int) -> None:
        """A precomputed archive since the last report: rows recomputed, marking and
        recomputing time per update, reads that recomputed rows first; rows still marked."""
        updates, rows, seconds, reads = self._refreshes_reported
        count = stats.updates - updates
        figures = {
            "GnnPrecomputedRefreshRows": (stats.rows - rows, "Count"),
            "GnnPrecomputedRefreshTime": (
                1000 * (stats.seconds - seconds) / count if count else 0.0,
                "ms",
            ),
            "GnnPrecomputedReadsRefreshed": (stats.reads_refreshed - reads, "Count"),
            "GnnPrecomputedPendingRows": (pending, "Count"),
        }
        for name, (value, unit) in figures.items():
            metrics.add_metric(
                name, round(value, 3), unit, dimensions=self._dimensions(), metric_type=_GAUGE
            )
        self._refreshes_reported = (stats.updates, stats.rows, stats.seconds, stats.reads_refreshed)

    def _dimensions(self) -> list[Dimension]:
        """A fresh list per call: TorchServe appends default dimensions to the one it is given."""
        return [Dimension("ModelName", self.context.model_name), Dimension("Level", "Model")]

    def explain_handle(self, data_preprocess: RoutedBatch, raw_data: list[Any]) -> list[bytes]:
        """TorchServe's ``/explanations`` path (``BaseHandler.handle`` takes it when the batch's
        first request is an explanation). ``preprocess`` already routed every request by its
        kind and its own header, so a batch mixing explanations and predictions is answered the
        same way whichever comes first."""
        return self.postprocess(self.inference(data_preprocess))

    def describe_handle(self) -> str:
        """Answers the management API's ``GET /models/{name}?customized=true``."""
        if self.task is None:
            raise RuntimeError("the handler was not initialized")
        return json.dumps(describe(self.task))

    def _router(self) -> Router:
        if self.router is None:
            raise RuntimeError("the handler was not initialized")
        return self.router


def _not_the_batch_line(record: logging.LogRecord) -> bool:
    return record.msg != TORCHSERVE_BATCH_LINE


def drop_torchserve_batch_line() -> None:
    """Filters TorchServe's per-batch timestamp line out of this worker's log. A filter on the
    root logger sees only records logged on it, so every other line still gets through."""
    root = logging.getLogger()
    if _not_the_batch_line not in root.filters:
        root.addFilter(_not_the_batch_line)


def retry_after(response: Response) -> Response:
    """A 503 says when to try again (``Retry-After``, seconds): every 503 of this handler is
    a state that passes (a graph version not reached yet, the graph store failing over)."""
    if response.status != Unavailable.status or "Retry-After" in response.headers:
        return response
    headers = {**response.headers, "Retry-After": str(RETRY_AFTER_S)}
    return Response(response.status, response.body, headers)


def lowercase_headers(context: Context, index: int) -> dict[str, str]:
    """A request's headers by lower-case name, whatever case the client used."""
    headers = context.get_all_request_header(index) or {}
    return {key.lower(): str(value) for key, value in headers.items()}
