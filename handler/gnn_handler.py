"""The TorchServe handler: picks the device, loads graph and weights, maps results to statuses.

Thin on purpose: each request is decoded once at the edge (``handler.protocol``), the archive's
task (``handler.tasks``) parses, samples and infers, and nothing below this module and
``handler.worker_socket`` imports TorchServe.
"""

from __future__ import annotations

import json
import logging
from http import HTTPStatus
from pathlib import Path
from typing import Any

import torch
from ts.context import Context
from ts.metrics.dimension import Dimension
from ts.metrics.metric_type_enum import MetricTypes
from ts.torch_handler.base_handler import BaseHandler

from handler.core.batch import Response, StageTimes
from handler.core.graph_source import open_graph
from handler.core.metrics import GAUGES, BatchMetrics
from handler.core.router import RoutedBatch, RoutedResult, Router
from handler.core.settings import ServingSettings, worker_settings
from handler.live.live_graph import UPDATE_KEY_HEADER, LiveGraph, answer_update, update_body
from handler.protocol.body import as_request
from handler.protocol.json_body import encode_body
from handler.tasks.registry import describe, start_task
from handler.tasks.spec import Archive, StartedTask
from handler.worker_socket import buffer_frontend_reads

logger = logging.getLogger(__name__)

# TorchServe's worker logs this on its root logger for every batch; the batch summary
# (handler.core.metrics) replaces it at a fraction of the cost (~6% of a busy worker).
TORCHSERVE_BATCH_LINE = "Backend received inference at: %d"
_GAUGE = MetricTypes.GAUGE


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
        self.batch_metrics = BatchMetrics(ServingSettings().metrics_interval_s)

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
        archive = Archive(
            model_dir=Path(properties["model_dir"]),
            settings=settings,
            device=self.device,
            model_version=str(context.manifest.get("model", {}).get("modelVersion", "1.0")),
            model_name=context.model_name,
        )
        task = start_task(archive, open_graph=lambda: open_graph(archive.model_dir, settings))
        self.task, self.engine, self.router = task, task.engine, task.router
        self.live, self.update_policy = task.live, task.update_policy
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
        self._describe_call = self.is_describe_call(data, context)
        if self.live is None:
            return super().handle(data, context)
        with self.live.reading():
            return super().handle(data, context)

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
        """Applies the batch's graph updates first (in order), then validates each prediction
        request alone and samples one ego-graph for the batch's seeds."""
        self._updates: dict[int, Response] = {}
        predictions = []
        for index, raw in enumerate(data):
            item = as_request(raw)  # decoded here once, for the update path and the task alike
            body = update_body(item)
            if body is None:
                predictions.append(item)
                continue
            key = _header(self.context, index, UPDATE_KEY_HEADER)
            status, answer = answer_update(body, key, self.live, self.update_policy)
            self._updates[index] = Response(status=status, body=answer)
        # TorchServe marks each /explanations request with an "explain" header, per request.
        explain = [
            _header(self.context, index, "explain") == "True"
            for index in range(len(data))
            if index not in self._updates
        ]
        return self._router().prepare(predictions, explain=explain)

    def inference(self, data: RoutedBatch, *args: Any, **kwargs: Any) -> RoutedResult:
        """One forward pass for the batch, under ``torch.inference_mode()`` (in the engine)."""
        return self._router().run(data)

    def postprocess(self, data: RoutedResult) -> list[bytes]:
        """One JSON body per request, in order, each with its own HTTP status."""
        responses = self._router().respond(data)
        if self._updates:
            answered = iter(responses)
            total = len(responses) + len(self._updates)
            responses = [self._updates.get(i) or next(answered) for i in range(total)]
        self._report(data.batch.times, responses)
        for index, response in enumerate(responses):
            phrase = HTTPStatus(response.status).phrase
            self.context.set_response_status(code=response.status, phrase=phrase, idx=index)
            self.context.set_response_content_type(index, "application/json")
        return [encode_body(response.body) for response in responses]

    def _report(self, times: StageTimes, responses: list[Response]) -> None:
        """Batch figures as custom metrics (on TorchServe's Prometheus endpoint) and one log
        line, summed over ``metrics_interval_s`` (handler.core.metrics says why)."""
        errors = sum(1 for response in responses if response.status >= 400)
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
        metrics.add_metric(
            "GnnErrorResponses", summary.errors, "Count", dimensions=self._dimensions()
        )
        if self.live is not None:  # 1 while a log record cannot be applied (docs/operations.md)
            stalled = int(self.live.failure is not None)
            metrics.add_metric(
                "GnnUpdateReplayFailed",
                stalled,
                "Count",
                dimensions=self._dimensions(),
                metric_type=_GAUGE,
            )

    def _dimensions(self) -> list[Dimension]:
        """A fresh list per call: TorchServe appends default dimensions to the one it is given."""
        return [Dimension("ModelName", self.context.model_name), Dimension("Level", "Model")]

    def explain_handle(self, data_preprocess: RoutedBatch, raw_data: list[Any]) -> list[bytes]:
        """TorchServe's ``/explanations`` path (``BaseHandler.handle`` takes it when the batch's
        first request is an explanation). ``preprocess`` already routed every request by its
        own header, so a batch mixing explanations and predictions is answered the same way
        whichever comes first."""
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


def _header(context: Context, index: int, name: str) -> str | None:
    """A request header, whatever case the client used for its name."""
    for key, value in (context.get_all_request_header(index) or {}).items():
        if key.lower() == name:
            return str(value)
    return None
